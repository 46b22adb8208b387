"""A session's occlusion is one of its live options (`PATCH /v1/sessions/{id}/options {"occlusion": ...}`): on
and off where the server runs the stage, a clear 409 (nothing changed) where it does not, 422 for anything but
a JSON boolean; `GET /v1/server` says which before a session starts."""

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from engines.errors import ModelError
from engines.store import ModelStore
from tests.server.harness import PAGE_HEADERS, server_settings, start_server, upload
from tests.server.test_bad_input import SDP, real_offer


def options_answers(
    tmp_path: Path,
    pipeline_factory: Callable[[PipelineSettings], FramePipeline],
    tom_png: bytes,
    mode: str,
    bodies: list[tuple[object, int]],
    server_info: list[httpx.Response] | None = None,
    **pipeline: object,
) -> list[httpx.Response]:
    """The session's stats, then the answer to each PATCH of `bodies` (each with the status it must get), on a
    server with occlusion `mode` and the `pipeline` settings given; `server_info` gets the server's
    `GET /v1/server`."""

    def factory(settings: PipelineSettings) -> FramePipeline:
        return pipeline_factory(settings.model_copy(update={"occlusion": mode, **pipeline}))

    answers = []
    with start_server(server_settings(tmp_path / "identities"), factory) as server:
        base = server.base_url
        if server_info is not None:
            server_info.append(httpx.get(f"{base}/v1/server", headers=PAGE_HEADERS))
        identity = upload(base, tom_png, "tom.png").json()["id"]
        created = httpx.post(f"{base}/v1/sessions?identity={identity}", content=real_offer(), headers=SDP)
        assert created.status_code == 201, created.text
        url = f"{base}{created.headers['location']}/options"
        try:
            answers.append(httpx.get(f"{base}{created.headers['location']}", headers=PAGE_HEADERS))
            for body, status in bodies:
                answer = httpx.patch(url, json=body, headers=PAGE_HEADERS)
                assert answer.status_code == status, (body, answer.text)
                answers.append(answer)
            missing = httpx.patch(f"{base}/v1/sessions/nobody/options", json={"occlusion": False}, headers=PAGE_HEADERS)
            assert missing.status_code == 404
        finally:
            httpx.delete(f"{base}{created.headers['location']}", headers=PAGE_HEADERS)
    return answers


def occlusion_of(answer: httpx.Response) -> tuple[bool, bool]:
    """(hands kept in front, the server runs the stage), from a session's stats."""
    options = answer.json()["options"]
    return options["occlusion"], options["occlusion_available"]


def test_occlusion_is_switched_per_session(
    tmp_path: Path, store: ModelStore, pipeline_factory: Callable[[PipelineSettings], FramePipeline], tom_png: bytes
) -> None:
    try:
        store.ensure("hand_landmark")
    except ModelError as exc:
        pytest.skip(f"the hand model cannot be imported here: {exc}")
    info: list[httpx.Response] = []
    first, off, bad, on = options_answers(
        tmp_path,
        pipeline_factory,
        tom_png,
        "hands",
        [({"occlusion": False}, 200), ({"occlusion": 1}, 422), ({"occlusion": True}, 200)],
        info,
    )
    assert info[0].json()["occlusion"] == {"available": True, "default": True, "reason": None}
    assert occlusion_of(first) == (True, True)
    assert occlusion_of(off) == (False, True)
    assert occlusion_of(on) == (True, True)
    assert bad.status_code == 422


def test_a_server_without_the_stage_says_so_before_and_during_a_session(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], tom_png: bytes
) -> None:
    info: list[httpx.Response] = []
    first, refused, off = options_answers(
        tmp_path,
        pipeline_factory,
        tom_png,
        "off",
        [({"occlusion": True, "on_face_lost": "cover"}, 409), ({"occlusion": False}, 200)],
        info,
    )
    assert occlusion_of(first) == (False, False)
    detail = refused.json()["detail"]
    assert "occlusion is not available on this server" in detail and "swapcast models import" in detail
    # GET /v1/server says so before any session (the page shows it with the "Keep hands in front" box).
    assert info[0].json()["occlusion"] == {"available": False, "default": False, "reason": detail}
    assert occlusion_of(off) == (False, False)
    assert off.json()["options"]["on_face_lost"] == "hold"  # the refused change changed nothing
