"""Asking a predictor on the simulator's clock (core.predictor.AtOnce): an inline predictor is called
directly, anything else through its coroutines, with the same answers and the same learning."""

from __future__ import annotations

from sagegate.core.predictor import AtOnce, Prediction, settle
from sagegate.core.request import PredictionQuery, TraceRequest
from sagegate.predictor.baselines import GlobalPredictor


def query(rid: int) -> PredictionQuery:
    return PredictionQuery.of(TraceRequest(float(rid), 100, 1, rid=rid))


def test_an_inline_predictor_answers_and_learns_as_through_its_coroutines() -> None:
    direct, through = GlobalPredictor(min_samples=2), GlobalPredictor(min_samples=2)
    at_once = AtOnce(direct)
    for rid, out in enumerate([30, 500, 70, 9, 1200]):
        a = at_once.predict(query(rid))
        b = settle(through.predict(query(rid)))
        da, db = a.distribution, b.distribution
        assert a.path == b.path and da is not None and db is not None
        assert (da.support, da.probs) == (db.support, db.probs)
        at_once.observe(query(rid), out)
        settle(through.observe(query(rid), out))
    assert at_once.predict(query(9)).distribution.support == (9, 30, 70, 500, 1200)  # type: ignore[union-attr]


class Overridden(GlobalPredictor):
    """An inline predictor whose coroutines do more than the inline calls: AtOnce must use them."""

    def __init__(self) -> None:
        super().__init__()
        self.memos: list[object] = []

    async def predict(self, query: PredictionQuery) -> Prediction:
        return Prediction(self.predict_inline(query), self.name, memo=query.rid)

    async def observe(self, query: PredictionQuery, output_tokens: int, memo: object = None) -> None:
        self.memos.append(memo)
        self.observe_inline(query, output_tokens)


def test_a_predictor_that_overrides_its_coroutines_is_asked_through_them() -> None:
    p = Overridden()
    at_once = AtOnce(p)
    answer = at_once.predict(query(7))
    assert answer.memo == 7
    at_once.observe(query(7), 40, answer.memo)
    assert p.memos == [7]
