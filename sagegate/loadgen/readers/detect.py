"""``--format auto``: recognise a trace by what it is (a folder), its header or its first JSON line.

Content wins over file names because traces get renamed and gzipped; the extension is never needed.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from sagegate.loadgen.readers import servegen
from sagegate.loadgen.readers.common import TraceFormatError, open_text

_AZURE = {"timestamp", "contexttokens", "generatedtokens"}
_BURSTGPT = {"timestamp", "request tokens", "response tokens"}


def _first_line(path: Path) -> tuple[int, str]:
    with open_text(path) as fh:
        for lineno, text in enumerate(fh, start=1):
            if text.strip():
                return lineno, text.strip()
    raise TraceFormatError(path, None, "empty file: cannot detect its format")


def detect_format(path: str | Path) -> str:
    """The reader name for ``path``: ``servegen`` for a folder, else by CSV header or JSON keys."""
    p = Path(path)
    if p.is_dir():
        if not servegen.client_files(p):
            raise TraceFormatError(p, None, "a folder, but no ServeGen chunk-N-trace.csv files in it")
        return "servegen"
    if not p.exists():
        raise FileNotFoundError(f"no such trace: {p}")
    try:
        lineno, text = _first_line(p)
    except UnicodeDecodeError:
        raise TraceFormatError(p, None, "not a UTF-8 text trace (nor gzip of one)") from None
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(p, lineno, f"starts like JSON lines but is not: {exc.msg}") from None
        keys = set(obj) if isinstance(obj, dict) else set()
        if "prompt_tokens_cl100k" in keys:
            return "sharegpt"
        if "turns" in keys:
            return "sharegpt-sessions"
        if "arrival_s" in keys:
            return "jsonl"
        if {"timestamp", "input_length", "output_length"} <= keys:
            return "mooncake"
        raise TraceFormatError(p, lineno, f"JSON lines with unrecognised keys {sorted(keys)[:12]}")
    names = {h.strip().lower() for h in next(csv.reader([text]))}
    if names >= _AZURE:
        return "azure"
    if names >= _BURSTGPT:
        return "burstgpt"
    if servegen.TRACE_FILE.fullmatch(p.name):
        raise TraceFormatError(p, None, "a ServeGen client file: pass its folder instead")
    raise TraceFormatError(p, lineno, f"unrecognised header {text[:120]!r}")
