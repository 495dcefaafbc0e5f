"""Workload readers and the synthetic generator: real files (skipped when the shared data is absent),
small handwritten fixtures of every format, malformed rows, detection, and seeded generation."""

from __future__ import annotations

import ast
import csv
import datetime as dt
import gzip
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import data_path
from hypothesis import given, settings
from hypothesis import strategies as st

from sagegate.core.request import TraceRequest
from sagegate.loadgen.readers import (
    FORMATS,
    ReadStats,
    TraceFormatError,
    detect_format,
    read_trace,
    read_trace_with_stats,
    retime,
)
from sagegate.loadgen.synthetic import DECODE_S_PER_TOKEN, PREFILL_S_PER_TOKEN, synthetic_workload

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def write_jsonl(path: Path, rows: list[dict[str, object]], *, gz: bool = False) -> Path:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(text)
        return path
    return write(path, text)


def check_canonical(reqs: list[TraceRequest]) -> None:
    """What ``read_trace`` promises for any format."""
    assert [r.rid for r in reqs] == list(range(len(reqs)))
    arrivals = [r.arrival_s for r in reqs]
    assert arrivals == sorted(arrivals)
    if reqs:
        assert arrivals[0] == 0.0
    assert all(r.prompt_tokens > 0 and r.output_tokens > 0 for r in reqs)


def azure_seconds(text: str) -> float:
    """Independent parse of the 2023 style (strptime takes six fractional digits, add the seventh)."""
    head, frac = text.split(".")
    t = dt.datetime.strptime(head, "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.UTC)
    return t.timestamp() + int(frac) / 10 ** len(frac)


# --- real files -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "rows"),
    [("AzureLLMInferenceTrace_conv.csv", 19_366), ("AzureLLMInferenceTrace_code.csv", 8_819)],
)
def test_azure_real_trace(name: str, rows: int) -> None:
    path = data_path("azure2023", name)
    reqs = read_trace(path)
    check_canonical(reqs)
    assert len(reqs) == rows
    with path.open(newline="") as fh:
        raw = list(csv.DictReader(fh))
    times = [azure_seconds(r["TIMESTAMP"]) for r in raw]
    t0 = min(times)
    expected = sorted(zip(times, raw, strict=True), key=lambda x: x[0])
    assert [r.arrival_s for r in reqs] == pytest.approx([t - t0 for t, _ in expected], abs=1e-6)
    assert [r.prompt_tokens for r in reqs] == [int(x["ContextTokens"]) for _, x in expected]
    assert [r.output_tokens for r in reqs] == [int(x["GeneratedTokens"]) for _, x in expected]
    assert 3000 < reqs[-1].arrival_s <= 3600  # a one-hour trace


def test_mooncake_real_trace_keeps_hash_ids() -> None:
    path = data_path("mooncake", "synthetic_trace.jsonl")
    reqs = read_trace(path)
    check_canonical(reqs)
    assert len(reqs) == 3_993
    raw = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert reqs[-1].arrival_s == pytest.approx((raw[-1]["timestamp"] - raw[0]["timestamp"]) / 1000)
    assert all(isinstance(r.hash_ids, tuple) for r in reqs)
    # one id per 512-token block of prompt
    assert all(r.hash_ids is not None and len(r.hash_ids) == math.ceil(r.prompt_tokens / 512) for r in reqs)
    assert sorted(len(r.hash_ids or ()) for r in reqs) == sorted(len(x["hash_ids"]) for x in raw)


def test_sharegpt_real_pairs_at_a_seeded_rate() -> None:
    path = data_path("sharegpt", "sharegpt_v3_first_turn_pairs.jsonl.gz")
    reqs = read_trace(path, rate=5.0, seed=3)
    check_canonical(reqs)
    assert len(reqs) == 11_128
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        raw = [json.loads(line) for line in fh]
    assert [r.prompt for r in reqs] == [x["prompt"] for x in raw]  # Poisson arrivals keep file order
    assert [r.prompt_tokens for r in reqs] == [x["prompt_tokens_cl100k"] for x in raw]
    assert [r.output_tokens for r in reqs] == [x["response_tokens_cl100k"] for x in raw]
    assert (len(reqs) - 1) / reqs[-1].arrival_s == pytest.approx(5.0, rel=0.05)
    again = read_trace(path, rate=5.0, seed=3, limit=50)
    assert [r.arrival_s for r in again] == [r.arrival_s for r in reqs[:50]]
    other = read_trace(path, rate=5.0, seed=4, limit=50)
    assert [r.arrival_s for r in other] != [r.arrival_s for r in again]


