"""Downloading the larger public sets: resumable, verified, and plain about being offline.

A file is streamed into ``<dest>.part``; a cut connection resumes from the part's length with an HTTP
``Range`` request (here, and on the next run), a server that ignores ranges restarts it. Only a part
whose sha256 (and upstream git blob id, where the catalogue pins one) matches is renamed into place; a
mismatch deletes the part, so a bad byte can never be resumed into a "verified" file. Unpinned files
(no byte-identical copy was at hand to hash) are accepted with their computed sha256 reported.

The catalogue (``loadgen/fetch_catalog.json``, written by ``tools/pin_fetch_catalog.py``) names
each set's files in the shared folder's layout, so a fetched set is found by ``loadgen.data.find_data``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

CATALOG = Path(__file__).resolve().with_name("fetch_catalog.json")

Progress = Callable[[int, int | None], None]
"""Called with (bytes in the part so far, expected total or None) as a download proceeds."""


class FetchError(RuntimeError):
    """A download that could not be completed or verified; the message says what to do."""


class OfflineError(FetchError):
    """The upstream host could not be reached at all (so neither will the set's other files)."""


@dataclass(frozen=True, slots=True)
class RemoteFile:
    path: str  # relative, in the shared folder's layout
    url: str
    size: int | None = None
    sha256: str | None = None
    git_blob: str | None = None

    @property
    def pin(self) -> str:
        """How the file is checked: ``sha256``, ``git blob`` or ``unpinned``."""
        return "sha256" if self.sha256 else "git blob" if self.git_blob else "unpinned"


@dataclass(frozen=True, slots=True)
class Dataset:
    name: str
    about: str
    licence: str
    source: str
    files: tuple[RemoteFile, ...]
    cite: str = ""


@dataclass(frozen=True, slots=True)
class Fetched:
    path: Path
    sha256: str
    status: Literal["downloaded", "present"]
    checked: str  # the RemoteFile's pin


def load_catalog(path: Path | None = None) -> dict[str, Dataset]:
    raw: dict[str, Any] = json.loads((path or CATALOG).read_text())
    out = {}
    for name, ds in raw.items():
        files = tuple(RemoteFile(**f) for f in ds["files"])
        out[name] = Dataset(name, ds["about"], ds["licence"], ds["source"], files, ds.get("cite", ""))
    return out


def hashes(path: Path) -> tuple[str, str]:
    """(sha256, git blob id) of a file, in one pass."""
    sha, blob = hashlib.sha256(), hashlib.sha1()
    blob.update(b"blob %d\0" % path.stat().st_size)
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            sha.update(chunk)
            blob.update(chunk)
    return sha.hexdigest(), blob.hexdigest()


def _mismatch(f: RemoteFile, path: Path) -> tuple[str | None, str]:
    """(what differs or None, the computed sha256)."""
    size = path.stat().st_size
    sha, blob = hashes(path)
    if f.size is not None and size != f.size:
        return f"size {size:,} bytes, expected {f.size:,}", sha
    if f.sha256 and sha != f.sha256:
        return f"sha256 {sha}, expected {f.sha256}", sha
    if f.git_blob and blob != f.git_blob:
        return f"git blob id {blob}, expected {f.git_blob}", sha
    return None, sha


def offline_message(f: RemoteFile, dest: Path, exc: Exception) -> str:
    return (
        f"cannot reach {f.url} ({type(exc).__name__}: {exc}); is this machine offline?\n"
        f"Download it by hand to {dest}, e.g.\n"
        f"  curl -L -C - --create-dirs -o {dest} {f.url}\n"
        "then run the same fetch again: it checks the file and keeps it."
    )


def _download(client: httpx.Client, f: RemoteFile, part: Path, progress: Progress | None) -> None:
    """One request: append to ``part`` from its current length (restart if ranges are ignored)."""
    offset = part.stat().st_size if part.exists() else 0
    # identity: the Range offsets count the bytes as stored, not a compressed transfer of them
    headers = {"Accept-Encoding": "identity"} | ({"Range": f"bytes={offset}-"} if offset else {})
    with client.stream("GET", f.url, headers=headers) as resp:
        if resp.status_code == 416 and offset:  # nothing left to send: the part is whole (or wrong)
            return
        if resp.status_code == 206 and resp.headers.get("content-range", "").startswith(f"bytes {offset}-"):
            mode = "ab"
        elif resp.status_code == 200:
            mode, offset = "wb", 0
        else:
            raise FetchError(f"{f.url}: HTTP {resp.status_code} {resp.reason_phrase}")
        length = resp.headers.get("content-length")
        total = offset + int(length) if length is not None else f.size
        done = offset
        if progress:
            progress(done, total)
        with part.open(mode) as out:
            for chunk in resp.iter_raw():  # as received: a cut loses none of what arrived
                out.write(chunk)
                done += len(chunk)
                if progress:
                    progress(done, total)


def fetch_file(
    f: RemoteFile,
    root: Path,
    *,
    progress: Progress | None = None,
    attempts: int = 3,
    timeout: float = 30.0,
) -> Fetched:
    """``f`` under ``root``: kept if already there and sound, else downloaded (resuming) and checked."""
    dest = root / f.path
    if dest.exists():
        bad, sha = _mismatch(f, dest)
        if bad:
            raise FetchError(f"{dest} exists but has {bad}: delete it to fetch it again")
        return Fetched(dest, sha, "present", f.pin)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    with httpx.Client(follow_redirects=True, timeout=timeout) as client:
        for attempt in range(1, attempts + 1):
            try:
                _download(client, f, part, progress)
                break
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                raise OfflineError(offline_message(f, dest, exc)) from None
            except httpx.TransportError as exc:  # cut mid-body: resume from the part
                if attempt == attempts:
                    got = part.stat().st_size if part.exists() else 0
                    raise FetchError(
                        f"{f.url}: interrupted after {got:,} bytes ({type(exc).__name__}: {exc}); "
                        f"run the same fetch again to resume from {part}"
                    ) from None
    bad, sha = _mismatch(f, part)
    if bad:
        part.unlink()
        raise FetchError(f"{f.url}: refused, the download has {bad} (the partial file was removed)")
    os.replace(part, dest)
    return Fetched(dest, sha, "downloaded", f.pin)
