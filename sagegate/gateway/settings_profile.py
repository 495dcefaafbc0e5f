"""``placement.profile``: the placement plugins (``policies.placement``; ``gateway.settings`` holds the
rest of the one settings object)."""

from __future__ import annotations

from pydantic import BaseModel, Field, PrivateAttr, model_validator

from sagegate.policies.placement import PlacementProfile, build_profile


class ProfileSettings(BaseModel):
    """Which scorers grade the backends, with what weight, and which picker chooses
    (docs/placement.md). Any change is checked at start-up."""

    picker: str = "forecast"
    """``forecast``: the backend where the request's last token is forecast soonest, counting what it
    costs the requests already there (reads no scorers); ``incumbent``: the most-room backend unless
    one holding more of the prompt scores strictly better by the weighted scorers (raw units);
    ``max_score``: the best weighted sum of the scorers, each rescaled to [0, 1] over the candidates
    (llm-d's picker). Or ``module:Class``."""
    scorers: dict[str, float] | None = None
    """Scorer name → weight: ``prefix_hit``, ``queued_prefill``, ``room``, ``least_held``,
    ``fewest_running``, or ``module:Class``. None: the picker's own (``prefix_hit`` and
    ``queued_prefill`` at 1 for one that weighs scorers); refused with ``forecast``."""
    filters: list[str] = Field(default_factory=list)
    """Filters added to the admission rule's own (``module:Class``)."""

    _profile: PlacementProfile = PrivateAttr()

    @model_validator(mode="after")
    def _buildable(self) -> ProfileSettings:
        # an unknown name or a bad weight fails here, at start-up, with what exists; built once
        self._profile = build_profile(self.scorers, self.picker, self.filters)
        return self

    def build(self) -> PlacementProfile:
        """The profile these settings name (made when they were validated)."""
        return self._profile
