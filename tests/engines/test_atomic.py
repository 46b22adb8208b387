"""engines.atomic: files and folders appear whole, flushed to disk, with the permissions of a new file."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from engines.atomic import (
    atomic_path,
    new_file_mode,
    rename_durably,
    replace_dir,
    replace_file,
    write_bytes_atomic,
    write_text_atomic,
)
from engines.precision.int8 import CalibrationSet


@pytest.fixture
def umask_022() -> Iterator[None]:
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """What reaches the disk, in order: ("fsync", path of the flushed file or folder), ("replace", dst)."""
    seen: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        seen.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        seen.append(("replace", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return seen


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_new_file_mode_is_what_open_gives_a_new_file(tmp_path: Path) -> None:
    for umask in (0o022, 0o027, 0o077):
        previous = os.umask(umask)
        try:
            (tmp_path / f"plain-{umask:o}").write_bytes(b"x")
            assert new_file_mode() == mode(tmp_path / f"plain-{umask:o}") == 0o666 & ~umask
        finally:
            os.umask(previous)


def test_a_write_flushes_the_file_before_the_rename_and_the_folder_after(
    tmp_path: Path, events: list[tuple[str, str]]
) -> None:
    dst = tmp_path / "models" / "m.onnx"
    write_bytes_atomic(dst, b"weights")
    assert dst.read_bytes() == b"weights"
    kinds = [kind for kind, _ in events]
    assert kinds == ["fsync", "replace", "fsync"]
    flushed_file, renamed, flushed_folder = (where for _, where in events)
    assert Path(flushed_file).parent == dst.parent and Path(flushed_file).name.startswith(".m.onnx.")
    assert renamed == str(dst)
    assert flushed_folder == str(dst.parent)


@pytest.mark.usefixtures("umask_022")
def test_written_files_are_readable_by_others_like_a_plain_write(tmp_path: Path) -> None:
    assert mode(write_text_atomic(tmp_path / "record.json", "{}")) == 0o644
    with atomic_path(tmp_path / "engine.bin") as tmp:
        os.chmod(tmp, 0o600)  # whatever the writer left
        tmp.write_bytes(b"engine")
    assert mode(tmp_path / "engine.bin") == 0o644


@pytest.mark.usefixtures("umask_022")
def test_a_private_file_is_private_before_it_has_its_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dst = tmp_path / "keys.json"
    modes_at_rename: list[int] = []
    real_replace = os.replace

    def replace(src: str, target: str) -> None:
        modes_at_rename.append(mode(Path(src)))
        real_replace(src, target)

    monkeypatch.setattr(os, "replace", replace)
    with atomic_path(dst, mode=0o600) as tmp:
        assert mode(tmp) == 0o600
        tmp.write_text("{}")
    assert modes_at_rename == [0o600] and mode(dst) == 0o600


def test_permissions_follow_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0o027)
    try:
        assert mode(write_bytes_atomic(tmp_path / "m.onnx", b"x")) == 0o640
    finally:
        os.umask(previous)


@pytest.mark.usefixtures("umask_022")
def test_calibration_caches_are_not_owner_only(tmp_path: Path) -> None:
    calibration = CalibrationSet("m", ({"input": np.zeros((1, 3, 4, 4), np.float32)},), "test")
    saved = calibration.save(tmp_path / "m.calibration.npz")
    assert mode(saved) == 0o644
    assert CalibrationSet.load(saved).digest() == calibration.digest()
    assert [p.name for p in tmp_path.iterdir()] == ["m.calibration.npz"]


@pytest.mark.usefixtures("umask_022")
def test_a_finished_file_moved_into_place_gets_ordinary_permissions(
    tmp_path: Path, events: list[tuple[str, str]]
) -> None:
    fd, name = tempfile.mkstemp(dir=tmp_path)  # mkstemp makes it 0600
    os.write(fd, b"downloaded")
    os.close(fd)
    dst = replace_file(Path(name), tmp_path / "m.onnx")
    assert dst.read_bytes() == b"downloaded" and mode(dst) == 0o644
    assert events == [("fsync", name), ("replace", str(dst)), ("fsync", str(tmp_path))]


def test_a_failed_write_leaves_nothing_and_keeps_the_old_file(tmp_path: Path) -> None:
    dst = tmp_path / "m.onnx"
    with pytest.raises(RuntimeError, match="writer failed"), atomic_path(dst) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("writer failed")
    assert list(tmp_path.iterdir()) == []

    dst.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_path(dst, suffix=".npz") as tmp:
        assert tmp.name.endswith(".npz")
        tmp.write_bytes(b"new, half written")
        raise RuntimeError("writer failed")
    assert dst.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]


def test_a_staged_folder_is_flushed_whole_before_it_appears(tmp_path: Path, events: list[tuple[str, str]]) -> None:
    staging = tmp_path / ".tmp-abc"
    (staging / "prepared").mkdir(parents=True)
    (staging / "meta.json").write_text("{}")
    (staging / "prepared" / "latent.npy").write_bytes(b"latent")
    dst = replace_dir(staging, tmp_path / "identity")
    assert sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*")) == [
        "meta.json",
        "prepared",
        "prepared/latent.npy",
    ]
    rename_at = events.index(("replace", str(dst)))
    flushed_before = {where for _, where in events[:rename_at]}
    assert {
        str(staging / "meta.json"),
        str(staging / "prepared" / "latent.npy"),
        str(staging / "prepared"),
        str(staging),
    } <= flushed_before
    assert events[rename_at + 1 :] == [("fsync", str(tmp_path))]


def test_rename_durably_flushes_both_folders(tmp_path: Path, events: list[tuple[str, str]]) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x").mkdir()
    rename_durably(tmp_path / "a" / "x", tmp_path / "b" / "x")
    assert (tmp_path / "b" / "x").is_dir() and not (tmp_path / "a" / "x").exists()
    assert events == [
        ("replace", str(tmp_path / "b" / "x")),
        ("fsync", str(tmp_path / "b")),
        ("fsync", str(tmp_path / "a")),
    ]
