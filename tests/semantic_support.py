"""Helpers shared by the semantic predictor tests: the real MiniLM model, loaded once per process, and
small labelled prompt families whose output lengths differ by kind of task."""

from __future__ import annotations

import functools

import pytest

from predictor.embedder import MiniLMEmbedder

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