def servegen_expected(folder: Path, start: float, end: float, clients: list[int] | None = None) -> float:
    """Σ rate × overlap over the windows of clients that have a dataset file (read independently)."""
    total = 0.0
    for trace in folder.glob("chunk-*-trace.csv"):
        client = int(trace.name.split("-")[1])
        if (clients is not None and client not in clients) or not (
            folder / f"chunk-{client}-dataset.json"
        ).exists():
            continue
        with trace.open(newline="") as fh:
            rows = [(float(r[0]), float(r[1])) for r in csv.reader(fh)]
        for w, rate in rows:
            total += rate * max(0.0, min(end, w + 600) - max(start, w))
    return total


@pytest.mark.parametrize(
    ("folder", "start", "duration", "clients"),
    [
        (("servegen", "language", "m-small"), 86_400.0, 1_800.0, [0, 2, 3, 4, 6, 7]),
        (("servegen", "reason", "deepseek-r1"), 0.0, 3_600.0, None),
    ],
)
def test_servegen_real_rate_matches_the_trace(
    folder: tuple[str, ...], start: float, duration: float, clients: list[int] | None
) -> None:
    path = data_path(*folder)
    reqs, stats = read_trace_with_stats(path, start_s=start, duration_s=duration, clients=clients, seed=1)
    check_canonical(reqs)
    expected = servegen_expected(path, start, start + duration, clients)
    assert expected > 1000
    assert len(reqs) == pytest.approx(expected, rel=0.05)
    assert stats.kept == len(reqs)
    assert reqs[-1].arrival_s < duration


@pytest.mark.parametrize(
    ("folder", "start", "clients"),
    [
        (("servegen", "language", "m-small"), 36_000.0, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 14]),
        (("servegen", "reason", "deepseek-r1"), 0.0, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 14]),
    ],
)
def test_servegen_real_slice_is_deterministic(
    folder: tuple[str, ...], start: float, clients: list[int]
) -> None:
    path = data_path(*folder)
    opts: dict[str, Any] = {"start_s": start, "duration_s": 600.0, "rate_scale": 0.5}
    a, stats = read_trace_with_stats(path, seed=7, clients=clients, **opts)
    b = read_trace(path, seed=7, clients=clients, **opts)
    c = read_trace(path, seed=8, clients=clients, **opts)
    assert len(a) > 50
    assert a == b
    assert [r.extra for r in a] == [r.extra for r in b]
    assert a != c
    with_dataset = {int(p.name.split("-")[1]) for p in path.glob("chunk-*-dataset.json")}
    assert {r.tenant for r in a} <= {f"client-{n}" for n in with_dataset & set(clients)}
    assert set(stats.skipped_clients) == set(clients) - with_dataset
    # lengths come from the client's empirical dicts
    client = int(a[0].tenant.split("-")[1])
    table = json.loads((path / f"chunk-{client}-dataset.json").read_text())
    support = set().union(*(ast.literal_eval(v["input_tokens"]) for v in table.values()))
    assert {r.prompt_tokens for r in a if r.tenant == a[0].tenant} <= support
    if "deepseek" in folder[-1]:
        ratios = [r.extra["reason_ratio"] for r in a]
        assert all(isinstance(x, float) and 0.0 <= x <= 1.0 for x in ratios)


# --- handwritten fixtures ----------------------------------------------------------------------


def test_azure_2023_style_sorts_and_crosses_midnight(tmp_path: Path) -> None:
    path = write(
        tmp_path / "a.csv",
        AZURE_HEADER
        + "2023-11-16 23:59:59.5000000,10,5\n"
        + "2023-11-16 23:59:58.2500000,20,6\n"
        + "2023-11-17 00:00:01.0000001,30,7\n",
    )
    reqs = read_trace(path)
    check_canonical(reqs)
    assert [r.arrival_s for r in reqs] == pytest.approx([0.0, 1.25, 2.7500001], abs=1e-9)
    assert [(r.prompt_tokens, r.output_tokens) for r in reqs] == [(20, 6), (10, 5), (30, 7)]


