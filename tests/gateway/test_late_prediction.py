"""A prediction that missed its budget still comes: the request waited on the prior's rank, and if it
still waits when the prediction comes it is ranked (and charged) by it; if it runs, it is charged by
it where it runs. The budget bounds what a request waits for, not what the queue may learn; with
nothing queued (``dispatch_first``) a request does not wait for it at all."""

from __future__ import annotations

import asyncio
import itertools

import httpx
import pytest

from sagegate.core.distribution import LengthDistribution
from sagegate.core.request import PredictionQuery
from sagegate.gateway.backends import BackendPool
from sagegate.gateway.dispatcher import Dispatcher
from sagegate.gateway.queue import BoundedQueue, GatewayRequest
from sagegate.gateway.settings import GatewaySettings
from sagegate.policies.admission import AdmissionConfig, Charge
from sagegate.policies.registry import parse_policy
from tests.semantic_support import slow_semantic

CFG = AdmissionConfig()
SHORT = LengthDistribution((20, 40), (0.5, 0.5))
LONG = LengthDistribution((2000, 4000), (0.5, 0.5))
_rids = itertools.count()


def full_dispatcher(policy: str = "sagesched") -> Dispatcher:
    """One backend of capacity 10,000 already holding 9,900: nothing queued can go."""
    s = GatewaySettings.model_validate({"backends": ["http://b0"]})
    pool = BackendPool(s, httpx.AsyncClient())
    load = pool.backends[0].load
    load.capacity_tokens, load.healthy = 10_000, True
    load.charge(Charge(9_900, LengthDistribution.point(1), CFG))
    pol = parse_policy(policy)
    return Dispatcher(pol, pool, CFG, BoundedQueue(pol, 100, 10**9))


def waiting(arrival: float, pred: LengthDistribution) -> GatewayRequest:
    return GatewayRequest(
        next(_rids),
        arrival,
        100,
        body={},
        route="chat",
        model="m",
        prompt="",
        prediction=pred,
        prediction_path="late",
    )


def test_the_late_prediction_arrives_with_the_answer() -> None:
    predictor = slow_semantic(delay_s=0.1, budget_s=0.01)
    core = predictor.core
    tea = [f"a poem about tea {i}" for i in range(20)]  # history: prompts about tea ran long,
    coffee = [f"one word about coffee {i}" for i in range(20)]  # about coffee short
    for feats, out in zip(core.features_many(tea + coffee), [900] * 20 + [9] * 20, strict=True):
        core.record_features(feats, 10, out, "m")

    async def run() -> tuple[str, float, float | None]:
        prediction = await predictor.predict(PredictionQuery(0, 10, "a poem about tea", model="m"))
        assert prediction.distribution is not None and prediction.later is not None
        later = asyncio.ensure_future(prediction.later)
        assert not later.done()
        late = await later
        return prediction.path, prediction.distribution.mean, None if late is None else late.mean

    path, first, later = asyncio.run(run())
    assert path == "late"
    assert later is not None and later > 1.5 * first  # the prior's answer at once, the neighbours' after


def test_a_queued_request_is_ranked_again_by_its_late_prediction() -> None:
    async def run() -> None:
        d = full_dispatcher()
        long_one, short_one = waiting(1.0, LONG), waiting(2.0, SHORT)
        for r in (long_one, short_one):
            d.submit(r)
        assert d.queue.ordered(d.clock()) == [short_one, long_one]  # short first, as predicted
        before = short_one.charge
        assert d.repredict(short_one, LengthDistribution((5000, 8000), (0.5, 0.5)))
        assert d.queue.ordered(d.clock()) == [long_one, short_one]  # the late prediction re-ranked it
        assert short_one.prediction_path == "late+reranked"
        assert short_one.charge is not before and short_one.charge is not None
        assert short_one.charge.remaining > 4000  # charged by the new prediction too
        assert short_one.t_enqueue <= long_one.t_enqueue + 1.0 and len(d.queue) == 2

    asyncio.run(run())


def test_a_running_request_is_charged_by_its_late_prediction_where_it_runs() -> None:
    async def run() -> None:
        s = GatewaySettings.model_validate({"backends": ["http://b0"]})
        pool = BackendPool(s, httpx.AsyncClient())
        load = pool.backends[0].load
        load.capacity_tokens, load.healthy = 100_000, True
        pol = parse_policy("sagesched")
        d = Dispatcher(pol, pool, CFG, BoundedQueue(pol, 100, 10**9))
        r = waiting(1.0, SHORT)
        d.submit(r)
        d.dispatch()
        assert r.backend == 0 and r.charge is not None
        d.progress(r, 30)
        assert d.rebase(r, LONG)
        fresh = Charge(100, LONG, CFG)
        fresh.update(30)
        assert r.charge.value == fresh.value and load.charged_tokens == fresh.value  # as if sent on it
        assert r.prediction is LONG and r.prediction_path == "late+rebased"
        d.release(r)
        assert load.charged_tokens == 0 and not d.rebase(r, SHORT)  # gone: nothing to charge

    asyncio.run(run())


