"""A store that survives damage: hand-damaged identities are found at start-up, listed in the log and in
/v1/server, left out of the list, refused with 409 and a reason, and can still be deleted."""

import json
import logging
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.identity.store import IdentityUnreadable, prepared_file_name
from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.server.harness import server_settings, start_server, upload


def _meta(directory: Path, **changes: object) -> None:
    path = directory / "meta.json"
    meta = json.loads(path.read_text())
    meta.update(changes)
    path.write_text(json.dumps(meta))


def _prepared(directory: Path) -> Path:
    return directory / "prepared" / prepared_file_name("classic:256")


DAMAGE: dict[str, Callable[[Path], None]] = {
    "width-abc": lambda d: _meta(d, width="abc"),
    "faces-null": lambda d: _meta(d, faces=None),
    "face-index-out-of-range": lambda d: _meta(d, faces=1, face_index=5),
    "meta-not-json": lambda d: (d / "meta.json").write_text("{not json"),
    "meta-a-list": lambda d: (d / "meta.json").write_text("[1, 2]"),
    "thumbnail-gone": lambda d: (d / "thumb.jpg").unlink(),
    "photo-empty": lambda d: next(d.glob("image.*")).write_bytes(b""),
    "prepared-wrong-shape": lambda d: np.save(_prepared(d), np.zeros((7, 7), np.uint8)),
    "prepared-wrong-dtype": lambda d: np.save(_prepared(d), np.zeros((256, 256, 3), np.float64)),
    "prepared-nan": lambda d: np.save(_prepared(d), np.full((256, 256, 3), np.nan, np.float32)),
    "prepared-garbage": lambda d: _prepared(d).write_bytes(b"\x93NUMPY garbage"),
}


@pytest.mark.slow
def test_damaged_identities_are_found_listed_refused_and_deletable(
    identity_dir: Path,
    pipeline_factory: Callable[[PipelineSettings], FramePipeline],
    tom_png: bytes,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with start_server(server_settings(identity_dir), pipeline_factory) as first:
        ids = [upload(first.base_url, tom_png, "tom.png").json()["id"] for _ in range(len(DAMAGE) + 1)]
    healthy, damaged = ids[0], dict(zip(DAMAGE, ids[1:], strict=True))
    for kind, identity in damaged.items():
        DAMAGE[kind](identity_dir / identity)

    with caplog.at_level(logging.WARNING), start_server(server_settings(identity_dir), pipeline_factory) as second:
        base = second.base_url
        listed = httpx.get(f"{base}/v1/identities")
        assert listed.status_code == 200
        assert [i["id"] for i in listed.json()["identities"]] == [healthy]

        report = httpx.get(f"{base}/v1/server").json()["identities"]
        assert report["damaged"] == len(DAMAGE)
        assert report["damaged_ids"] == sorted(damaged.values())
        for identity in damaged.values():
            assert identity in caplog.text

        for kind, identity in damaged.items():
            got = httpx.get(f"{base}/v1/identities/{identity}")
            assert got.status_code == 409, (kind, got.text)
            assert "damaged" in got.json()["detail"] and str(identity_dir) not in got.text
            session = httpx.post(
                f"{base}/v1/sessions?identity={identity}",
                content="v=0\r\n",
                headers={"Content-Type": "application/sdp"},
            )
            assert session.status_code == 409, (kind, session.text)
        assert httpx.get(f"{base}/v1/identities/{healthy}").status_code == 200

        gone = damaged["width-abc"]
        assert httpx.delete(f"{base}/v1/identities/{gone}").status_code == 204
        assert gone not in httpx.get(f"{base}/v1/server").json()["identities"]["damaged_ids"]


def test_prepared_data_of_the_wrong_shape_is_refused_when_loaded(
    identity_dir: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], tom_png: bytes
) -> None:
    """Damage after start-up: the check on load refuses it (before, a session started and showed nothing)."""
    with start_server(server_settings(identity_dir), pipeline_factory) as server:
        identity = upload(server.base_url, tom_png, "tom.png").json()["id"]
        server.state.cache.invalidate(identity)
        np.save(_prepared(identity_dir / identity), np.zeros((256, 256), np.uint8))
        state = server.state
        with pytest.raises(IdentityUnreadable, match="prepared data is uint8"):
            server.call(lambda: state.load_source(identity))
