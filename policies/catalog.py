"""Imports every policy module, which registers its policies (see ``policies.registry``)."""

from policies import fifo  # noqa: F401