def test_azure_2024_style_with_offsets(tmp_path: Path) -> None:
    path = write(
        tmp_path / "a.csv",
        AZURE_HEADER
        + "2024-05-10 00:00:00.009930+00:00,10,5\n"
        + "2024-05-10 00:00:01.5+00:00,11,5\n"
        + "2024-05-10 02:00:02.000000+02:00,12,5\n"
        + "2024-05-10T00:00:03Z,13,5\n",
    )
    reqs = read_trace(path, "azure")
    assert [r.arrival_s for r in reqs] == pytest.approx([0.0, 1.49007, 1.99007, 2.99007], abs=1e-9)
    assert [r.prompt_tokens for r in reqs] == [10, 11, 12, 13]


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.datetimes(min_value=dt.datetime(2023, 1, 1), max_value=dt.datetime(2025, 1, 1)),
            st.integers(0, 9),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_azure_timestamps_match_datetime_arithmetic(stamps: list[tuple[dt.datetime, int]]) -> None:
    import tempfile

    lines = [f"{t:%Y-%m-%d %H:%M:%S.%f}{d},{i + 1},3\n" for i, (t, d) in enumerate(stamps)]
    with tempfile.TemporaryDirectory() as tmp:
        reqs = read_trace(write(Path(tmp) / "t.csv", AZURE_HEADER + "".join(lines)))
    secs = {i + 1: (t - dt.datetime(2023, 1, 1)).total_seconds() + d / 1e7 for i, (t, d) in enumerate(stamps)}
    t0 = min(secs.values())
    assert len(reqs) == len(stamps)
    for r in reqs:
        assert r.arrival_s == pytest.approx(secs[r.prompt_tokens] - t0, abs=1e-6)


def test_burstgpt_six_columns_drops_and_counts_failures(tmp_path: Path) -> None:
    path = write(
        tmp_path / "b.csv",
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n"
        "45,ChatGPT,1087,0,1087,Conversation log\n"
        "118,GPT-4,417,276,693,API log\n"
        "140,ChatGPT,0,0,0,Conversation log\n"
        "151,GPT-4,90,30,120,Conversation log\n",
    )
    reqs, stats = read_trace_with_stats(path, tenant_column="Model")
    check_canonical(reqs)
    assert stats.rows == 5 and stats.dropped_zero_tokens == 2 and stats.kept == 3
    assert [r.arrival_s for r in reqs] == [0.0, 113.0, 146.0]
    assert [r.tenant for r in reqs] == ["ChatGPT", "GPT-4", "GPT-4"]
    assert reqs[1].extra == {"model": "GPT-4", "log_type": "API log"}


def test_burstgpt_release3_eight_columns(tmp_path: Path) -> None:
    path = write(
        tmp_path / "b3.csv",
        "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "10.5,s1,1.25,ChatGPT,100,20,120,Conversation log\n"
        "11.0,s2,0.5,ChatGPT,200,0,200,Conversation log\n"
        "12.0,s1,2.0,GPT-4,300,40,340,API log\n",
    )
    assert detect_format(path) == "burstgpt"
    reqs, stats = read_trace_with_stats(path, tenant_column="Session ID")
    assert stats.dropped_zero_tokens == 1
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in reqs] == [(0.0, 100, 20), (1.5, 300, 40)]
    assert [r.tenant for r in reqs] == ["s1", "s1"]
    assert reqs[0].extra == {
        "model": "ChatGPT",
        "log_type": "Conversation log",
        "session_id": "s1",
        "elapsed_s": 1.25,
    }


def test_mooncake_fixture(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "m.jsonl",
        [
            {"timestamp": 1500, "input_length": 700, "output_length": 9, "hash_ids": [0, 1]},
            {"timestamp": 500, "input_length": 300, "output_length": 4, "hash_ids": [0]},
            {"timestamp": 2500, "input_length": 5, "output_length": 0, "hash_ids": [7]},
        ],
    )
    reqs, stats = read_trace_with_stats(path)
    assert stats.fmt == "mooncake" and stats.dropped_zero_tokens == 1
    assert [(r.arrival_s, r.hash_ids) for r in reqs] == [(0.0, (0,)), (1.0, (0, 1))]


