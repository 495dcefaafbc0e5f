"""Imports every policy module, which registers its policies (see ``policies.registry``)."""

from policies import (  # noqa: F401
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
