"""Re-draw the data that ships inside the package (``loadgen/shipped/``) from the shared data folder.

    .venv/bin/python -m tools.make_shipped_data [--shared DIR] [--check]

What it writes (the rule is documented in ``loadgen/shipped/DATA.md``; change both together):

- ``azure2023/AzureLLMInferenceTrace_{conv,code}.csv.gz``: the two Azure 2023 CSVs, byte for byte,
  gzipped (level 9, no name or time in the header, so the bytes are reproducible).
- ``sharegpt/sharegpt_v3_first_turn_pairs_4000.jsonl.gz``: 4,000 ShareGPT first-turn pairs. The pairs
  file is read in file order; a pair is *eligible* when its prompt text is non-blank, is the first
  occurrence of that exact text, and both token counts are positive (what the readers keep). A
  ``numpy.random.default_rng(16)`` permutation of the eligible pairs is drawn; its first 4,000 indices,
  sorted back into file order, are written with the response text dropped (every other field kept).
- ``sharegpt/sharegpt_v3_multiturn_600.jsonl.gz``: 600 multi-turn conversations with their full text
  (the demo's sessions). The conversations file is read in file order; one is *eligible* when the
  sessions reader uses it (a user turn the assistant answers), its first user turn is the first
  occurrence of that text, and no shipped predictor part learned from that text
  (``predictor.learned.learned_prompts``). The first 600 indices of a ``default_rng(16)`` permutation
  of the eligible ones, sorted back into file order, are written unchanged.

``--check`` re-draws into memory and fails unless the shipped files hold the same bytes (decompressed).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import itertools
import json
from pathlib import Path

import numpy as np

from sagegate.loadgen.data import (
    AZURE_CODE,
    AZURE_CONV,
    SHAREGPT,
    SHAREGPT_SESSIONS,
    SHIPPED,
    SHIPPED_ROOT,
    data_root,
)

REPO = Path(__file__).resolve().parents[1]

SEED = 16
PAIRS = 4000
SESSIONS = 600
DROPPED = ("response",)


def gz(data: bytes) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", fileobj=buf, mode="wb", compresslevel=9, mtime=0) as fh:
        fh.write(data)
    return buf.getvalue()


def eligible_pairs(path: Path) -> list[dict[str, object]]:
    """Pairs whose prompt is non-blank, first of its text, with positive token counts, in file order."""
    seen: set[str] = set()
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            row = json.loads(line)
            text = row["prompt"]
            if not text.strip() or text in seen:
                continue
            seen.add(text)
            if int(row["prompt_tokens_cl100k"]) > 0 and int(row["response_tokens_cl100k"]) > 0:
                out.append(row)
    return out


def draw_pairs(path: Path, n: int = PAIRS, seed: int = SEED) -> bytes:
    pairs = eligible_pairs(path)
    chosen = sorted(int(i) for i in np.random.default_rng(seed).permutation(len(pairs))[:n])
    lines = []
    for i in chosen:
        row = {k: v for k, v in pairs[i].items() if k not in DROPPED}
        lines.append(json.dumps(row, ensure_ascii=False) + "\n")
    return gz("".join(lines).encode("utf-8"))


def eligible_sessions(path: Path) -> list[str]:
    """Conversations (their JSON lines) the sessions reader uses, unique by first user turn, none a
    shipped predictor part learned from, in file order."""
    from sagegate.core.request import prompt_digest
    from sagegate.predictor.learned import learned_prompts

    learned, seen, out = learned_prompts(), set(), []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            turns = json.loads(line).get("turns") or []
            roles = [t.get("role") for t in turns]
            answered = any(a == "user" and b == "assistant" for a, b in itertools.pairwise(roles))
            first = next((t.get("text", "") for t in turns if t.get("role") == "user"), "")
            if not answered or first in seen or prompt_digest(first) in learned:
                continue
            seen.add(first)
            out.append(line if line.endswith("\n") else line + "\n")
    return out


def draw_sessions(path: Path, n: int = SESSIONS, seed: int = SEED) -> bytes:
    lines = eligible_sessions(path)
    chosen = sorted(int(i) for i in np.random.default_rng(seed).permutation(len(lines))[:n])
    return gz("".join(lines[i] for i in chosen).encode("utf-8"))


def build(shared: Path) -> dict[tuple[str, ...], bytes]:
    """Shipped path parts -> bytes."""
    return {
        SHIPPED[AZURE_CONV]: gz(shared.joinpath(*AZURE_CONV).read_bytes()),
        SHIPPED[AZURE_CODE]: gz(shared.joinpath(*AZURE_CODE).read_bytes()),
        SHIPPED[SHAREGPT]: draw_pairs(shared.joinpath(*SHAREGPT)),
        SHIPPED[SHAREGPT_SESSIONS]: draw_sessions(shared.joinpath(*SHAREGPT_SESSIONS)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", type=Path, default=data_root(), help="the shared data folder")
    ap.add_argument("--check", action="store_true", help="verify the shipped files instead of writing")
    args = ap.parse_args()
    bad = 0
    for parts, data in build(args.shared).items():
        dest = SHIPPED_ROOT.joinpath(*parts)
        digest = hashlib.sha256(data).hexdigest()
        if args.check:
            # compare the contents: another zlib may compress the same bytes differently
            same = dest.is_file() and gzip.decompress(dest.read_bytes()) == gzip.decompress(data)
            bad += not same
            print(f"{'ok  ' if same else 'DIFF'} {dest.relative_to(REPO)} sha256 {digest}")
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        print(f"wrote {dest.relative_to(REPO)}: {len(data):,} bytes, sha256 {digest}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
