"""The identity store's disk full: an upload is refused with 507 and the reason, nothing half-written stays, the
refusal is counted, and the identities and channels already on that disk are still served.

The full disk is a real one: a small tmpfs mounted over the store (root, or a user allowed to mount, only)."""

from __future__ import annotations

import errno
import logging
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.server.harness import server_settings, start_server, upload

DISK_BYTES = 8 * 1024 * 1024
# Room left when the disk is "full": enough for the upload to start writing its files, not to finish them.
LEFT_BYTES = 48 * 1024


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES},mode=0755", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill (needs root): {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(disk: Path, leave: int) -> Path:
    """Fill `disk` up, then give back `leave` bytes: the next writer runs out part way."""
    filler = disk / "filler"
    chunk = b"\0" * (64 * 1024)
    with filler.open("wb") as f:
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    os.truncate(filler, max(0, filler.stat().st_size - leave))
    return filler


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.slow
def test_a_full_disk_refuses_the_upload_with_507_and_keeps_what_was_stored(
    small_disk: Path,
    pipeline_factory: Callable[[PipelineSettings], FramePipeline],
    tom_png: bytes,
    caplog: pytest.LogCaptureFixture,
) -> None:
    identities, channels = small_disk / "identities", small_disk / "channels"
    settings = server_settings(identities, channel_dir=channels)
    with caplog.at_level(logging.ERROR), start_server(settings, pipeline_factory) as server:
        base = server.base_url
        kept = upload(base, tom_png, name="kept")
        assert kept.status_code == 201, kept.text
        kept_id = kept.json()["id"]
        channel = httpx.post(f"{base}/v1/channels", json={"name": "kept-channel"}, timeout=30)
        assert channel.status_code == 201, channel.text
        thumbnail = httpx.get(f"{base}/v1/identities/{kept_id}/thumbnail", timeout=30)
        assert thumbnail.status_code == 200
        before = files_under(identities), files_under(channels)

        fill(small_disk, LEFT_BYTES)
        for _ in range(2):  # the second one with even less room: whatever the first left
            refused = upload(base, tom_png, name="too-much")
            assert refused.status_code == 507, refused.text
            assert refused.json()["detail"] == "the identity store's disk is full: no identity was stored"
            assert (files_under(identities), files_under(channels)) == before

        listed = httpx.get(f"{base}/v1/identities", timeout=30).json()["identities"]
        assert [i["id"] for i in listed] == [kept_id]
        assert httpx.get(f"{base}/v1/identities/{kept_id}/thumbnail", timeout=30).content == thumbnail.content
        assert httpx.get(f"{base}/v1/identities/{kept_id}", timeout=30).status_code == 200
        assert httpx.get(f"{base}/v1/channels/kept-channel", timeout=30).status_code == 200
        metrics = httpx.get(f"{base}/metrics", timeout=30).text
        assert 'swapcast_store_full_total{store="identities"} 2.0' in metrics
        assert f"identity upload refused: no room on the disk of {identities}" in caplog.text

        (small_disk / "filler").unlink()  # room again: uploads work again
        again = upload(base, tom_png, name="after")
        assert again.status_code == 201, again.text
