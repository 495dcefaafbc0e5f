"""``sagegate data fetch`` against a real HTTP server on loopback serving a fixture: a full fetch, a
connection cut mid-body and resumed with ``Range``, a server that ignores ranges, a wrong sha256
refused, and the offline message. The machine's network is closed: nothing here leaves 127.0.0.1."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from sagegate.cmd_data import data_app
from sagegate.harness.procs import free_port
from sagegate.loadgen.fetch import FetchError, OfflineError, RemoteFile, fetch_file, hashes, load_catalog

FIXTURE = bytes(range(256)) * 800  # 204,800 bytes
SHA = hashlib.sha256(FIXTURE).hexdigest()


@dataclass
class Served:
    """The fixture server's knobs and what it saw."""

    cut_after: int | None = None  # the first full response stops after this many bytes
    ranges: bool = True
    requests: list[str | None] = field(default_factory=list)  # each request's Range header

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/files/fixture.bin"

    port: int = 0


def _handler(state: Served) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            if self.path != "/files/fixture.bin":
                self.send_error(404)
                return
            rng = self.headers.get("Range")
            state.requests.append(rng)
            start = int(rng.split("=")[1].rstrip("-")) if rng and state.ranges else 0
            body = FIXTURE[start:]
            self.send_response(206 if start else 200)
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(FIXTURE) - 1}/{len(FIXTURE)}")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if state.cut_after is not None and not start:
                cut, state.cut_after = state.cut_after, None
                self.wfile.write(body[:cut])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

    return Handler


@pytest.fixture
def served() -> Iterator[Served]:
    state = Served()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


def _file(url: str, sha256: str | None = SHA, size: int | None = len(FIXTURE)) -> RemoteFile:
    return RemoteFile("sets/fixture.bin", url, size=size, sha256=sha256)


def test_full_fetch_is_verified_then_kept(served: Served, tmp_path: Path) -> None:
    seen: list[tuple[int, int | None]] = []
    got = fetch_file(_file(served.url), tmp_path, progress=lambda d, t: seen.append((d, t)))
    assert got.status == "downloaded" and got.sha256 == SHA and got.checked == "sha256"
    assert (tmp_path / "sets/fixture.bin").read_bytes() == FIXTURE
    assert not (tmp_path / "sets/fixture.bin.part").exists()
    assert seen[-1] == (len(FIXTURE), len(FIXTURE))
    again = fetch_file(_file(served.url), tmp_path)
    assert again.status == "present" and served.requests == [None]  # no second download


def test_a_cut_connection_resumes_with_range(served: Served, tmp_path: Path) -> None:
    served.cut_after = 70_000
    got = fetch_file(_file(served.url), tmp_path)
    assert got.status == "downloaded"
    assert (tmp_path / "sets/fixture.bin").read_bytes() == FIXTURE
    assert served.requests[0] is None and served.requests[1] == "bytes=70000-"


def test_an_interrupted_run_is_resumed_by_the_next(served: Served, tmp_path: Path) -> None:
    served.cut_after = 50_000
    with pytest.raises(FetchError, match=r"interrupted after 50,000 bytes.*resume"):
        fetch_file(_file(served.url), tmp_path, attempts=1)
    assert (tmp_path / "sets/fixture.bin.part").stat().st_size == 50_000
    assert not (tmp_path / "sets/fixture.bin").exists()
    fetch_file(_file(served.url), tmp_path, attempts=1)
    assert served.requests[-1] == "bytes=50000-"
    assert (tmp_path / "sets/fixture.bin").read_bytes() == FIXTURE


def test_a_server_ignoring_ranges_restarts_the_file(served: Served, tmp_path: Path) -> None:
    served.ranges = False
    part = tmp_path / "sets/fixture.bin.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"\0" * 1000)  # a stale part: appending the full body to it would corrupt it
    fetch_file(_file(served.url), tmp_path)
    assert served.requests == ["bytes=1000-"]
    assert (tmp_path / "sets/fixture.bin").read_bytes() == FIXTURE


def test_a_wrong_sha256_is_refused_and_the_part_removed(served: Served, tmp_path: Path) -> None:
    with pytest.raises(FetchError, match=rf"refused.*sha256 {SHA}, expected 0{{64}}"):
        fetch_file(_file(served.url, sha256="0" * 64), tmp_path)
    assert not any(tmp_path.rglob("fixture.bin*"))


def test_a_present_file_with_the_wrong_bytes_is_not_kept_silently(served: Served, tmp_path: Path) -> None:
    dest = tmp_path / "sets/fixture.bin"
    dest.parent.mkdir(parents=True)
    dest.write_bytes(FIXTURE[:-1] + b"x")
    with pytest.raises(FetchError, match="exists but has sha256"):
        fetch_file(_file(served.url, size=None), tmp_path)


