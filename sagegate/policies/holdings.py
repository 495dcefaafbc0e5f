"""The most KV the requests in flight on one backend will hold at once (the admission rule ``"peak"``).

Pure arithmetic over each request's holding and predicted remaining output, kept sorted between
changes so that one more request is judged in O(log n).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from itertools import accumulate
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sagegate.policies.admission import Charge


class Holdings:
    """The in-flight requests of one backend, and the most KV they will hold at once.

    Each request holds ``h = prompt + generated`` now and grows by one token a step for its
    predicted ``r`` remaining steps, then frees everything. Sorted by ``r`` from longest to shortest,
    the holding just before the ``k``-th finishes is ``S_k + k·r_k`` (``S_k``: the first ``k``
    holdings); the peak is the largest of these. That is the footprint the rule ``"peak"`` keeps
    under capacity: a request charged its whole footprint from the start (rule ``"sum"``) over-counts
    what short requests hold while long ones are still growing.

    Cached between changes; :meth:`peak_with` answers for one more request in O(log n).
    """

    __slots__ = ("_charges", "_head_max", "_memo", "_memo_key", "_neg_r", "_prefix", "_tail_max", "_valid")

    def __init__(self) -> None:
        self._charges: dict[Charge, None] = {}
        self._valid = False
        self._neg_r: list[int] = []
        self._prefix: list[int] = []
        self._head_max: list[float] = []
        self._tail_max: list[float] = []
        self._memo_key: tuple[Charge, float, int, float] | None = None
        self._memo = False

    def __len__(self) -> int:
        return len(self._charges)

    def __iter__(self) -> Iterator[Charge]:
        return iter(self._charges)

    def add(self, charge: Charge) -> None:
        self._charges[charge] = None
        self._valid = False

    def discard(self, charge: Charge) -> None:
        self._charges.pop(charge, None)
        self._valid = False

    def changed(self) -> None:
        """A request progressed: its holding and remaining moved."""
        self._valid = False

    def _build(self) -> None:
        items = sorted([(-c.remaining, c.held) for c in self._charges])  # longest remaining first
        neg_r = [nr for nr, _ in items]
        prefix = [0, *accumulate([h for _, h in items])]  # prefix[k]: holdings of the k longest
        # peaks[k]: the holding just before the (k+1)-th longest finishes
        peaks = [s - (k + 1) * nr for k, (s, nr) in enumerate(zip(prefix[1:], neg_r, strict=True))]
        inf = float("-inf")
        self._head_max = [inf, *accumulate(peaks, max)]  # head[k]: max of peaks[:k]
        tail: list[float] = [
            *accumulate([pk - nr for pk, nr in zip(reversed(peaks), reversed(neg_r), strict=True)], max)
        ]
        tail.reverse()
        tail.append(inf)  # tail[k]: max of peaks[j] + r_j over j >= k
        self._neg_r, self._prefix, self._tail_max = neg_r, prefix, tail
        self._valid = True
        self._memo_key = None

    def peak(self) -> float:
        """The most the current requests will hold at once."""
        if not self._valid:
            self._build()
        return max(self._head_max[-1], 0.0)

    def peak_with(self, footprint: float, remaining: int) -> float:
        """The peak with one more request of ``footprint`` (= its holding now + ``remaining``)."""
        if not self._valid:
            self._build()
        h = footprint - remaining
        p = bisect_right(self._neg_r, -remaining)  # requests that outlive (or tie) the new one
        alone = self._prefix[p] + h + (p + 1) * remaining  # just before the new one finishes
        # Before it: unchanged. After it (shorter ones): each of those peaks now includes it, grown.
        return max(self._head_max[p], alone, self._tail_max[p] + h)

    def fits(self, charge: Charge, limit: float) -> bool:
        """Whether the peak with ``charge`` stays within ``limit``. The answer is kept until the next
        change, so a held head re-asked on every dispatch pass costs nothing where nothing moved."""
        key = (charge, charge.value, charge.remaining, limit)
        if self._valid and self._memo_key == key:
            return self._memo
        ok = self.peak_with(charge.value, charge.remaining) <= limit
        self._memo_key, self._memo = key, ok
        return ok
