"""Strict JSON for request bodies: bounded nesting and no ``NaN``/``Infinity``.

Python's ``json`` recurses once per nesting level, so a body of a few thousand ``[`` raises
``RecursionError`` (a 500) instead of a clean refusal; and it accepts ``NaN``/``Infinity``, which are
not JSON (RFC 8259) and which a backend may reject or misread, and numbers that overflow to infinity
(``1e400``). The depth is measured before parsing,
outside strings, in C-speed passes (a count of brackets first: a body with fewer opening brackets than
the limit cannot be too deep, so ordinary bodies pay one ``bytes.count``).
"""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from typing import Any

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


class BodyError(ValueError):
    """The body is not acceptable JSON; the message says why (it is shown to the client)."""


def depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in ``raw`` (brackets inside strings do not count)."""
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKET)
    return max(accumulate(_STEP[b] for b in brackets), default=0)


def _no_constant(name: str) -> Any:
    raise BodyError(f"the request body is not valid JSON: {name} is not a JSON number")


def _finite(text: str) -> float:
    """A JSON number with a fraction or exponent; one that overflows (``1e400``) is Infinity in disguise."""
    value = float(text)
    if math.isinf(value):
        raise BodyError(f"the request body is not valid: the number {text[:40]} is out of range")
    return value


def loads(raw: bytes, max_depth: int) -> Any:
    """``raw`` parsed strictly; raises :class:`BodyError` (too deep, NaN/Infinity, not JSON)."""
    if raw.count(b"[") + raw.count(b"{") > max_depth and depth(raw) > max_depth:
        raise BodyError(f"the request body nests deeper than {max_depth} levels")
    try:
        return json.loads(raw, parse_constant=_no_constant, parse_float=_finite)
    except BodyError:
        raise
    except RecursionError:  # a limit set above what this interpreter's stack allows
        raise BodyError(f"the request body nests too deeply (limit {max_depth})") from None
    except (ValueError, UnicodeDecodeError):
        raise BodyError("the request body is not valid JSON") from None
