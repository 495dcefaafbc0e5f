"""Shared test helpers: where the real workload data lives, and skipping cleanly when it is absent.

The data (see ``../shared/data/README.md``) is never copied into the repository; it is found at
``$SAGEGATE_DATA`` or ``<repo>/../shared/data``. A fresh checkout without it still passes: the tests
that need a file skip with a message saying what is missing and how to provide it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from loadgen.data import data_root

REPO = Path(__file__).resolve().parents[1]


def data_path(*parts: str) -> Path:
    """The path of ``parts`` under the shared data folder; skips the calling test if it is absent."""
    path = data_root().joinpath(*parts)
    if not path.exists():
        pytest.skip(
            f"shared data not found: {path} "
            "(set SAGEGATE_DATA or put the data folder at <repo>/../shared/data)"
        )
    return path


@pytest.fixture
def shared_data() -> Path:
    """The shared data folder (the test skips if it is absent); prefer ``data_path`` for one file."""
    return data_path()
