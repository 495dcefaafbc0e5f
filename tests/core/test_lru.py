"""The one LRU helper: bounded, the least recently used entry goes first, reads through ``get``
count as use and ``peek`` does not."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sagegate.core.lru import Lru


def test_the_least_recently_used_goes_and_peek_is_not_a_use() -> None:
    c: Lru[str, int] = Lru(2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.peek("a") == 1  # not a use: "a" is still the oldest
    c.put("c", 3)
    assert list(c) == ["b", "c"] and "a" not in c
    assert c.get("b") == 2  # a use: "c" is the oldest now
    c.put("d", 4)
    assert list(c) == ["b", "d"] and len(c) == 2
    c.put("b", 5)  # a write is a use, and replaces
    assert list(c) == ["d", "b"] and c.peek("b") == 5
    assert c.get("zz") is None and c.peek("zz") is None


def test_a_cache_of_nothing_is_refused() -> None:
    with pytest.raises(ValueError):
        Lru(0)


@given(st.integers(1, 5), st.lists(st.tuples(st.booleans(), st.integers(0, 8)), max_size=60))
def test_it_holds_what_a_list_model_of_recency_holds(size: int, ops: list[tuple[bool, int]]) -> None:
    c: Lru[int, int] = Lru(size)
    order: list[int] = []  # the model: keys by last use, oldest first
    for write, key in ops:
        if write:
            c.put(key, key * 10)
            if key in order:
                order.remove(key)
            order.append(key)
            del order[: max(0, len(order) - size)]
        else:
            got = c.get(key)
            assert got == (key * 10 if key in order else None)
            if key in order:
                order.remove(key)
                order.append(key)
        assert list(c) == order