def test_generic_jsonl_fields_and_deadlines(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "w.jsonl",
        [
            {"arrival_s": 12.0, "prompt_tokens": 40, "output_tokens": 8, "tenant": "b", "note": "x"},
            {
                "arrival_s": 10.0,
                "prompt_tokens": 30,
                "output_tokens": 5,
                "prompt": "hello",
                "tenant": "a",
                "priority": 3,
                "deadline_s": 14.5,
                "hash_ids": [4, 5],
            },
        ],
    )
    reqs = read_trace(path)
    check_canonical(reqs)
    first, second = reqs
    assert (first.prompt, first.tenant, first.priority, first.hash_ids) == ("hello", "a", 3, (4, 5))
    assert first.deadline_s == pytest.approx(4.5)  # rebased with the arrivals
    assert (second.arrival_s, second.tenant, second.deadline_s, second.priority) == (2.0, "b", None, 1)
    assert second.extra == {"note": "x"}


def sharegpt_rows(n: int) -> list[dict[str, object]]:
    return [
        {
            "id": f"p{i}",
            "prompt": f"question {i}",
            "prompt_tokens_cl100k": 10 + i,
            "response_tokens_cl100k": 5 + i,
        }
        for i in range(n)
    ]


def test_sharegpt_fixture_arrivals_from_and_rate(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "s.jsonl.gz", sharegpt_rows(6), gz=True)
    assert detect_format(path) == "sharegpt"
    reqs = read_trace(path, arrivals_from=[3.0, 4.0, 3.5, 9.0])
    assert [(r.arrival_s, r.prompt) for r in reqs] == [
        (0.0, "question 0"),
        (0.5, "question 2"),
        (1.0, "question 1"),
        (6.0, "question 3"),
    ]
    assert reqs[0].extra["id"] == "p0"
    timed = read_trace(path, rate=2.0, arrival="gamma", cv=0.5, seed=1)
    assert len(timed) == 6 and timed == read_trace(path, rate=2.0, arrival="gamma", cv=0.5, seed=1)
    with pytest.raises(ValueError, match="rate= or arrivals_from="):
        read_trace(path)


def make_servegen(folder: Path) -> Path:
    """Client 0: four 600-s windows, dataset every 1200 s; client 1: trace only; client 2: one window
    whose length distributions are empty; client 3: a long bursty Gamma stretch; client 4: Weibull."""
    folder.mkdir()
    write(
        folder / "chunk-0-trace.csv",
        "0,2.0,1.0,Gamma,1.0,0.5\n600,2.0,1.0,Weibull,1.0,3.0\n1200,2.0,1.0,,0,0\n"
        "1800,2.0,1.0,Exponential,2.0,0\n2400,0,0,,0,0\n",
    )
    write(
        folder / "chunk-0-dataset.json",
        json.dumps(
            {
                "0": {"input_tokens": "{100: 1.0}", "output_tokens": "{7: 0.5, 9: 0.5}"},
                "1200": {"input_tokens": "{200: 1.0}", "output_tokens": "{3: 1.0}"},
            }
        ),
    )
    write(folder / "chunk-1-trace.csv", "0,5.0,1.0,Gamma,1.0,1.0\n")
    write(folder / "chunk-2-trace.csv", "0,5.0,1.0,Gamma,1.0,1.0\n")
    write(folder / "chunk-2-dataset.json", json.dumps({"0": {"input_tokens": "{}", "output_tokens": "{}"}}))
    for client, law, shape in ((3, "Gamma", 0.25), (4, "Weibull", 0.5)):
        rows = "".join(f"{600 * k},10.0,2.0,{law},{shape},0.01\n" for k in range(10))
        write(folder / f"chunk-{client}-trace.csv", rows)
        write(
            folder / f"chunk-{client}-dataset.json",
            json.dumps({"0": {"input_tokens": "{50: 1.0}", "output_tokens": "{5: 1.0}"}}),
        )
    return folder