def test_a_charge_predicted_again_is_the_charge_it_would_have_had() -> None:
    """Whatever the progress and the two predictions, a charge given a new prediction equals one made
    with it from the start and brought to the same progress."""
    from hypothesis import given
    from hypothesis import strategies as st

    dists = st.lists(st.integers(1, 5000), min_size=1, max_size=6, unique=True).map(
        lambda xs: LengthDistribution(tuple(sorted(xs)), tuple(1.0 / len(xs) for _ in xs))
    )

    @given(dists, dists, st.integers(0, 6000), st.integers(1, 4000))
    def check(a: LengthDistribution, b: LengthDistribution, generated: int, prompt: int) -> None:
        c = Charge(prompt, a, CFG)
        c.update(generated)
        c.repredict(b)
        fresh = Charge(prompt, b, CFG)
        fresh.update(generated)
        assert (c.value, c.held, c.remaining) == (fresh.value, fresh.held, fresh.remaining)
        c.update(generated + 500)  # and it goes on as that one would
        fresh.update(generated + 500)
        assert c.value == fresh.value

    check()


def test_a_request_that_left_the_queue_keeps_its_rank() -> None:
    async def run() -> None:
        d = full_dispatcher()
        gone = waiting(1.0, SHORT)
        d.submit(gone)
        assert d.withdraw(gone)
        assert not d.repredict(gone, LONG)  # nothing to re-rank: it is not queued
        assert gone.prediction is SHORT and len(d.queue) == 0

    asyncio.run(run())


def test_a_policy_that_reads_no_prediction_is_left_alone() -> None:
    async def run() -> None:
        d = full_dispatcher("fcfs")
        r = waiting(1.0, SHORT)
        d.submit(r)
        assert not d.repredict(r, LONG)
        assert r.prediction is SHORT and d.queue.ordered(d.clock()) == [r]

    asyncio.run(run())


def test_a_request_pushed_again_is_queued_once_at_its_new_key() -> None:
    from sagegate.policies.queue import PolicyQueue

    pol = parse_policy("sagesched")
    q: PolicyQueue[GatewayRequest] = PolicyQueue(pol)
    a, b = waiting(1.0, SHORT), waiting(2.0, LONG)
    for r in (a, b):
        pol.on_arrival(r, 0.0)
        q.push(r, 0.0)
    assert q.remove(a)
    a.prediction = LengthDistribution.point(9000)
    pol.on_repredict(a, 0.0)
    q.push(a, 0.0)
    assert q.ordered(0.0) == [b, a] and len(q) == 2
    assert [q.pop(0.0), q.pop(0.0), q.pop(0.0)] == [b, a, None]  # the stale entry is never served


def _late_outcomes(url: str) -> dict[str, float]:
    from sagegate.loadgen.scrape import counter_by_label

    return counter_by_label(httpx.get(url + "/metrics").text, "sagegate_late_predictions", "outcome")


@pytest.mark.heavy
def test_through_the_gateway_a_waiting_request_learns_its_late_prediction() -> None:
    """Two late predictions over real HTTP: the first request goes at once (an idle backend) on the
    prior, and its prediction, coming while it runs, charges it there; the second waits behind it,
    and its prediction, coming while it waits, ranks it again."""
    from concurrent.futures import ThreadPoolExecutor

    from sagegate.gateway.app import create_app
    from tests.gateway_support import FakeBackend, ServerThread, chat_body, settings_for, wait_until

    fake = FakeBackend(tokens=4, delay_s=1.0, blocks=1)  # 16 KV tokens: one request (11) at a time
    with ServerThread(fake.app) as be:
        predictor = slow_semantic(delay_s=0.3, budget_s=0.01)
        app = create_app(
            settings_for([be.url], policy="sagesched", predictor="semantic"), predictor=predictor
        )
        with ServerThread(app) as gw, ThreadPoolExecutor(2) as pool:
            send = lambda: httpx.post(gw.url + "/v1/chat/completions", json=chat_body("hi"), timeout=30)  # noqa: E731
            first = pool.submit(send)
            wait_until(lambda: fake.state.requests == 1, what="the first request on the backend")
            second = pool.submit(send)
            assert first.result().status_code == 200 and second.result().status_code == 200
            wait_until(lambda: sum(_late_outcomes(gw.url).values()) == 2, what="both late predictions")
            assert _late_outcomes(gw.url) == {"rebased": 1.0, "reranked": 1.0}


@pytest.mark.heavy
@pytest.mark.parametrize("first", [True, False], ids=["dispatch_first", "waits"])
def test_with_nothing_queued_a_request_does_not_wait_for_its_prediction(
    first: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """An idle gateway sends a request on the prior (its answer and its access line say ``late``)
    instead of waiting for the embedding; with ``dispatch_first`` off it waits for it (within its
    budget)."""
    import json
    import logging

    from sagegate.gateway.app import create_app
    from tests.gateway_support import FakeBackend, ServerThread, chat_body, settings_for, wait_until

    caplog.set_level(logging.INFO, logger="sagegate.access")
    fake = FakeBackend(tokens=4)
    with ServerThread(fake.app) as be:
        predictor = slow_semantic(delay_s=0.2, budget_s=10.0)
        settings = settings_for(
            [be.url], policy="sagesched", predictor="semantic", dispatch_first=first, access_log="json"
        )
        with ServerThread(create_app(settings, predictor=predictor)) as gw:
            r = httpx.post(gw.url + "/v1/chat/completions", json=chat_body("hi there"), timeout=30)
            assert r.status_code == 200
            path = r.headers["x-sagegate-prediction-path"]
            assert (path == "late") is first, path
            access = "sagegate.access"
            lines = lambda: [json.loads(m.getMessage()) for m in caplog.records if m.name == access]  # noqa: E731
            wait_until(lambda: bool(lines()), what="the access line")
            logged = lines()[0]["prediction_path"]  # late, or late+rebased if it came before the end
            assert logged.startswith("late") is first, logged
