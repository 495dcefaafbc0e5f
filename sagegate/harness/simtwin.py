"""The simulated twin of a live run: the same workload through the discrete-event simulator with the
live gateway's settings (admission, queue limits, client cap), and the capacity that loads are quoted
against. ``sagegate demo`` and ``benchmarks/bench_value.py`` both use it, so a live figure always has
its simulated counterpart computed the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sagegate.core.request import TraceRequest
from sagegate.loadgen.records import scale_rate

if TYPE_CHECKING:
    from sagegate.core.predictor import LengthPredictor
    from sagegate.gateway.settings_predictor import AnyPredictorSettings
    from sagegate.policies.placement import PlacementProfile
    from sagegate.predictor.semantic import SemanticConfig
    from sagegate.sim.des import SimResult
    from sagegate.sim.engine import Engine


def perf_and_engine(model: str, gpu: str, step_time_scale: float | None = None) -> tuple[Any, Any]:
    """The engine model and config of ``model`` on ``gpu``; ``step_time_scale`` (None: the GPU
    profile's) stretches every step, for the error bars of ``benchmarks/error_bars.py``."""
    from sagegate.sim.config import EngineConfig
    from sagegate.sim.hardware import get_gpu, get_model
    from sagegate.sim.perf import PerfModel

    perf = PerfModel(get_model(model), get_gpu(gpu), step_time_scale=step_time_scale)
    return perf, EngineConfig(model=model, gpu=gpu)


def engine_speed(model: str, gpu: str) -> Any:
    """The ``forecast`` placement's :class:`~sagegate.policies.placement.forecast.EngineSpeed` of
    ``model`` on ``gpu`` as the engine model has it: a prefill token's time over prompts of 1-8k
    tokens, and a decode step's time at batches 1-64 of 4,000 tokens of context each (least squares
    on ``step_s + per_seq_s · batch``)."""
    from sagegate.policies.engine_speed import EngineSpeed

    perf, _ = perf_and_engine(model, gpu)
    prefill = sum(perf.prefill_time(t) / t for t in (1024, 4096, 8192)) / 3
    xs = list(range(1, 65))
    ys = [perf.decode_step_time(n, n * 4000) for n in xs]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return EngineSpeed(prefill_s=prefill, step_s=my - slope * mx, per_seq_s=slope)


def sim_predictor(
    name: str,
    seed: int = 0,
    semantic: SemanticConfig | None = None,
    options: AnyPredictorSettings | None = None,
) -> LengthPredictor | None:
    """The gateway's predictor ``name`` with the live gateway's options (``options``, default its
    defaults), answering at once as the simulator needs (None for ``none``); ``semantic`` replaces the
    semantic predictor's hyperparameters."""
    from dataclasses import replace

    from sagegate.gateway.settings_predictor import predictor_options
    from sagegate.predictor.factory import SemanticOptions, make_predictor

    if name == "none":
        return None
    opts = (options or predictor_options(name)).factory_options()
    if isinstance(opts, SemanticOptions):
        from sagegate.predictor.semantic import inline_config

        # features on the calling thread, refits inline: the same run every time
        opts = replace(opts, config=inline_config(semantic or opts.config), budget_s=None)
    return make_predictor(name, opts, seed=seed)


def simulate_run(
    work: Sequence[TraceRequest],
    policy: str | None,
    *,
    model: str,
    gpu: str,
    engines: int = 2,
    predictor: str = "length-bucket",
    seed: int = 0,
    max_wait_s: float | None = None,
    step_time_scale: float | None = None,
    pause: bool = False,
    pause_options: Mapping[str, float] | None = None,
    predictor_options: AnyPredictorSettings | None = None,
    placement: str | None = None,
    engine_rank: bool = False,
    predictor_override: LengthPredictor | None = None,
    admission: Mapping[str, Any] | None = None,
    profile: PlacementProfile | None = None,
    route: Callable[[TraceRequest, Sequence[Engine]], int] | None = None,
) -> SimResult:
    """``policy`` at the gateway (None: vLLM alone, round robin) in the simulator, with the live
    gateway's admission settings, its queue limits (``max_wait_s`` in engine seconds; None: no
    timeout), the starvation bound the live gateway derives from them (``queue.aged_share``) and the
    front end's cost added as a client sees it. ``pause``: the live gateway's ``pause.enabled``, the
    rule's other settings from ``pause_options``. ``predictor_options``: the gateway's
    ``predictor_options`` (default its defaults). ``placement``: the gateway's ``placement.mode``
    (None: its default). ``engine_rank``: the gateway's ``upstream.rank_priority`` to engines in vLLM's
    priority mode. ``predictor_override``: a predictor built by the caller (an oracle handed the
    answer key) in place of ``predictor``. ``admission``: the gateway's ``admission`` settings given
    (the rest its defaults). ``profile``: the placement plugins (None: the default profile).
    ``route``: with no ``policy``, the router before the engines (None: round robin)."""
    from sagegate.gateway.settings import AdmissionSettings, PauseSettings, PlacementSettings, QueueSettings
    from sagegate.policies.placement import DEFAULT_PROFILE
    from sagegate.policies.registry import parse_policy
    from sagegate.predictor.semantic_face import SemanticLengthPredictor
    from sagegate.sim.des import QueueLimits, SimSetup, client_view, simulate

    perf, engine = perf_and_engine(model, gpu, step_time_scale)
    if policy is None:
        setup = SimSetup(
            perf, engine, engines=engines, level="engine", policy=parse_policy("fcfs"), route=route
        )
    else:
        pred = predictor_override or sim_predictor(predictor, seed, options=predictor_options)
        if isinstance(pred, SemanticLengthPredictor):
            pred.prime(work)  # embed the prompts in batches, ahead
        q = QueueSettings()
        setup = SimSetup(
            perf,
            engine,
            engines=engines,
            level="gateway",
            policy=parse_policy(policy, _aged_bound(q.aged_share, max_wait_s)),
            predictor=pred,
            # the live gateway's admission, backlog included
            admission=AdmissionSettings.model_validate(admission or {}).config(),
            queue_limits=QueueLimits(q.max_requests, q.max_tokens, max_wait_s if max_wait_s else 1e18),
            pause=PauseSettings.model_validate({"enabled": pause, **(pause_options or {})}).config(),
            placement=placement or PlacementSettings().mode,
            engine_rank=engine_rank,
            profile=DEFAULT_PROFILE if profile is None else profile,
        )
    result = simulate(work, setup)
    client_view(result, perf.frontend_s)
    return result


def _aged_bound(share: float, max_wait_s: float | None) -> dict[str, float] | None:
    """As ``gateway.app.gateway_policy``: ``max_wait_s = aged_share × queue.max_wait_s`` for a policy
    whose spec sets none (here in engine seconds)."""
    return {"max_wait_s": share * max_wait_s} if share > 0 and max_wait_s else None


def capacity(
    work: Sequence[TraceRequest],
    *,
    model: str,
    gpu: str,
    engines: int = 2,
    step_time_scale: float | None = None,
) -> dict[str, float]:
    """vLLM alone's saturated throughput on this request mix, in the engine model that the simulated
    backends run: every request arrives within one second, and the rate is read between the 10th and
    the 90th percentile of completions (the backlog's steady state, without the ramp and the drain
    tail). What loads are quoted against."""
    import numpy as np

    span = max(work[-1].arrival_s, 1e-9)
    burst = scale_rate(list(work), span)
    res = simulate_run(burst, None, model=model, gpu=gpu, engines=engines, step_time_scale=step_time_scale)
    done = [r for r in res.records if r.finish_s is not None and r.status == "ok"]
    finish = np.sort([r.finish_s for r in done])
    n = len(finish)
    lo, hi = finish[int(0.1 * n)], finish[min(n - 1, int(0.9 * n))]
    out = [r.output_tokens for r in done]
    req_s = (0.8 * n) / max(hi - lo, 1e-9)
    return {"req_s": float(req_s), "tok_s": float(req_s * np.mean(out))}


def offered_rate(work: Sequence[TraceRequest]) -> float:
    """Requests per second over the arrivals' span."""
    return len(work) / max(work[-1].arrival_s - work[0].arrival_s, 1e-9)


def bulk_rate(work: Sequence[TraceRequest]) -> float:
    """Requests a second over the first 90% of arrivals: what loads of multi-turn sessions are read on
    (a few long conversations stretch the last arrivals far out, so the whole span reads low)."""
    times = sorted(r.arrival_s for r in work)
    k = int(0.9 * len(times))
    return k / max(times[k - 1] - times[0], 1e-9)


def utilisation(work: Sequence[TraceRequest], cap: dict[str, float]) -> float:
    """Offered requests per second over the capacity's."""
    return offered_rate(work) / cap["req_s"]


def scale_for(
    build: Callable[[float], Sequence[TraceRequest]],
    target: float,
    mix: Sequence[TraceRequest],
    *,
    model: str,
    gpu: str,
    step_time_scale: float | None = None,
) -> tuple[float, dict[str, float]]:
    """The rate multiplier at which ``build(scale)`` offers ``target`` × vLLM alone's capacity, and that
    capacity, measured on ``mix``: a large sample of the same request mix (a burst of a few hundred
    requests reads low and noisy). The trace's rate varies within its window, so the multiplier is
    found by bisection (in log space) on the offered rate."""
    cap = capacity(mix, model=model, gpu=gpu, step_time_scale=step_time_scale)
    return scale_at(lambda x: offered_rate(build(x)), target * cap["req_s"]), cap


def scale_at(rate_at: Callable[[float], float], want: float, highest: float = 100.0) -> float:
    """The scale in [0.01, ``highest``] at which ``rate_at(scale)`` (growing with the scale) reaches
    ``want``, by bisection in log space."""
    import math

    lo, hi = math.log(0.01), math.log(highest)
    while hi - lo > 0.005:
        mid = (lo + hi) / 2
        if rate_at(math.exp(mid)) < want:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)