def test_servegen_fixture_windows_clients_and_skips(tmp_path: Path) -> None:
    folder = make_servegen(tmp_path / "sg")
    assert detect_format(folder) == "servegen"
    reqs, stats = read_trace_with_stats(folder, clients=[0, 1, 2], duration_s=2400.0, seed=5)
    check_canonical(reqs)
    assert stats.skipped_clients == [1]
    assert stats.skipped_windows == 1
    assert {r.tenant for r in reqs} == {"client-0"}
    # windows before 1200 s use dataset window 0, later ones the 1200-s window: prompts switch once
    prompts = [r.prompt_tokens for r in reqs]
    switch = prompts.index(200)
    assert set(prompts[:switch]) == {100} and set(prompts[switch:]) == {200}
    assert {r.output_tokens for r in reqs[:switch]} == {7, 9}
    assert {r.output_tokens for r in reqs[switch:]} == {3}
    assert len(reqs) == pytest.approx(2.0 * 2400, rel=0.15)
    with pytest.raises(ValueError, match="no trace file"):
        read_trace(folder, clients=[9])


@pytest.mark.parametrize(("client", "cv"), [(3, 2.0), (4, math.sqrt(5.0))])
def test_servegen_gaps_follow_the_fitted_law(tmp_path: Path, client: int, cv: float) -> None:
    folder = make_servegen(tmp_path / "sg")
    reqs = read_trace(folder, clients=[client], duration_s=6000.0, seed=2)
    gaps = np.diff([r.arrival_s for r in reqs])
    assert len(reqs) == pytest.approx(10.0 * 6000, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.12)
    doubled = read_trace(folder, clients=[client], duration_s=6000.0, seed=2, rate_scale=2.0)
    assert len(doubled) == pytest.approx(2 * len(reqs), rel=0.08)


def test_servegen_longer_slice_extends_a_shorter_one(tmp_path: Path) -> None:
    folder = make_servegen(tmp_path / "sg")
    short = read_trace(folder, clients=[3], start_s=600.0, duration_s=300.0, seed=4)
    long = read_trace(folder, clients=[3], start_s=600.0, duration_s=1500.0, seed=4)
    assert len(long) > len(short) > 0
    # both start from the same window's first arrival, so rebasing shifts them alike
    assert [r.arrival_s for r in long[: len(short)]] == [r.arrival_s for r in short]


# --- malformed input --------------------------------------------------------------------------

MALFORMED = [
    (
        "azure",
        "bad.csv",
        AZURE_HEADER + "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:47.0,abc,3\n",
        3,
        "abc",
    ),
    ("azure", "bad.csv", AZURE_HEADER + "2023-11-16 18:15:46.6805900,374\n", 2, "expected 3 fields"),
    (
        "azure",
        "bad.csv",
        AZURE_HEADER + "\n2023-11-16 18:15:46.6805900,1,1\n16/11/2023 18:15,1,1\n",
        4,
        "timestamp",
    ),
    ("azure", "bad.csv", "TIMESTAMP,Tokens\n2023-11-16 18:15:46.6805900,1\n", 1, "header"),
    (
        "burstgpt",
        "bad.csv",
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "1,ChatGPT,10,-2,8,Conversation log\n",
        2,
        "negative",
    ),
    (
        "burstgpt",
        "bad.csv",
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "1,ChatGPT,10,2,12,Conversation log\nsoon,ChatGPT,10,2,12,Conversation log\n",
        3,
        "Timestamp",
    ),
    (
        "mooncake",
        "bad.jsonl",
        '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1,\n',
        2,
        "invalid JSON",
    ),
    (
        "mooncake",
        "bad.jsonl",
        '{"timestamp": 0, "input_length": 5, "output_length": 1}\n\n{"timestamp": 3}\n',
        3,
        "missing",
    ),
    (
        "mooncake",
        "bad.jsonl",
        '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, "a"]}\n',
        1,
        "hash_ids",
    ),
    (
        "jsonl",
        "bad.jsonl",
        '{"arrival_s": 5, "prompt_tokens": 3, "output_tokens": 2, "deadline_s": 4}\n',
        1,
        "deadline_s",
    ),
    (
        "jsonl",
        "bad.jsonl",
        '{"arrival_s": 5, "prompt_tokens": 3.5, "output_tokens": 2}\n',
        1,
        "prompt_tokens",
    ),
    ("jsonl", "bad.jsonl", "[1, 2]\n", 1, "JSON object"),
]


