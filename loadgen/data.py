"""Where the shared public data lives: ``$SAGEGATE_DATA``, else ``<repo>/../shared/data``.

The data (traces, ShareGPT pairs, profiles; see that folder's README) is never copied into the
repository; everything that reads it asks here.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

AZURE_CONV = ("azure2023", "AzureLLMInferenceTrace_conv.csv")
AZURE_CODE = ("azure2023", "AzureLLMInferenceTrace_code.csv")
SHAREGPT = ("sharegpt", "sharegpt_v3_first_turn_pairs.jsonl.gz")
MOONCAKE = ("mooncake", "synthetic_trace.jsonl")
BAILIAN_M_SMALL = ("servegen", "language", "m-small")
BAILIAN_DEEPSEEK_R1 = ("servegen", "reason", "deepseek-r1")


def data_root() -> Path:
    env = os.environ.get("SAGEGATE_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


def data_file(*parts: str) -> Path:
    """The path of ``parts`` under the data root (it may not exist: callers check)."""
    return data_root().joinpath(*parts)
