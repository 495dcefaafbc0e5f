"""The demo's workload, read from the shipped copies alone (as on a fresh clone): multi-turn conversations
whose turns re-send their history, starting on the Azure trace's arrivals, a draw its own window and
conversations, none a shipped predictor part learned from."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from sagegate.core.request import prompt_digest
from sagegate.harness.live import session_parts, sessions_workload
from sagegate.predictor.learned import learned_prompts


@pytest.fixture(autouse=True)
def shipped_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("SAGEGATE_DATA", str(tmp_path / "shared"))
    monkeypatch.setenv("SAGEGATE_FETCH_DIR", str(tmp_path / "fetched"))
    session_parts.cache_clear()
    yield
    session_parts.cache_clear()


def test_turns_re_send_their_history_within_the_window_and_the_cap() -> None:
    work = sessions_workload(1.0, 1.0, draw=0, max_tokens=300)
    reqs = work.requests
    assert len(reqs) > 50 and work.real_text
    assert all(0.0 <= r.arrival_s < 60.0 for r in reqs)
    assert [r.rid for r in reqs] == list(range(len(reqs)))
    assert all(r.output_tokens <= 300 and r.max_tokens == 300 for r in reqs)
    by_session: dict[object, list] = defaultdict(list)
    for r in reqs:
        by_session[r.extra["session"]].append(r)
    later = [turns for turns in by_session.values() if len(turns) > 1]
    assert later, "no session has a second turn in a minute"
    for turns in later:
        for a, b in itertools.pairwise(turns):
            ma, mb = a.extra["messages"], b.extra["messages"]
            assert b.arrival_s > a.arrival_s and b.extra["turn"] == a.extra["turn"] + 1
            assert mb[: len(ma)] == ma and len(mb) == len(ma) + 2  # the history, the reply, a new turn
            assert b.prompt_tokens > a.prompt_tokens
    learned = learned_prompts()
    firsts = {r.extra["messages"][0]["content"] for r in reqs if r.extra["turn"] == 0}  # type: ignore[index]
    assert not {prompt_digest(t) for t in firsts} & learned


def test_a_draw_is_repeatable_and_draws_differ() -> None:
    a, again, b = (sessions_workload(0.5, 1.0, draw=d).requests for d in (0, 0, 1))
    session_parts.cache_clear()  # read anew: the same draw all the same
    assert [(r.arrival_s, r.prompt) for r in a] == [(r.arrival_s, r.prompt) for r in again]
    assert [r.prompt for r in sessions_workload(0.5, 1.0, draw=0).requests] == [r.prompt for r in a]
    sessions = lambda reqs: {r.extra["session"] for r in reqs}  # noqa: E731
    assert len(sessions(a) & sessions(b)) < 0.5 * min(len(sessions(a)), len(sessions(b)))


def test_denser_arrivals_start_more_sessions_in_the_same_window() -> None:
    sparse, dense = (sessions_workload(0.5, s, draw=0).requests for s in (0.5, 2.0))
    assert len(dense) > 2 * len(sparse)
    assert max(r.arrival_s for r in dense) < 30.0
