"""The engine's step output, request states, step timing and decode fold (sim/step_*.py)."""

from __future__ import annotations

from sagegate.sim.config import EngineConfig
from sagegate.sim.engine import Engine
from sagegate.sim.engine_request import EngineRequest, RequestStatus
from sagegate.sim.hardware import get_gpu, get_model
from sagegate.sim.kv import BlockPool
from sagegate.sim.perf import PerfModel
from sagegate.sim.step_timing import Batch, blocks_allow

PERF = PerfModel(get_model("llama-3.1-8b"), get_gpu("h100"))


def mkreq(rid: int, prompt: int, out: int) -> EngineRequest:
    return EngineRequest(rid, 0.0, prompt, out)


def run_step(eng: Engine, now: float, horizon: float = float("inf")) -> float:
    step = eng.schedule(now, horizon)
    assert step.scheduled
    eng.complete(step, now + step.duration)
    return now + step.duration


def test_a_request_moves_through_its_states() -> None:
    eng = Engine(PERF, EngineConfig(num_gpu_blocks_override=40, max_num_seqs=8, enable_prefix_caching=False))
    first, second = mkreq(0, 300, 300), mkreq(1, 300, 300)
    eng.add(first, 0.0)
    eng.add(second, 0.0)
    assert first.state is RequestStatus.WAITING and second.state is RequestStatus.WAITING
    now = run_step(eng, 0.0)
    assert first.state is RequestStatus.RUNNING and second.state is RequestStatus.RUNNING
    while second.preemptions == 0:
        now = run_step(eng, now)
    assert second.state is RequestStatus.PREEMPTED and second in eng.waiting
    eng.check_invariants()
    while second.state is not RequestStatus.RUNNING:
        now = run_step(eng, now)
    while eng.has_work():
        now = run_step(eng, now)
    assert first.state is RequestStatus.FINISHED and second.state is RequestStatus.FINISHED
    assert first.state.is_done and not first.state.is_queued


def test_a_preempted_request_can_be_aborted() -> None:
    eng = Engine(PERF, EngineConfig(num_gpu_blocks_override=40, max_num_seqs=8, enable_prefix_caching=False))
    first, second = mkreq(0, 300, 300), mkreq(1, 300, 300)
    eng.add(first, 0.0)
    eng.add(second, 0.0)
    now = 0.0
    while second.preemptions == 0:
        now = run_step(eng, now)
    assert second.state is RequestStatus.PREEMPTED
    assert eng.abort(second, now)
    assert second.state is RequestStatus.ABORTED and second not in eng.waiting
    assert not eng.abort(second, now)
    eng.check_invariants()


def test_the_scheduler_output_counts_preemptions() -> None:
    eng = Engine(PERF, EngineConfig(num_gpu_blocks_override=40, max_num_seqs=8, enable_prefix_caching=False))
    for i in range(2):
        eng.add(mkreq(i, 300, 300), 0.0)
    now, seen = 0.0, 0
    while eng.num_preemptions == 0:
        step = eng.schedule(now)
        seen += step.preempted
        now += step.duration
        eng.complete(step, now)
    assert seen == eng.num_preemptions == 1


def test_a_lone_decode_folds_to_its_last_token_in_closed_form() -> None:
    eng = Engine(PERF, EngineConfig())
    req = mkreq(0, 100, 50)
    eng.add(req, 0.0)
    now = run_step(eng, 0.0)  # the prefill, and the first token
    assert req.generated == 1
    step = eng.schedule(now)
    assert step.k == 49 and step.chunked == [] and step.scheduled == {req: 1}
    assert step.duration == PERF.decode_run_time(1, req.num_computed, 49)
    out = eng.complete(step, now + step.duration)
    assert out.emitted == [req] and out.finished == [req] and out.first == []
    assert req.generated == 50 and req.t_finish == now + step.duration


def test_a_fold_never_runs_past_the_horizon() -> None:
    eng = Engine(PERF, EngineConfig())
    req = mkreq(0, 100, 500)
    eng.add(req, 0.0)
    now = run_step(eng, 0.0)
    window = 20 * PERF.decode_step_time(1, 100)
    step = eng.schedule(now, now + window)
    assert 1 < step.k < 499
    assert step.duration <= window < PERF.decode_run_time(1, req.num_computed, step.k + 1)


def test_no_fold_without_the_option_or_with_a_prefill() -> None:
    eng = Engine(PERF, EngineConfig(), fold_decode=False)
    req = mkreq(0, 100, 50)
    eng.add(req, 0.0)
    now = run_step(eng, 0.0)
    assert eng.schedule(now).k == 1
    eng = Engine(PERF, EngineConfig())
    a, b = mkreq(0, 100, 50), mkreq(1, 100, 50)
    eng.add(a, 0.0)
    now = run_step(eng, 0.0)
    eng.add(b, now)
    step = eng.schedule(now)
    assert step.k == 1 and step.chunked == [b] and step.scheduled == {a: 1, b: 100}
    out = eng.complete(step, now + step.duration)
    assert out.emitted == [a, b] and out.first == [b]


def test_batch_sorts_decodes_from_prefill_chunks() -> None:
    dec, chunk, fresh = mkreq(0, 10, 5), mkreq(1, 1000, 5), mkreq(2, 50, 5)
    dec.num_computed, dec.generated = 12, 3  # prompt plus two generated tokens computed
    chunk.num_computed = 512
    batch = Batch.of({dec: 1, chunk: 488, fresh: 50})
    assert batch.prefill == [(488, 512), (50, 0)] and batch.chunked == [chunk, fresh]
    assert (batch.n_decode, batch.decode_context) == (1, 12)


def test_blocks_allow_is_the_largest_fold_that_fits() -> None:
    pool = BlockPool(10, 16, False)
    reqs = [mkreq(i, 40, 400) for i in range(3)]
    for r in reqs:
        r.num_computed = 40
        assert pool.grow(r.table, 41)  # three blocks each: one free block left

    def need(k: int) -> int:
        return sum(-(-(r.num_computed + k) // 16) - r.table.nblocks for r in reqs)

    k = blocks_allow(pool.free_blocks, 100, need)
    assert need(k) <= pool.free_blocks < need(k + 1)
    assert blocks_allow(pool.free_blocks, k, need) == k
