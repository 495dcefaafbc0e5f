"""What reading a stream costs per token event on the relay (``gateway.sse.SseScanner``): a plain
token event, one carrying vLLM's running usage that the gateway takes off again (a stream that may be
continued elsewhere asks for it), and one whose running usage the client asked for (kept).

    .venv/bin/python -m benchmarks bench_scanner [--events 20000] [--repeats 7]

Events are chat chunks as vLLM writes them (compact JSON), each fed alone as a network read brings
one; best of ``--repeats`` runs, microseconds an event. Figures are printed, nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import time

from sagegate.gateway.sse import SseScanner


def event(i: int, running: bool) -> bytes:
    delta = {"index": 0, "delta": {"content": f" w{i}"}, "logprobs": None, "finish_reason": None}
    obj: dict[str, object] = {
        "id": "chatcmpl-0", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [delta],
    }  # fmt: skip
    if running:
        obj["usage"] = {"prompt_tokens": 50, "total_tokens": 50 + i, "completion_tokens": i}
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def per_event_us(events: list[bytes], strip_running: bool, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        sc = SseScanner(True, 1 << 20, strip_running)
        t = time.perf_counter()
        for e in events:
            sc.feed(e)
        best = min(best, (time.perf_counter() - t) / len(events))
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    plain = [event(i, False) for i in range(a.events)]
    running = [event(i, True) for i in range(a.events)]
    print(f"plain token event: {per_event_us(plain, False, a.repeats):.2f} µs")
    print(f"with running usage, taken off: {per_event_us(running, True, a.repeats):.2f} µs")
    print(f"with running usage, kept (the client asked): {per_event_us(running, False, a.repeats):.2f} µs")


if __name__ == "__main__":
    main()