@pytest.mark.parametrize(("fmt", "name", "text", "line", "fragment"), MALFORMED)
def test_malformed_rows_name_file_and_line(
    tmp_path: Path, fmt: str, name: str, text: str, line: int, fragment: str
) -> None:
    path = write(tmp_path / name, text)
    with pytest.raises(TraceFormatError) as info:
        read_trace(path, fmt)
    message = str(info.value)
    assert str(path) in message and f"line {line}:" in message
    assert fragment.lower() in message.lower()
    assert isinstance(info.value, ValueError) and info.value.line == line


def test_malformed_sharegpt_and_servegen(tmp_path: Path) -> None:
    rows = sharegpt_rows(3)
    rows[2]["prompt"] = 42
    path = write_jsonl(tmp_path / "s.jsonl.gz", rows, gz=True)
    with pytest.raises(TraceFormatError, match=r"s\.jsonl\.gz, line 3: prompt must be a string"):
        read_trace(path, rate=1.0)
    folder = make_servegen(tmp_path / "sg")
    write(folder / "chunk-0-trace.csv", "0,2.0,1.0,Gamma,1.0,0.5\n600,2.0,1.0,Lognormal,1.0,3.0\n")
    with pytest.raises(TraceFormatError, match=r"chunk-0-trace\.csv, line 2: unknown distribution"):
        read_trace(folder, clients=[0])
    write(
        folder / "chunk-3-dataset.json",
        json.dumps({"0": {"input_tokens": "__import__('os')", "output_tokens": "{}"}}),
    )
    with pytest.raises(TraceFormatError, match="not a Python dict literal"):
        read_trace(folder, clients=[3])


# --- detection, options, limits ---------------------------------------------------------------


def test_detect_format_by_content(tmp_path: Path) -> None:
    cases = {
        "azure": write(tmp_path / "a.txt", AZURE_HEADER + "2024-05-10 00:00:00.009930+00:00,1,1\n"),
        "burstgpt": write(
            tmp_path / "b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        ),
        "mooncake": write_jsonl(
            tmp_path / "m.log", [{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}]
        ),
        "jsonl": write_jsonl(
            tmp_path / "w.jsonl.gz", [{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}], gz=True
        ),
        "sharegpt": write_jsonl(tmp_path / "s.jsonl", sharegpt_rows(1)),
        "sharegpt-sessions": write_jsonl(
            tmp_path / "t.jsonl", [{"id": "x", "turns": [{"role": "user", "text": "hi"}]}]
        ),
        "servegen": make_servegen(tmp_path / "sg"),
    }
    assert {fmt: detect_format(p) for fmt, p in cases.items()} == {fmt: fmt for fmt in cases}
    assert set(FORMATS) == {"auto", *cases}
    with pytest.raises(TraceFormatError, match="unrecognised header"):
        detect_format(write(tmp_path / "x.csv", "a,b,c\n1,2,3\n"))
    with pytest.raises(TraceFormatError, match="pass its folder"):
        detect_format(cases["servegen"] / "chunk-0-trace.csv")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceFormatError, match="no ServeGen"):
        detect_format(tmp_path / "empty")
    with pytest.raises(FileNotFoundError):
        detect_format(tmp_path / "missing.csv")


