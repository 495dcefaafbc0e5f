"""Write ``loadgen/fetch_catalog.json``: the public sets ``sagegate data fetch NAME`` downloads.

    .venv/bin/python -m tools.pin_fetch_catalog [--shared DIR]

Each file gets its upstream URL (GitHub raw URLs at a pinned commit where the upstream is a git
repository) and, where a byte-identical copy is in the shared data folder, its size and sha256. Every
shared copy used here was checked against the upstream tree first: its git blob id equals the blob id
``git ls-tree`` gives at the pinned commit (the id is recorded as ``git_blob`` and checked on fetch too).
Files with no shared copy are pinned by their upstream git blob id alone where one is known, and are
otherwise ``unpinned``: the fetch prints the sha256 it computed instead of checking one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

from sagegate.loadgen.data import data_root

REPO = Path(__file__).resolve().parents[1]

OUT = REPO / "sagegate" / "loadgen" / "fetch_catalog.json"

AZURE = "b469a113cedca53ddc3bdea71a143dc4b7d8700c"
MOONCAKE = "3b5a594133958449a1feaf1c9e0fc1b553e34a28"
SERVEGEN = "f891d1189eb32b3868dfc443800c4150548c282a"
RAW = "https://raw.githubusercontent.com"

# Upstream blob ids (``git ls-tree`` at the pinned commit) of files with no shared copy to hash.
KNOWN_BLOBS = {
    "mooncake/toolagent_trace.jsonl": "b765599d1e0828b37f68d481563c385d3c11de54",
    "servegen/language/m-small/chunk-1-dataset.json": "ba332780f485510ec8203075599deca208b8e2a0",
    "servegen/language/m-small/chunk-11-dataset.json": "de8f45d361c5642b716ec8e540c82191c7928850",
    "servegen/language/m-small/chunk-38-dataset.json": "055e6a4f3f6654dae0483131e1525fb2bd1429ce",
    "servegen/language/m-small/chunk-5-dataset.json": "dea24be3074365374f146fe1e24a1cc44aa7503e",
    "servegen/language/m-small/chunk-8-dataset.json": "585e69a7008d9bd6846c4070158bb53f1e5a9bfc",
}
SERVEGEN_CLIENTS = {"language/m-small": 43, "reason/deepseek-r1": 73}  # chunk-0 .. chunk-(N-1), with gaps


def git_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def entry(shared: Path, path: str, url: str) -> dict[str, Any]:
    f = shared / path
    if f.is_file():
        data = f.read_bytes()
        return {
            "path": path,
            "url": url,
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "git_blob": git_blob(data),
        }
    out: dict[str, Any] = {"path": path, "url": url}
    if path in KNOWN_BLOBS:
        out["git_blob"] = KNOWN_BLOBS[path]
    return out


def servegen_files(shared: Path) -> list[dict[str, Any]]:
    out = []
    for folder, n in SERVEGEN_CLIENTS.items():
        for i in range(n):
            for kind in ("trace.csv", "dataset.json"):
                path = f"servegen/{folder}/chunk-{i}-{kind}"
                if (shared / path).is_file() or path in KNOWN_BLOBS:
                    out.append(entry(shared, path, f"{RAW}/alibaba/ServeGen/{SERVEGEN}/data/{path[9:]}"))
    return out


def catalog(shared: Path) -> dict[str, Any]:
    azure = f"{RAW}/Azure/AzurePublicDataset/{AZURE}/data"
    blob24 = "https://azurepublicdatasettraces.blob.core.windows.net/azurellminfererencetrace"
    moon = f"{RAW}/kvcache-ai/Mooncake/{MOONCAKE}/FAST25-release/traces"
    burst = "https://github.com/HPMLL/BurstGPT/releases/download/v1.1"
    hf = "https://huggingface.co/datasets/anon8231489123/ShareGPT_Vicuna_unfiltered/resolve/main"
    cc, apache = "CC-BY-4.0", "Apache-2.0"
    return {
        "azure2023": {
            "about": "Azure LLM inference traces 2023, conversation and code, one hour each",
            "licence": cc,
            "source": f"Azure/AzurePublicDataset @ {AZURE}, data/",
            "cite": "Patel et al., Splitwise, ISCA 2024",
            "files": [
                entry(
                    shared,
                    f"azure2023/AzureLLMInferenceTrace_{k}.csv",
                    f"{azure}/AzureLLMInferenceTrace_{k}.csv",
                )
                for k in ("conv", "code")
            ],
        },
        "azure2024": {
            "about": "Azure LLM inference traces 2024, conversation and code, one week each (~700 MB)",
            "licence": cc,
            "source": "Azure/AzurePublicDataset, AzureLLMInferenceDataset2024.md (Azure blob storage)",
            "cite": "Stojkovic et al., DynamoLLM, HPCA 2025",
            "files": [
                {
                    "path": f"azure2024/AzureLLMInferenceTrace_{k}_1week.csv",
                    "url": f"{blob24}/AzureLLMInferenceTrace_{k}_1week.csv",
                }
                for k in ("conv", "code")
            ],
        },
        "mooncake": {
            "about": "Mooncake FAST'25 synthetic trace (3,993 requests with prefix-block hash ids)",
            "licence": apache,
            "source": f"kvcache-ai/Mooncake @ {MOONCAKE}, FAST25-release/traces/",
            "files": [entry(shared, "mooncake/synthetic_trace.jsonl", f"{moon}/synthetic_trace.jsonl")],
        },
        "mooncake-toolagent": {
            "about": "Mooncake FAST'25 tool-and-agent trace",
            "licence": apache,
            "source": f"kvcache-ai/Mooncake @ {MOONCAKE}, FAST25-release/traces/",
            "files": [entry(shared, "mooncake/toolagent_trace.jsonl", f"{moon}/toolagent_trace.jsonl")],
        },
        "servegen": {
            "about": "ServeGen (Alibaba Bailian) per-client models: language/m-small and reason/deepseek-r1",
            "licence": apache,
            "source": f"alibaba/ServeGen @ {SERVEGEN}, data/",
            "files": servegen_files(shared),
        },
        "burstgpt": {
            "about": "BurstGPT v1.1 release: Azure OpenAI GPT request log, two files (~120 MB)",
            "licence": cc,
            "source": "HPMLL/BurstGPT, GitHub release v1.1",
            "cite": "Wang et al., BurstGPT, KDD 2025",
            "files": [
                {"path": f"burstgpt/BurstGPT_{i}.csv", "url": f"{burst}/BurstGPT_{i}.csv"} for i in (1, 2)
            ],
        },
        "sharegpt-v3": {
            "about": "ShareGPT V3 conversations (scraped ChatGPT text, research use; licence per its "
            "card), the full source of the first-turn pairs (~670 MB JSON)",
            "licence": apache,
            "source": "huggingface.co/datasets/anon8231489123/ShareGPT_Vicuna_unfiltered, main",
            "files": [
                {
                    "path": "sharegpt/ShareGPT_V3_unfiltered_cleaned_split.json",
                    "url": f"{hf}/ShareGPT_V3_unfiltered_cleaned_split.json",
                }
            ],
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", type=Path, default=data_root())
    args = ap.parse_args()
    cat = catalog(args.shared)
    OUT.write_text(json.dumps(cat, indent=1) + "\n")
    for name, ds in cat.items():
        pinned = sum("sha256" in f for f in ds["files"])
        blobs = sum("git_blob" in f and "sha256" not in f for f in ds["files"])
        print(f"{name}: {len(ds['files'])} files, {pinned} sha256-pinned, {blobs} by git blob only")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
