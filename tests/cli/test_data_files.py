"""The data that ships with the package and how a file is found: shared, else fetched, else shipped.

These tests need no shared data folder: they point ``SAGEGATE_DATA`` and ``SAGEGATE_FETCH_DIR`` at
temporary folders. The one that re-draws the subset needs the full pairs file and skips without it.
"""

from __future__ import annotations

import gzip
import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import data_path

from sagegate.loadgen.data import (
    AZURE_CODE,
    AZURE_CONV,
    SHAREGPT,
    SHAREGPT_SESSIONS,
    SHIPPED,
    SHIPPED_ROOT,
    DataFile,
    find_data,
    shipped_file,
)
from sagegate.loadgen.readers import read_trace

REPO = Path(__file__).resolve().parents[2]
UPSTREAM_SHA256 = {
    AZURE_CONV: "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
    AZURE_CODE: "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
}


@pytest.fixture
def nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Empty shared and fetched folders: only the shipped copies can be found."""
    monkeypatch.setenv("SAGEGATE_DATA", str(tmp_path / "shared"))
    monkeypatch.setenv("SAGEGATE_FETCH_DIR", str(tmp_path / "fetched"))
    return tmp_path


def test_without_shared_or_fetched_data_the_shipped_copy_is_used(nowhere: Path) -> None:
    for parts in (AZURE_CONV, AZURE_CODE, SHAREGPT):
        found = find_data(*parts)
        assert found is not None and found.origin == "shipped" and found.path == shipped_file(*parts)
        assert found.path.is_file() and "shipped copy" in found.describe()
    assert "4,000-pair subset" in find_data(*SHAREGPT).describe()  # type: ignore[union-attr]
    assert find_data("mooncake", "synthetic_trace.jsonl") is None  # nothing ships for it


def test_shared_wins_over_fetched_which_wins_over_shipped(nowhere: Path) -> None:
    fetched = nowhere / "fetched" / AZURE_CONV[0] / AZURE_CONV[1]
    fetched.parent.mkdir(parents=True)
    fetched.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    assert find_data(*AZURE_CONV) == DataFile(fetched, "fetched")
    shared = nowhere / "shared" / AZURE_CONV[0] / AZURE_CONV[1]
    shared.parent.mkdir(parents=True)
    shared.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    found = find_data(*AZURE_CONV)
    assert found is not None and found.origin == "shared" and found.path == shared


def test_the_shipped_azure_traces_are_the_upstream_bytes() -> None:
    for parts, sha in UPSTREAM_SHA256.items():
        path = shipped_file(*parts)
        assert path is not None
        assert hashlib.sha256(gzip.decompress(path.read_bytes())).hexdigest() == sha
    assert len(read_trace(shipped_file(*AZURE_CONV), "auto")) == 19_366  # type: ignore[arg-type]
    assert len(read_trace(shipped_file(*AZURE_CODE), "azure")) == 8_819  # type: ignore[arg-type]


def test_the_shipped_pairs_read_as_sharegpt_and_feed_the_paired_source() -> None:
    from sagegate.study.textsource import split_pairs

    path = shipped_file(*SHAREGPT)
    assert path is not None
    rows = read_trace(path, "sharegpt", rate=1.0)
    assert len(rows) == 4000 and len(read_trace(path, "auto", rate=1.0)) == 4000
    assert all(r.prompt and r.prompt_tokens > 0 and r.output_tokens > 0 for r in rows)
    assert len({r.prompt for r in rows}) == 4000 and len({r.extra["id"] for r in rows}) == 4000
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        assert '"response":' not in fh.read()
    held, pool = split_pairs(path, 3000, seed=0, name="shipped")
    assert len(held) == 3000 and len(pool) == 1000
    assert not {r.prompt for r in held} & {r.prompt for r in pool}


def test_the_shipped_conversations_read_as_sessions_none_a_predictor_learned_from() -> None:
    from sagegate.core.request import prompt_digest
    from sagegate.predictor.learned import learned_prompts

    path = shipped_file(*SHAREGPT_SESSIONS)
    assert path is not None
    turns = read_trace(path, "sharegpt-sessions", rate=1.0)
    sessions = {r.extra["session"] for r in turns}
    assert len(sessions) == 600 and len(turns) > 2 * 600  # multi-turn: more turns than conversations
    firsts = [r for r in turns if r.extra["turn"] == 0]
    assert not {prompt_digest(r.extra["messages"][0]["content"]) for r in firsts} & learned_prompts()  # type: ignore[index]


@pytest.mark.heavy
def test_the_shipped_subset_is_the_documented_draw() -> None:
    """Re-drawn from the full pairs file by the committed script: the same 4,000 pairs."""
    data_path(*SHAREGPT)
    data_path(*SHAREGPT_SESSIONS)
    out = subprocess.run(
        [sys.executable, "-m", "tools.make_shipped_data", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("ok  ") == len(SHIPPED)


def test_package_data_covers_every_shipped_file() -> None:
    """What ``pip install .`` copies (pyproject's package-data globs) includes every file of the
    shipped folder and the fetch catalogue."""
    import tomllib

    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    base = REPO / "sagegate" / "loadgen"
    covered = {p for g in globs["sagegate.loadgen"] for p in base.glob(g)}
    files = {p for p in SHIPPED_ROOT.rglob("*") if p.is_file()} | {base / "fetch_catalog.json"}
    assert files <= covered, sorted(str(p) for p in files - covered)
    # the whole shipped data stays small: the first-turn pairs (1.5 MB) and the conversations (1.2 MB)
    assert sum(p.stat().st_size for p in files) < 3_200_000
    assert {"DATA.md", "LICENSE-CC-BY-4.0.txt", "LICENSE-Apache-2.0.txt"} <= {p.name for p in files}


@pytest.mark.heavy
def test_a_broken_command_module_fails_the_cli_loudly() -> None:
    """A subcommand whose module cannot be imported must not vanish from the CLI silently (a fresh
    interpreter: in this one the module is already imported)."""
    code = "import sys; sys.modules['sagegate.cmd_study'] = None; import sagegate.cli"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode != 0 and "import of sagegate.cmd_study halted" in out.stderr, out.stderr
