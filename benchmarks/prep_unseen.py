"""Turn Code Alpaca's instruction file into the JSONL that ``bench_ranker --unseen`` reads.

    .venv/bin/python -m benchmarks prep_unseen /work/data-ext/codealpaca/new_codealpaca.json \
        /work/data-ext/codealpaca/pairs.jsonl

Source: ``sahil280114/codealpaca`` @ ``2f78ddc5c682ed6738ad092bbbfa59ba915afcb0``, ``data/new_codealpaca.json``
(data CC BY-NC 4.0; kept outside the repository). A row's prompt is the instruction, then a blank line and
the input when there is one; lengths are cl100k tokens (``core.tokens``); arrival is file order; blank
answers and repeated prompts are dropped.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sagegate.core.tokens import count_tokens


def convert(src: Path, out: Path) -> int:
    rows = json.loads(src.read_text(encoding="utf-8"))
    seen: set[str] = set()
    n = 0
    with out.open("w", encoding="utf-8") as fh:
        for i, r in enumerate(rows):
            extra = str(r.get("input") or "").strip()
            prompt = str(r["instruction"]).strip() + (f"\n\n{extra}" if extra else "")
            answer = str(r.get("output") or r.get("response") or "")
            if not prompt or not answer.strip() or prompt in seen:
                continue
            seen.add(prompt)
            row = {
                "prompt": prompt,
                "prompt_tokens": count_tokens(prompt),
                "output_tokens": count_tokens(answer),
            }
            fh.write(json.dumps(row | {"arrival_s": float(i)}) + "\n")
            n += 1
    return n


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(convert(Path(sys.argv[1]), Path(sys.argv[2])), "pairs written")


if __name__ == "__main__":
    main()
