"""Cheap lexical length cues of a prompt: what it says about the answer's size in so many words.

Why: an embedding places "explain X in one sentence" and "write a 1,000-word essay on X" near each other
(same topic), yet the two answers differ by two orders of magnitude. A handful of regular expressions over
the prompt's head and tail (bounded, a few tens of microseconds) read the explicit cues — requested
counts of words, sentences, paragraphs or items, brevity and length words, code and format requests —
that the ranking head (:mod:`predictor.ranker`) weighs. The vector has a fixed layout (``CUE_NAMES``);
the shipped prior's weights are tied to it, so change both together.
"""

from __future__ import annotations

import math
import re

import numpy as np

_HEAD_CHARS, _TAIL_CHARS = 3000, 1000

_FLAGS: tuple[tuple[str, str], ...] = (
    (
        "short",
        r"\b(in (one|a single|1|two|2|a few) (sentence|word|line|phrase)s?|one[- ]word|one[- ]liner"
        r"|briefly|brief|short|concise(ly)?|succinct(ly)?|tl;?dr|yes or no|true or false|only (the|a) )",
    ),
    (
        "long",
        r"\b(essay|article|blog post|story|report|detailed|in detail|comprehensive|in[- ]depth|"
        r"thorough(ly)?|elaborate|long|outline|guide|tutorial|lesson plan|proposal|script for)\b",
    ),
    ("steps", r"\b(step[- ]by[- ]step|steps|walk me through|explain how)\b"),
    (
        "code",
        r"\b(write|implement|create|generate|give me|show me)\b[^.?!\n]{0,40}\b(code|function|"
        r"program|script|class|method|query|regex|component|snippet|api)\b",
    ),
    (
        "code_lang",
        r"\b(python|java(script)?|typescript|c\+\+|c#|golang|rust|sql|html|css|bash|php|ruby|"
        r"react|node(\.js)?|kotlin|swift)\b",
    ),
    ("fence", r"```|\bdef |\bfunction\b|;\s*$|\{\s*$|#include|\bimport "),
    ("json", r"\b(json|yaml|xml|csv)\b"),
    ("table", r"\b(table|bullet(ed)? (points|list)|bullets|markdown)\b"),
    ("list", r"\b(list|enumerate|examples|ideas|suggestions|tips|names|options)\b"),
    (
        "rewrite",
        r"\b(rewrite|rephrase|paraphrase|proofread|correct (the|this|my)|fix (the|this|my) "
        r"(grammar|spelling)|improve (the|this|my)|edit (the|this|my))\b",
    ),
    ("translate", r"\b(translate|translation)\b"),
    ("summarize", r"\b(summari[sz]e|summary|key points|main points)\b"),
    ("classify", r"\b(classify|categori[sz]e|which of|is it|is this|true or false|sentiment|label)\b"),
    ("continue", r"\b(continue|go on|keep going|more)\b"),
    ("act_as", r"\b(act as|pretend|you are a|role[- ]?play|i want you to)\b"),
    ("question", r"^\s*(what|who|when|where|which|why|how|is|are|does|do|can|could|should)\b"),
)
_COUNTED: tuple[tuple[str, str], ...] = (
    ("n_words", r"\b(\d[\d,]*)\s*(-|to)?\s*(\d[\d,]*)?\s*[- ]?words?\b"),
    ("n_sentences", r"\b(\d+|one|two|three|four|five|six|seven|eight|nine|ten)\s*[- ]?sentences?\b"),
    ("n_paragraphs", r"\b(\d+|one|two|three|four|five|six|seven|eight|nine|ten)\s*[- ]?paragraphs?\b"),
    (
        "n_items",
        r"\b(?:list|give|provide|write|generate|suggest|name|top)?\s*(?:me\s+)?(\d+|three|four|five|"
        r"six|seven|eight|nine|ten|twenty)\s+(?:\w+\s+)?(ideas|examples|ways|reasons|tips|questions|items|"
        r"names|steps|points|titles|options|facts|things|tweets|headlines|slogans|sentences|words)\b",
    ),
)
_NUMBER_WORDS = {
    "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
    "ten": 10, "twenty": 20,
}  # fmt: skip
# Matched against the lower-cased text: case-insensitive alternations cost ~5x more in ``re``.
_FLAG_RES = tuple(re.compile(p, re.MULTILINE) for _, p in _FLAGS)
_COUNT_RES = tuple(re.compile(p) for _, p in _COUNTED)

CUE_NAMES: tuple[str, ...] = (
    tuple(n for n, _ in _FLAGS)
    + tuple(n for n, _ in _COUNTED)
    + ("log_chars", "lines", "code_share", "questions")
)
N_CUES = len(CUE_NAMES)


def _number(s: str | None) -> float:
    if not s:
        return 0.0
    s = s.lower().replace(",", "")
    if s in _NUMBER_WORDS:
        return float(_NUMBER_WORDS[s])
    try:
        return float(s)
    except ValueError:
        return 0.0


def cue_features(text: str) -> np.ndarray:
    """The prompt's cue vector (float32, layout ``CUE_NAMES``): 0/1 flags, log(1 + requested count),
    and a few shape measures (log characters, log lines, share of code-like characters, question marks).
    Reads at most the first 3,000 and last 1,000 characters, like the lexical terms."""
    n_chars = len(text)
    if n_chars > _HEAD_CHARS + _TAIL_CHARS:
        text = text[:_HEAD_CHARS] + "\n" + text[-_TAIL_CHARS:]
    text = text.lower()
    out = np.zeros(N_CUES, dtype=np.float32)
    for i, rx in enumerate(_FLAG_RES):
        out[i] = 1.0 if rx.search(text) else 0.0
    base = len(_FLAG_RES)
    for j, rx in enumerate(_COUNT_RES):
        m = rx.search(text)
        if m is not None:
            nums = [_number(g) for g in m.groups() if g and (g[0].isdigit() or g in _NUMBER_WORDS)]
            out[base + j] = math.log1p(max(nums, default=0.0))
    base += len(_COUNT_RES)
    out[base] = math.log1p(n_chars) / 10.0
    out[base + 1] = math.log1p(text.count("\n")) / 5.0
    if text:
        out[base + 2] = sum(text.count(c) for c in "{}[]();=<>_/\\") / len(text) * 10.0
    out[base + 3] = min(text.count("?"), 10) / 10.0
    return out