def test_limit_options_and_unknown_format(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = [
        {"arrival_s": float(10 - i), "prompt_tokens": 1 + i, "output_tokens": 1} for i in range(10)
    ]
    path = write_jsonl(tmp_path / "w.jsonl", rows)
    limited, stats = read_trace_with_stats(path, limit=3)
    assert isinstance(stats, ReadStats) and stats.kept == 3
    assert [r.prompt_tokens for r in limited] == [3, 2, 1]  # first three rows of the file, then sorted
    check_canonical(limited)
    assert read_trace(path, limit=0) == []
    with pytest.raises(ValueError, match="limit"):
        read_trace(path, limit=-1)
    with pytest.raises(TypeError):
        read_trace(path, rate=3.0)
    with pytest.raises(ValueError, match="unknown trace format"):
        read_trace(path, "parquet")


# --- synthetic and retime ----------------------------------------------------------------------


def test_synthetic_is_deterministic_for_a_seed() -> None:
    a = synthetic_workload(500, rate=4.0, seed=11, tenants=3, deadline_factor=20.0)
    assert a == synthetic_workload(500, rate=4.0, seed=11, tenants=3, deadline_factor=20.0)
    assert a != synthetic_workload(500, rate=4.0, seed=12, tenants=3, deadline_factor=20.0)
    check_canonical(a)


@pytest.mark.parametrize(
    ("arrival", "cv", "length_dist"),
    [("poisson", 1.0, "lognormal"), ("gamma", 3.0, "exponential"), ("gamma", 0.5, "lognormal")],
)
def test_synthetic_hits_rate_cv_and_means(arrival: str, cv: float, length_dist: str) -> None:
    n = 40_000
    reqs = synthetic_workload(
        n, rate=8.0, arrival=arrival, cv=cv, prompt_mean=600, output_mean=120, length_dist=length_dist, seed=1
    )
    arrivals = np.array([r.arrival_s for r in reqs])
    gaps = np.diff(arrivals)
    assert (n - 1) / arrivals[-1] == pytest.approx(8.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.08)
    assert np.mean([r.prompt_tokens for r in reqs]) == pytest.approx(600, rel=0.05)
    assert np.mean([r.output_tokens for r in reqs]) == pytest.approx(120, rel=0.05)


def test_synthetic_tenants_and_deadlines() -> None:
    reqs = synthetic_workload(
        4_000, rate=2.0, tenants=4, deadline_factor=10.0, length_dist="constant", seed=3
    )
    counts = {t: sum(r.tenant == t for r in reqs) for t in {r.tenant for r in reqs}}
    assert set(counts) == {f"tenant-{k}" for k in range(4)}
    assert min(counts.values()) > 0.2 * len(reqs)
    r = reqs[17]
    assert (r.prompt_tokens, r.output_tokens) == (512, 256)
    slack = 10.0 * (PREFILL_S_PER_TOKEN * 512 + DECODE_S_PER_TOKEN * 256)
    assert r.deadline_s == pytest.approx(r.arrival_s + slack)
    assert {x.tenant for x in synthetic_workload(5, rate=1.0)} == {"default"}
    with pytest.raises(ValueError):
        synthetic_workload(5, rate=0.0)
    with pytest.raises(ValueError):
        synthetic_workload(5, rate=1.0, arrival="uniform")


def test_retime_keeps_order_lengths_and_slack() -> None:
    base = synthetic_workload(20_000, rate=1.0, deadline_factor=5.0, seed=9)
    fast = retime(base, rate=50.0, arrival="gamma", cv=2.0, seed=1)
    assert [(r.rid, r.prompt_tokens, r.output_tokens) for r in fast] == [
        (r.rid, r.prompt_tokens, r.output_tokens) for r in base
    ]
    check_canonical(fast)
    assert (len(fast) - 1) / fast[-1].arrival_s == pytest.approx(50.0, rel=0.05)
    for old, new in zip(base[:100], fast[:100], strict=True):
        assert old.deadline_s is not None and new.deadline_s is not None
        assert new.deadline_s - new.arrival_s == pytest.approx(old.deadline_s - old.arrival_s)
    assert fast == retime(base, rate=50.0, arrival="gamma", cv=2.0, seed=1)
    assert retime(list(reversed(base)), rate=50.0, seed=1) == retime(base, rate=50.0, seed=1)


SHARED_LOOP = [
    (
        "azure",
        "a.csv",
        AZURE_HEADER + "2023-11-16 18:15:46.1,5,3\n2023-11-16 18:15:47.1,5,0\n"
        "2023-11-16 18:15:48.1,6,4\n2023-11-16 18:15:49.1,x,4\n",
        5,
    ),
    (
        "burstgpt",
        "b.csv",
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "1,m,5,3,8,t\n2,m,5,0,5,t\n3,m,6,4,10,t\n4,m,6\n",
        5,
    ),
    (
        "mooncake",
        "m.jsonl",
        '{"timestamp": 1, "input_length": 5, "output_length": 3}\n'
        '{"timestamp": 2, "input_length": 5, "output_length": 0}\n'
        '{"timestamp": 3, "input_length": 6, "output_length": 4}\n{"timestamp": 4}\n',
        4,
    ),
    (
        "jsonl",
        "w.jsonl",
        '{"arrival_s": 1, "prompt_tokens": 5, "output_tokens": 3}\n'
        '{"arrival_s": 2, "prompt_tokens": 0, "output_tokens": 3}\n'
        '{"arrival_s": 3, "prompt_tokens": 6, "output_tokens": 4}\n{"arrival_s": 4}\n',
        4,
    ),
]


@pytest.mark.parametrize(("fmt", "name", "text", "bad_line"), SHARED_LOOP)
def test_every_reader_counts_drops_and_stops_the_same_way(
    tmp_path: Path, fmt: str, name: str, text: str, bad_line: int
) -> None:
    """The shared read loop: a zero-token row is counted and dropped without using up the limit, and
    reading stops at the limit, so a malformed row after the kept ones is never checked."""
    path = write(tmp_path / name, text)
    kept, stats = read_trace_with_stats(path, fmt, limit=2)
    assert [r.prompt_tokens for r in kept] == [5, 6]
    assert (stats.rows, stats.dropped_zero_tokens, stats.kept) == (3, 1, 2)
    with pytest.raises(TraceFormatError) as info:
        read_trace(path, fmt, limit=3)
    assert info.value.line == bad_line


# --- multi-turn sessions (issue 36) ------------------------------------------------------------------
def _conversations(path: Path) -> Path:
    convs = [
        {"id": "c1", "turns": [
            {"role": "user", "text": "Plan a trip to Basel."},
            {"role": "assistant", "text": "Take the train from Zurich; it is an hour. " * 5},
            {"role": "user", "text": "And back on Sunday?"},
            {"role": "assistant", "text": "Trains run every half hour on Sundays."},
            {"role": "user", "text": "Thanks!"},
        ]},  # the last user turn has no reply: not a request
        {"id": "c2", "turns": [{"role": "user", "text": "Hello"}, {"role": "assistant", "text": "Hi."}]},
        {"id": "c3", "turns": [{"role": "assistant", "text": "nobody asked"}]},
    ]  # fmt: skip
    out = path / "conv.jsonl.gz"
    with gzip.open(out, "wt") as f:
        for c in convs:
            f.write(json.dumps(c) + "\n")
    return out


def test_sessions_replay_each_answered_turn_with_its_whole_history(tmp_path: Path) -> None:
    path = _conversations(tmp_path)
    assert detect_format(path) == "sharegpt-sessions"
    reqs = read_trace(path, rate=1.0, seed=3, think_s=0.0, decode_s_per_token=0.01)
    by_session: dict[str, list[TraceRequest]] = {}
    for r in reqs:
        by_session.setdefault(str(r.extra["session"]), []).append(r)
    assert {k: len(v) for k, v in by_session.items()} == {"c1": 2, "c2": 1}
    t1, t2 = by_session["c1"]
    assert t1.prompt is not None and t2.prompt is not None
    assert t2.prompt.startswith(t1.prompt) and "assistant: Take the train" in t2.prompt
    assert t2.prompt_tokens > t1.prompt_tokens
    assert t1.output_tokens > 40 and t2.output_tokens < 15  # the real replies' lengths
    assert t2.arrival_s - t1.arrival_s == pytest.approx(0.01 * t1.output_tokens)  # read, no think time
    assert [m["role"] for m in t2.extra["messages"]] == ["user", "assistant", "user"]  # type: ignore[index]


def test_sessions_leave_out_conversations_a_shipped_part_learned_from(tmp_path: Path) -> None:
    from sagegate.core.request import prompt_digest

    path = _conversations(tmp_path)
    reqs = read_trace(path, "sharegpt-sessions", rate=1.0, exclude=frozenset({prompt_digest("Hello")}))
    assert {r.extra["session"] for r in reqs} == {"c1"}
    with pytest.raises(ValueError, match="exactly one of"):
        read_trace(path, "sharegpt-sessions")


def test_a_sessions_turn_is_replayed_as_its_messages() -> None:
    from sagegate.loadgen.client import ReplayConfig, request_body

    history = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    req = TraceRequest(0.0, 9, 3, prompt="user: a\nassistant: b\nuser: c", extra={"messages": history})
    body = json.loads(request_body(req, ReplayConfig("http://x", api="chat"), "m"))
    assert body["messages"] == history