def test_an_unpinned_file_reports_its_hash(served: Served, tmp_path: Path) -> None:
    got = fetch_file(_file(served.url, sha256=None, size=None), tmp_path)
    assert got.checked == "unpinned" and got.sha256 == SHA


def test_a_git_blob_pin_is_checked(served: Served, tmp_path: Path) -> None:
    blob = hashlib.sha1(b"blob %d\0" % len(FIXTURE) + FIXTURE).hexdigest()
    ok = RemoteFile("sets/fixture.bin", served.url, git_blob=blob)
    assert fetch_file(ok, tmp_path).checked == "git blob"
    assert hashes(tmp_path / "sets/fixture.bin") == (SHA, blob)
    bad = RemoteFile("other/fixture.bin", served.url, git_blob="1" * 40)
    with pytest.raises(FetchError, match="git blob id"):
        fetch_file(bad, tmp_path)


def test_offline_names_the_url_and_the_manual_step(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/files/fixture.bin"  # nothing listens there
    with pytest.raises(OfflineError) as err:
        fetch_file(_file(url), tmp_path)
    text = str(err.value)
    assert url in text and "curl -L -C -" in text and str(tmp_path / "sets/fixture.bin") in text


def _catalog(tmp_path: Path, url: str, sha256: str = SHA) -> Path:
    path = tmp_path / "catalog.json"
    files = [{"path": "sets/fixture.bin", "url": url, "size": len(FIXTURE), "sha256": sha256}]
    ds = {"about": "a fixture", "licence": "CC0", "source": "this test", "files": files}
    path.write_text(json.dumps({"fixture": ds}))
    return path


def _app() -> typer.Typer:
    root = typer.Typer()
    root.add_typer(data_app, name="data")
    return root


def test_cli_fetch_then_list(served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAGEGATE_FETCH_DIR", str(tmp_path / "fetched"))
    cat = _catalog(tmp_path, served.url)
    res = CliRunner().invoke(_app(), ["data", "fetch", "fixture", "--catalog", str(cat)])
    assert res.exit_code == 0, res.output
    assert f"sha256 ok; sha256 {SHA}" in res.output
    assert (tmp_path / "fetched/sets/fixture.bin").read_bytes() == FIXTURE
    listed = CliRunner().invoke(_app(), ["data", "list", "--catalog", str(cat)])
    assert listed.exit_code == 0, listed.output
    row = next(line for line in listed.output.splitlines() if line.strip().startswith("fixture"))
    assert row.split()[1:4] == ["1", "-", "1/1"]  # files, shared, fetched
    assert "the main job reads:" in listed.output


def test_cli_refuses_a_bad_hash_and_explains_offline(tmp_path: Path, served: Served) -> None:
    cat = _catalog(tmp_path, served.url, "0" * 64)
    bad = CliRunner().invoke(
        _app(), ["data", "fetch", "fixture", "--catalog", str(cat), "--dest", str(tmp_path)]
    )
    assert bad.exit_code == 1 and "refused" in bad.output
    url = f"http://127.0.0.1:{free_port()}/x"
    off = CliRunner().invoke(
        _app(),
        ["data", "fetch", "fixture", "--catalog", str(_catalog(tmp_path, url)), "--dest", str(tmp_path)],
    )
    assert off.exit_code == 1 and url in off.output and "sagegate data fetch fixture" in off.output
    unknown = CliRunner().invoke(_app(), ["data", "fetch", "nope"])
    assert unknown.exit_code == 2 and "azure2023" in unknown.output


def test_the_builtin_catalogue_is_sound() -> None:
    """Every set has files with a GitHub-raw URL at a full commit, a Hugging Face or Azure/GitHub
    release URL; pinned files have a 64-hex sha256; paths are relative and unique."""
    sets = load_catalog()
    assert {"azure2023", "azure2024", "mooncake", "servegen", "burstgpt", "sharegpt-v3"} <= set(sets)
    assert "conversation_trace" not in json.dumps([f.url for s in sets.values() for f in s.files])
    paths = [f.path for s in sets.values() for f in s.files]
    assert len(paths) == len(set(paths)) and not any(p.startswith("/") or ".." in p for p in paths)
    for ds in sets.values():
        for f in ds.files:
            assert f.url.startswith("https://")
            if f.url.startswith("https://raw.githubusercontent.com/"):
                commit = f.url.split("/")[5]
                assert len(commit) == 40, f.url
            if f.sha256:
                assert len(f.sha256) == 64 and f.size
    assert all(f.pin == "sha256" for f in sets["azure2023"].files + sets["mooncake"].files)
