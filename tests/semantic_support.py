"""Helpers shared by the semantic predictor tests: the real MiniLM model, loaded once per process, and
small labelled prompt families whose output lengths differ by kind of task."""

from __future__ import annotations

import functools
import re
import time
import zlib
from collections.abc import Sequence

import numpy as np
import pytest

from sagegate.predictor.embedder import DIM, MiniLMEmbedder
from sagegate.predictor.semantic import SemanticPredictor
from sagegate.predictor.semantic_face import SemanticLengthPredictor

SHORT_TASKS = [
    "Translate into French: {x}",
    "Translate this sentence to German: {x}",
    "What is the Spanish word for {x}?",
    "Give me a one-word synonym for {x}.",
    "Answer yes or no: is {x} a fruit?",
    "Reply with only the plural of {x}.",
]
LONG_TASKS = [
    "Write a detailed 1500-word essay about {x}, with an introduction, five sections and a conclusion.",
    "Write a long blog post explaining the history of {x} in depth, with many examples.",
    "Write a comprehensive tutorial about {x}, step by step, with code samples and explanations.",
    "Write a complete short story of at least 1200 words in which {x} plays the main role.",
    "Draft an extensive business plan for a startup built around {x}, covering every section.",
    "Explain {x} thoroughly to a beginner in a long article with headings and bullet lists.",
]
TOPICS = ["apples", "the moon", "railways", "coffee", "bicycles", "volcanoes", "chess", "whales"]


@functools.lru_cache(maxsize=1)
def real_embedder() -> MiniLMEmbedder:
    try:
        return MiniLMEmbedder().load()
    except ImportError as exc:  # the optional [embed] extra is not installed
        pytest.skip(f"embedding model not available: {exc}")


def family(templates: list[str], topics: list[str] = TOPICS) -> list[str]:
    return [t.format(x=x) for t in templates for x in topics]


class SlowEmbedder:
    """Bag-of-words unit vectors (a hash per word) that take ``delay_s`` per batch, as a busy model
    does; ``texts`` counts what was embedded."""

    dim = DIM

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.texts = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        time.sleep(self.delay_s)
        self.texts += len(texts)
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                out[i, zlib.crc32(word.encode()) % DIM] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


def slow_semantic(delay_s: float, budget_s: float) -> SemanticLengthPredictor:
    """The semantic predictor as the gateway builds it (a budget for the embedding) over a
    :class:`SlowEmbedder`."""
    return SemanticLengthPredictor(SemanticPredictor(SlowEmbedder(delay_s)), budget_s)
