"""A session's mouth mask is one of its live options (`PATCH /v1/sessions/{id}/options {"mouth_mask": ...}`): the
server's `SWAPCAST_MOUTH_MASK` is only the default; on and off where the server's engine can keep the mouth (the
setting above 0, or the mesh engine), a 409 that says how to enable it where it cannot; options are applied all
or nothing."""

from collections.abc import Callable
from pathlib import Path

import httpx

from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.server.test_occlusion_route import options_answers


def mouth_of(answer: httpx.Response) -> tuple[bool, bool]:
    """(the target's mouth kept, the server can keep it), from a session's stats."""
    options = answer.json()["options"]
    return options["mouth_mask"], options["mouth_mask_available"]


def test_the_servers_mouth_mask_is_a_default_each_session_switches(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], tom_png: bytes
) -> None:
    info: list[httpx.Response] = []
    first, off, bad, refused, on = options_answers(
        tmp_path,
        pipeline_factory,
        tom_png,
        "off",
        [
            ({"mouth_mask": False}, 200),
            ({"mouth_mask": "yes"}, 422),
            ({"mouth_mask": True, "occlusion": True}, 409),  # occlusion is refused: the mask stays off
            ({"mouth_mask": True, "on_face_lost": "cover"}, 200),
        ],
        info,
        engine="classic",
        mouth_mask=0.8,
    )
    assert info[0].json()["mouth_mask"] == {"available": True, "default": True, "reason": None}
    assert mouth_of(first) == (True, True)
    assert mouth_of(off) == (False, True)
    assert bad.status_code == 422
    assert "occlusion is not available" in refused.json()["detail"]
    assert mouth_of(on) == (True, True)
    assert on.json()["options"]["on_face_lost"] == "cover"


def test_the_mesh_engine_keeps_the_mouth_for_sessions_that_ask(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], tom_png: bytes
) -> None:
    first, on, off = options_answers(
        tmp_path,
        pipeline_factory,
        tom_png,
        "off",
        [({"mouth_mask": True}, 200), ({"mouth_mask": False}, 200)],
        engine="mesh",
        mouth_mask=0.0,
    )
    assert mouth_of(first) == (False, True)
    assert mouth_of(on) == (True, True)
    assert mouth_of(off) == (False, True)


def test_a_server_without_the_mouth_mask_says_how_to_enable_it(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], tom_png: bytes
) -> None:
    info: list[httpx.Response] = []
    first, refused, off = options_answers(
        tmp_path,
        pipeline_factory,
        tom_png,
        "off",
        [({"mouth_mask": True, "on_face_lost": "cover"}, 409), ({"mouth_mask": False}, 200)],
        info,
        engine="classic",
        mouth_mask=0.0,
    )
    assert mouth_of(first) == (False, False)
    detail = refused.json()["detail"]
    assert "the mouth mask is not available on this server" in detail and "SWAPCAST_MOUTH_MASK" in detail
    # The page learns it before any session, to show the box disabled with the reason.
    assert info[0].json()["mouth_mask"] == {"available": False, "default": False, "reason": detail}
    assert mouth_of(off) == (False, False)
    assert off.json()["options"]["on_face_lost"] == "hold"  # the refused change changed nothing
