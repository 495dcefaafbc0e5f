"""Read the public real-vLLM H100 runs of inference-sim/training (BLIS) for benchmarks/fidelity.py.

Each run is one vLLM 0.15 server (``--max-num-seqs 128 --max-num-batched-tokens 2048``) under
inference-perf: per request its arrival, prompt and output tokens (``replay_data/<run>.json``) and
its measured E2E and TTFT (``replay_data/<run>_ground_truth.json``, pull request 1 of the
repository); the load stages come from ``default_args/<run>/profile.yaml`` on main.

The data is read either from the git mirror that ``fetch github:inference-sim/training`` leaves (no
work tree: files are read with ``git show``) or from a plain checkout holding the same paths.
Llama-2-7B runs are never opened: they are held out for a blind check (issue 15).
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SOURCE = Path("/work/.mirror/inference-sim+training/repo")
REPLAY_REF = "refs/pull/1/head"
MAIN_REF = "HEAD"
HELD_OUT_BLIND = re.compile(r"llama-?2-?7b", re.IGNORECASE)

MODEL_OF_RUN = {
    "llama-2-70b": "llama-2-70b",
    "mixtral-8x7b": "mixtral-8x7b",
    "codellama-34b": "codellama-34b",
}


@dataclass(frozen=True)
class RunRequest:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    e2e_s: float | None  # measured; None when the request failed (client timeout)
    ttft_s: float | None


@dataclass(frozen=True)
class Run:
    name: str
    model: str
    profile: str
    tp: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_blocks: int
    stage_ends_s: tuple[float, ...]
    stage_rates: tuple[float, ...]
    requests: tuple[RunRequest, ...]

    @property
    def failure_rate(self) -> float:
        return sum(r.e2e_s is None for r in self.requests) / len(self.requests)


class Source:
    """Files of the training repository, from a git mirror or a plain directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.is_git = (root / "HEAD").is_file() and (root / "objects").is_dir()

    def read(self, path: str, ref: str) -> str:
        if HELD_OUT_BLIND.search(path):
            raise ValueError(f"{path} is a held-out Llama-2-7B run")
        if not self.is_git:
            return (self.root / path).read_text(encoding="utf-8")
        out = subprocess.run(
            ["git", "--git-dir", str(self.root), "show", f"{ref}:{path}"], capture_output=True, check=True
        )
        return out.stdout.decode("utf-8")

    def list(self, folder: str, ref: str) -> list[str]:
        if not self.is_git:
            names = [p.name for p in (self.root / folder).iterdir()]
        else:
            out = subprocess.run(
                ["git", "--git-dir", str(self.root), "ls-tree", "--name-only", f"{ref}:{folder}"],
                capture_output=True,
                check=True,
            )
            names = out.stdout.decode().split()
        return sorted(n for n in names if not HELD_OUT_BLIND.search(n))


def run_names(src: Source) -> list[str]:
    return [
        n.removesuffix(".json")
        for n in src.list("replay_data", REPLAY_REF)
        if n.endswith("general.json") or re.search(r"-(codegen|roleplay|reasoning)\.json$", n)
    ]


def load_run(src: Source, name: str) -> Run:
    replay = json.loads(src.read(f"replay_data/{name}.json", REPLAY_REF))
    truth = {t["index"]: t for t in json.loads(src.read(f"replay_data/{name}_ground_truth.json", REPLAY_REF))}
    profile = json.loads(src.read(f"default_args/{name}/profile.yaml", MAIN_REF))
    stages = profile["load"]["stages"]
    ends, t = [], 0.0
    for st in stages:
        t += float(st["duration"])
        ends.append(t)
    cfg = replay["config"]
    model = next(m for key, m in MODEL_OF_RUN.items() if key in name)
    reqs = []
    for r in replay["requests"]:
        gt = truth.get(r["index"])
        ok = gt is not None and not gt["has_error"] and not r["has_error"]
        reqs.append(
            RunRequest(
                arrival_s=r["arrival_time_us"] / 1e6,
                prompt_tokens=max(1, int(r["input_tokens"])),
                output_tokens=max(1, int(r["output_tokens"])),
                e2e_s=float(gt["e2e_s"]) if ok and gt else None,
                ttft_s=float(gt["ttft_s"]) if ok and gt else None,
            )
        )
    return Run(
        name=name,
        model=model,
        profile=str(replay["profile"]),
        tp=int(cfg["tensor_parallelism"]),
        max_num_seqs=int(cfg["max_num_seqs"]),
        max_num_batched_tokens=int(cfg["max_num_batched_tokens"]),
        kv_blocks=int(cfg["kv_blocks_total_gpu"]),
        stage_ends_s=tuple(ends),
        stage_rates=tuple(float(st["rate"]) for st in stages),
        requests=tuple(reqs),
    )


def load_runs(root: Path = DEFAULT_SOURCE) -> list[Run]:
    src = Source(root)
    return [load_run(src, n) for n in run_names(src)]
