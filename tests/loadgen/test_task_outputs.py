"""Shared system prompts whose output length follows the task (``loadgen.synthetic.task_outputs``): the
length is a property of the system prompt, which a predictor keyed on the prompt's start can learn."""

from __future__ import annotations

import math
import statistics

from sagegate.loadgen.synthetic import shared_prefix_workload, task_outputs


def _work(seed: int = 3):
    return shared_prefix_workload(
        rate=5.0, groups=40, per_group=6, system_tokens=200, question_tokens=20, output_tokens=200, seed=seed
    )


def test_lengths_follow_the_group_and_nothing_else_changes() -> None:
    work = _work()
    tasked = task_outputs(work, seed=3)
    assert [(r.rid, r.arrival_s, r.prompt, r.extra) for r in tasked] == [
        (r.rid, r.arrival_s, r.prompt, r.extra) for r in work
    ]
    assert all(isinstance(r.output_tokens, int) and r.output_tokens >= 1 for r in tasked)
    logs: dict[int, list[float]] = {}
    for r in tasked:
        logs.setdefault(int(r.extra["group"]), []).append(math.log(r.output_tokens))
    within = statistics.mean(statistics.pstdev(v) for v in logs.values())
    across = statistics.pstdev(statistics.mean(v) for v in logs.values())
    assert within < 0.8 and across > 2 * within  # sigma 0.5 inside a group; log-uniform 16-1,024 across
    assert {r.output_tokens for r in work} == {200}  # the input is left as it was


def test_the_same_seed_draws_the_same_lengths() -> None:
    a = [r.output_tokens for r in task_outputs(_work(), seed=1)]
    assert a == [r.output_tokens for r in task_outputs(_work(), seed=1)]
    assert a != [r.output_tokens for r in task_outputs(_work(), seed=2)]
    assert task_outputs([], seed=1) == []
