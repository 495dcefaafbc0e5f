"""Where the sweep's tasks run: local processes (default) or a Ray cluster.

Both take a picklable module-level function and an iterable of picklable tasks and yield results as
they finish, in any order; the sweep keys every result by its cell id, so the order never matters
and both executors write the same results file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Executor(Protocol):
    name: str

    def map_unordered(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[R]: ...

    def close(self) -> None: ...


class LocalExecutor:
    """A ``multiprocessing`` pool of ``workers`` processes (default: every core); 1 runs inline."""

    name = "local"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = max(1, workers or os.cpu_count() or 1)
        self._pool: Any = None

    def map_unordered(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[R]:
        if self.workers == 1:
            yield from map(fn, tasks)
            return
        if self._pool is None:
            import multiprocessing

            self._pool = multiprocessing.get_context("fork").Pool(self.workers)
        yield from self._pool.imap_unordered(fn, tasks, chunksize=1)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool.join()
            self._pool = None


class RayExecutor:
    """Ray tasks, one per sweep task. Connects to ``address`` (e.g. ``auto`` or ``ray://host:10001``)
    or starts a local Ray with ``num_cpus``; a cluster's workers need this package importable.

    At most ``max_in_flight`` tasks are submitted at once, so a long sweep does not hold every
    result in the object store.
    """

    name = "ray"

    def __init__(
        self, address: str | None = None, num_cpus: int | None = None, max_in_flight: int = 256
    ) -> None:
        import ray

        self.ray = ray
        self.max_in_flight = max_in_flight
        self._started = False
        if not ray.is_initialized():
            env = {
                "env_vars": {
                    "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
                }
            }
            if address:
                ray.init(address=address, runtime_env=env, log_to_driver=False)
            else:
                ray.init(num_cpus=num_cpus, runtime_env=env, include_dashboard=False, log_to_driver=False)
            self._started = True

    def map_unordered(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[R]:
        ray = self.ray
        remote = ray.remote(fn)
        pending: list[Any] = []
        it = iter(tasks)
        exhausted = False
        while True:
            while not exhausted and len(pending) < self.max_in_flight:
                try:
                    pending.append(remote.remote(next(it)))
                except StopIteration:
                    exhausted = True
            if not pending:
                return
            done, pending = ray.wait(pending, num_returns=1)
            yield ray.get(done[0])

    def close(self) -> None:
        if self._started:
            self.ray.shutdown()
            self._started = False


def make_executor(kind: str, workers: int | None = None, address: str | None = None) -> Executor:
    if kind == "local":
        return LocalExecutor(workers)
    if kind == "ray":
        return RayExecutor(address=address, num_cpus=workers)
    raise ValueError(f"unknown executor {kind!r}; valid: local, ray")
