"""The content gate on a real server, with the stand-in classifier the tests build (tests.content.marker): a
flagged upload is refused with nothing stored, a flagged stream is stopped, each audited and counted; the policy's
default follows who can reach the server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.auth.settings import AccessSettings
from app.bench.rtc_client import RtcClient
from app.content.live import STOP_REASON
from app.content.settings import ContentSettings
from app.egress.rtsp import rtsp_unavailable_reason
from app.media.clips import MotionClip, load_sample
from app.pipeline.pipeline import FramePipeline
from app.server.app import create_app
from app.settings import PipelineSettings
from tests.content.marker import build_marker_model, marked
from tests.helpers import wait_for, wait_for_async
from tests.server.credentials import bearer, make_credentials
from tests.server.harness import PAGE_HEADERS, RunningServer, camera_file, encode, server_settings, start_server, upload


def audited(audit: Path, event: str) -> list[dict[str, Any]]:
    return [e for e in map(json.loads, audit.read_text().splitlines()) if e["event"] == event]


def sample(server: RunningServer, name: str, labels: dict[str, str], admin: str | None = None) -> float:
    text = httpx.get(f"{server.base_url}/metrics", headers=bearer(admin)).text
    wanted = name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
    line = next((x for x in text.splitlines() if x.startswith(wanted)), None)
    return float(line.split()[-1]) if line else 0.0


def test_a_flagged_photo_is_refused_with_nothing_stored_and_only_admin_hears_the_score(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline]
) -> None:
    creds = make_credentials(tmp_path / "keys.json")
    audit = tmp_path / "audit.log"
    settings = server_settings(
        tmp_path / "identities",
        access=AccessSettings(keys_file=creds.keys_file, auth_failure_delay_s=0.0, audit_log=str(audit)),
        content=ContentSettings(policy="stop", model_file=build_marker_model(tmp_path / "marker.onnx")),
    )
    tom = load_sample("tom_hanks")
    flagged = encode(marked(tom))
    with start_server(settings, pipeline_factory) as server:
        base = server.base_url
        owner = {**PAGE_HEADERS, **bearer(creds.owner)}
        refused = upload(base, flagged, headers=owner)
        assert refused.status_code == 422
        detail = refused.json()["detail"]
        assert "content policy" in detail and "score" not in detail and "0." not in detail
        as_admin = upload(base, flagged, headers={**PAGE_HEADERS, **bearer(creds.admin)})
        assert as_admin.status_code == 422 and "score" in as_admin.json()["detail"]
        # Several photos: the flagged one is named, and none of them is kept.
        several = httpx.post(
            f"{base}/v1/identities",
            files=[("image", ("a.png", encode(tom))), ("image", ("b.png", flagged))],
            data={"consent": "self"},
            headers=owner,
            timeout=60,
        )
        assert several.status_code == 422 and several.json()["detail"].startswith("photo 2 was refused")
        assert httpx.get(f"{base}/v1/identities", headers=bearer(creds.admin)).json()["identities"] == []
        assert not any(p.is_file() for p in (tmp_path / "identities").rglob("*") if p.suffix in {".png", ".jpg"})
        assert upload(base, encode(tom), headers=owner).status_code == 201  # a clear photo goes through
        checks = sample(server, "swapcast_content_checks_total", {"kind": "upload", "side": "input"}, creds.admin)
        hits = sample(server, "swapcast_content_hits_total", {"kind": "upload", "side": "input"}, creds.admin)
        assert (checks, hits) == (5, 3)
    refusals = audited(audit, "identity_refused")
    assert [(e["reason"], e["photo"]) for e in refusals] == [("content", None), ("content", None), ("content", 2)]
    assert all(e["score"] >= e["threshold"] for e in refusals)
    assert len(audited(audit, "identity_created")) == 1


@pytest.mark.skipif(rtsp_unavailable_reason() is not None, reason="streams need GStreamer RTSP")
def test_a_flagged_stream_is_stopped_with_a_reason_and_audited(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], clip: MotionClip
) -> None:
    audit = tmp_path / "audit.log"
    settings = server_settings(
        tmp_path / "identities",
        access=AccessSettings(keys_file=tmp_path / "none.json", audit_log=str(audit)),
        rtsp_enabled=True,
        rtsp_port=0,
        allow_file_sources=True,
        content=ContentSettings(policy="stop", model_file=build_marker_model(tmp_path / "marker.onnx")),
    )
    video = camera_file(tmp_path, MotionClip([marked(f) for f in clip.frames], clip.matrices, clip.fps), 30)
    with start_server(settings, pipeline_factory) as server:
        base = server.base_url
        identity = upload(base, encode(load_sample("tom_hanks"))).json()["id"]
        created = httpx.post(f"{base}/v1/streams", json={"source_url": str(video), "identity": identity}, timeout=30)
        assert created.status_code == 201, created.text
        stream = created.json()["id"]
        assert wait_for(lambda: httpx.get(f"{base}/v1/streams/{stream}").status_code == 404, 60)
        assert sample(server, "swapcast_content_hits_total", {"kind": "stream", "side": "input"}) >= 1
    (event,) = audited(audit, "content_flagged")
    assert (event["kind"], event["ref"], event["action"]) == ("stream", stream, "stop")
    assert "input" in event["sides"] and STOP_REASON.startswith("content policy")


def test_a_flagged_session_is_closed_with_the_content_reason(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], clip: MotionClip
) -> None:
    audit = tmp_path / "audit.log"
    settings = server_settings(
        tmp_path / "identities",
        access=AccessSettings(keys_file=tmp_path / "none.json", audit_log=str(audit)),
        content=ContentSettings(policy="stop", model_file=build_marker_model(tmp_path / "marker.onnx")),
    )
    frames = clip.frames[:10] + [marked(f) for f in clip.frames[10:]]
    with start_server(settings, pipeline_factory) as server:
        base = server.base_url
        identity = upload(base, encode(load_sample("tom_hanks"))).json()["id"]

        async def run() -> tuple[str, int]:
            client = RtcClient(frames, fps=15)
            async with httpx.AsyncClient(base_url=base, timeout=30) as http:
                await client.connect(http, f"/v1/sessions?identity={identity}")
                assert await client.wait_frames(3, 90), "the session sent no frames"
                ended = await wait_for_async(
                    lambda: server.state.sessions is not None and len(server.state.sessions) == 0, 60
                )
                gone = (await http.get(client.location or "")).status_code
                await client.close()
            assert ended, "the session was not closed"
            return client.location or "", gone

        location, gone = asyncio.run(run())
        assert gone == 404
        closed = sample(server, "swapcast_sessions_closed_total", {"reason": STOP_REASON})
        assert closed == 1
    (event,) = audited(audit, "content_flagged")
    assert (event["kind"], event["action"]) == ("session", "stop") and location.endswith(event["ref"])


@pytest.mark.parametrize(
    ("host", "policy", "expected"),
    [("0.0.0.0", None, "stop"), ("127.0.0.1", None, "off"), ("0.0.0.0", "off", "off"), ("127.0.0.1", "blur", "blur")],
)
def test_the_default_policy_stops_where_others_reach_the_server(
    tmp_path: Path,
    pipeline_factory: Callable[[PipelineSettings], FramePipeline],
    host: str,
    policy: str | None,
    expected: str,
) -> None:
    creds = make_credentials(tmp_path / "keys.json")
    settings = server_settings(
        tmp_path / "identities",
        host=host,
        access=AccessSettings(keys_file=creds.keys_file),
        content=ContentSettings.model_validate({"policy": policy}),
    )
    assert create_app(settings, pipeline_factory).state.swapcast.content_policy == expected
