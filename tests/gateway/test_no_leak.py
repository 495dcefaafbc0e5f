"""No benchmark hands the scheduler the answer: requests that differ only in their true output length
(which travels only in the forcing field a simulated backend honours) get the same prediction, rank,
charge and dispatch, in the live gateway and in the simulator's gateway path."""

from __future__ import annotations

import ast
import threading
from dataclasses import replace
from typing import Any

import httpx
import pytest

from sagegate.core.predictor import settle
from sagegate.core.request import FORCED_OUTPUT_FIELD, PredictionQuery, TraceRequest, answer_key
from sagegate.gateway.app import create_app
from sagegate.loadgen.records import with_client_cap
from sagegate.policies.registry import parse_policy
from sagegate.predictor.factory import make_predictor
from sagegate.sim.config import EngineConfig
from sagegate.sim.des import SimSetup, simulate
from sagegate.sim.hardware import get_gpu, get_model
from sagegate.sim.perf import PerfModel
from sagegate.sim.server import BackendSettings
from sagegate.sim.server import create_app as backend_app
from tests.gateway_support import ServerThread, admin, settings_for, wait_until

PERF = PerfModel(get_model("llama-3.1-8b"), get_gpu("h100"))


def _body(words: int, forced: int, cap: int = 4096) -> dict[str, Any]:
    return {
        "model": "sim",
        "messages": [{"role": "user", "content": " ".join(["word"] * words)}],
        "max_tokens": cap,
        FORCED_OUTPUT_FIELD: forced,
    }


@pytest.mark.heavy
def test_the_live_gateway_never_reads_the_forced_length() -> None:
    engine = EngineConfig(max_num_seqs=1)
    backend = backend_app(BackendSettings(engine=engine, served_model_name="sim", time_scale=1.0))
    with ServerThread(backend) as be:
        settings = settings_for(
            [be.url], policy="sagesched", predictor="length-bucket", admission={"max_waiting": 1}
        )
        with ServerThread(create_app(settings)) as gw:
            url = gw.url + "/v1/chat/completions"
            # a history to predict from: lengths the predictor learns per prompt-length bucket
            for words, out in [(10, 3), (10, 5), (60, 20), (60, 30), (300, 9), (300, 11)] * 2:
                assert httpx.post(url, json=_body(words, out), timeout=60).status_code == 200
            answers: dict[tuple[int, int], httpx.Response] = {}

            def send(words: int, forced: int) -> None:
                answers[(words, forced)] = httpx.post(url, json=_body(words, forced), timeout=120)

            threads = [threading.Thread(target=send, args=(5, 1000), daemon=True)]  # the blocker
            threads[0].start()
            wait_until(lambda: admin(gw.url)["backends"][0]["inflight"] == 1, what="blocker dispatched")
            threads.append(threading.Thread(target=send, args=(5, 2), daemon=True))  # waits at the backend
            threads[1].start()
            wait_until(lambda: admin(gw.url)["backends"][0]["inflight"] == 2, what="filler dispatched")
            twins = [(10, 2), (10, 900), (60, 1), (60, 700), (300, 3), (300, 500)]
            for i, (words, forced) in enumerate(twins):
                t = threading.Thread(target=send, args=(words, forced), daemon=True)
                t.start()
                threads.append(t)
                wait_until(lambda n=i + 1: admin(gw.url)["queued"] == n, what="request queued")
            queued = admin(gw.url)["requests"]
            assert not answers or set(answers) <= {(5, 2)}, "the blocker ended too soon; lengthen it"
            for t in threads:
                t.join(120)
    by_len: dict[int, list[dict[str, Any]]] = {}
    for item in queued:
        by_len.setdefault(item["prompt_tokens"], []).append(item)
    assert len(by_len) == 3 and all(len(v) == 2 for v in by_len.values())
    for a, b in by_len.values():
        for field in ("prediction", "predictor_path", "priority", "attempt"):
            assert a[field] == b[field], field
        # the rank key: the policy's index, then arrival time and sequence (the tie-breaks)
        assert ast.literal_eval(a["key"])[:-2] == ast.literal_eval(b["key"])[:-2]
        assert abs(a["rank"] - b["rank"]) == 1  # twins sit side by side, whatever their true lengths
    for words in (10, 60, 300):
        pair = [answers[k] for k in twins if k[0] == words]
        assert all(r.status_code == 200 for r in pair)
        heads = {r.headers["x-sagegate-predicted-tokens"] for r in pair}
        assert len(heads) == 1, heads
        outs = [r.json()["usage"]["completion_tokens"] for r in pair]
        assert outs == [k[1] for k in twins if k[0] == words]  # the backend honoured the forcing


def _workload(outputs: list[int]) -> list[TraceRequest]:
    prompts = [200 + 37 * (i % 11) for i in range(len(outputs))]
    work = [
        TraceRequest(0.0005 * i, p, o, rid=i) for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))
    ]
    return with_client_cap(work, 4096)


@pytest.mark.parametrize("policy", ["sagesched", "fcfs", "ssjf"])
def test_the_simulated_gateway_never_reads_the_true_length(policy: str) -> None:
    """Two workloads that differ only in their outputs: every prediction and every dispatch made before
    the first completion (when nothing has been learned from an outcome yet) is the same."""
    n = 120
    a = _workload([10 + (97 * i) % 900 for i in range(n)])
    b = _workload([3000 - (53 * i) % 2900 for i in range(n)])
    runs = []
    for work in (a, b):
        setup = SimSetup(
            PERF,
            EngineConfig(num_gpu_blocks_override=400),
            engines=2,
            level="gateway",
            policy=parse_policy(policy),
            predictor=make_predictor("length-bucket"),
        )
        runs.append(simulate(work, setup).records)
    ra, rb = runs
    first_done = min(min(r.finish_s for r in recs if r.finish_s is not None) for recs in runs)
    assert [r.predicted_mean for r in ra if r.arrival_s < first_done] == [
        r.predicted_mean for r in rb if r.arrival_s < first_done
    ]
    early = [
        sorted((r.dispatch_s, r.rid) for r in recs if r.dispatch_s is not None and r.dispatch_s < first_done)
        for recs in runs
    ]
    assert early[0] == early[1] and len(early[0]) >= 4
    assert any(x.dispatch_s is None or x.dispatch_s >= first_done for x in ra)  # a queue had formed


def test_the_simulator_caps_predictions_at_the_client_cap_like_the_gateway() -> None:
    work = [TraceRequest(0.0, 100, 50, rid=0, max_tokens=64)]
    oracle = make_predictor("oracle", truth=answer_key(work))
    capped = simulate(
        [replace(work[0], output_tokens=50)],
        SimSetup(PERF, level="gateway", policy=parse_policy("sagesched"), predictor=oracle),
    )
    assert capped.records[0].predicted_mean == 50
    big = make_predictor("global")
    for i in range(30):
        settle(big.observe(PredictionQuery.of(TraceRequest(0.0, 100, 5000, rid=100 + i)), 5000))
    on = simulate(work, SimSetup(PERF, level="gateway", policy=parse_policy("sagesched"), predictor=big))
    assert on.records[0].predicted_mean == 64
    off = simulate(
        work,
        SimSetup(
            PERF, level="gateway", policy=parse_policy("sagesched"), predictor=big, cap_at_max_tokens=False
        ),
    )
    assert off.records[0].predicted_mean is not None and off.records[0].predicted_mean > 1000
