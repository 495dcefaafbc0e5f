"""Make the tiny random-weight model the real-vLLM lane serves (run by the vLLM environment's Python).

    <vllm env>/bin/python tools/tiny_model.py OUT_DIR TIKTOKEN_FILE [--seed 0]

A Llama of 2 layers, hidden size 256, 4 attention heads (2 KV heads), tied embeddings, bfloat16, 27M
parameters (54 MB), with OpenAI's ``cl100k_base`` BPE as its tokenizer (``TIKTOKEN_FILE``: the ranks,
as ``bpe-openai`` ships them, gzipped or not; the vocabulary padded to 100,352) and a chat template
that renders a conversation as the simulated backend does (``role: content`` lines). Its text is
noise; its engine (scheduler, paged and prefix caches, metrics, events, API) is vLLM's own. The
weights come from ``--seed``: the same seed, the same model. Only the standard library, torch and
transformers are used here (this runs outside the project's environment).
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sys
import tempfile
from pathlib import Path

VOCAB = 100_352
"""cl100k's 100,277 ids (its special tokens included), padded to a multiple of 128."""
SPECIAL = {
    "<|endoftext|>": 100_257,
    "<|fim_prefix|>": 100_258,
    "<|fim_middle|>": 100_259,
    "<|fim_suffix|>": 100_260,
    "<|endofprompt|>": 100_276,
}
PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if not loop.first %}{{ '\\n' }}{% endif %}{{ m['role'] }}: "
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '\\nassistant: ' }}{% endif %}"
)


def tokenizer(ranks: Path, out: Path) -> None:
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "cl100k_base.tiktoken"
        opener = gzip.open if ranks.suffix == ".gz" else open
        with opener(ranks, "rb") as src, open(plain, "wb") as dst:
            shutil.copyfileobj(src, dst)
        tok = TikTokenConverter(vocab_file=str(plain), pattern=PATTERN).converted()
    tok.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def model(out: Path, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32_768,
        tie_word_embeddings=True,
        bos_token_id=SPECIAL["<|endoftext|>"],
        eos_token_id=SPECIAL["<|endoftext|>"],
        torch_dtype="bfloat16",
    )
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("ranks", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    staging = a.out.with_name(a.out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    tokenizer(a.ranks, staging)
    model(staging, a.seed)
    shutil.rmtree(a.out, ignore_errors=True)
    staging.rename(a.out)  # whole or absent: a half-made model is never served
    print(a.out, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
