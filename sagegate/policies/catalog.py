"""Imports every policy module, which registers its policies (see ``policies.registry``)."""

from sagegate.policies import (  # noqa: F401
    deadline,
    engine_variants,
    fairness,
    fifo,
    guards,
    mlfq,
    oracle,
    prediction,
    sagesched,
)
