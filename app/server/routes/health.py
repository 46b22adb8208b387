"""Liveness, readiness, metrics and what the page needs to know about the server."""

from typing import Any

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse

from app.auth.guard import PUBLIC, AccessDep, Authenticated, MetricsReader
from app.pipeline.mouth import UNAVAILABLE as MOUTH_UNAVAILABLE
from app.pipeline.occlusion import UNAVAILABLE as OCCLUSION_UNAVAILABLE
from app.pipeline.pipeline import FramePipeline
from app.server.deps import StateDep
from app.server.errors import retry_after

router = APIRouter(tags=["health"])


@router.get("/healthz", dependencies=PUBLIC)
async def healthz() -> dict[str, str]:
    return {"status": "alive"}


@router.get("/readyz", dependencies=PUBLIC)
async def readyz(state: StateDep, access: AccessDep) -> JSONResponse:
    """Ready once the models are warm and credentials can be checked (a damaged keys file refuses every request
    that needs them, so a load balancer should send nothing here)."""
    pipeline = state.pipeline if state.ready else None
    reason = state.not_ready_reason if pipeline is None else access.problem()
    if pipeline is None or reason is not None:
        return JSONResponse(
            {"status": "not ready", "reason": reason}, status_code=503, headers=retry_after(state.settings)
        )
    tier = await state.model_tier_problem()
    if tier is not None:  # sessions go on with their faces covered; new ones belong elsewhere until it returns
        reason = f"the model tier is away: {tier}"
        return JSONResponse(
            {"status": "not ready", "reason": reason}, status_code=503, headers=retry_after(state.settings)
        )
    changed = state.models_changed_on_disk()
    if changed:  # still ready: the loaded copies serve; the next start checks the files again
        note = "; ".join(f"model {name} {what} on disk" for name, what in sorted(changed.items()))
        note += " since it was loaded: serving the loaded copy"
        return JSONResponse({"status": "ready", "engine": pipeline.engine.name, "note": note})
    return JSONResponse({"status": "ready", "engine": pipeline.engine.name})


@router.get("/metrics")
async def metrics(state: StateDep, _: MetricsReader) -> Response:
    body, content_type = state.metrics.render()
    return Response(body, media_type=content_type)


def mouth_mask(pipeline: FramePipeline) -> dict[str, Any]:
    """Whether sessions can keep their own mouth (their live option `mouth_mask`), and what they get unless
    they say."""
    default = pipeline.mouth_default
    return {
        "available": default is not None,
        "default": bool(default),
        "reason": None if default is not None else MOUTH_UNAVAILABLE,
    }


def occlusion(pipeline: FramePipeline) -> dict[str, Any]:
    """Whether sessions keep hands in front of faces (their live option `occlusion`): on by default wherever the
    server runs the stage, so the page shows it before a session starts."""
    available = pipeline.hands is not None
    return {"available": available, "default": available, "reason": None if available else OCCLUSION_UNAVAILABLE}


@router.get("/v1/server")
async def server_info(state: StateDep, principal: Authenticated) -> dict[str, Any]:
    s = state.settings
    pipeline = state.pipeline
    return {
        "ready": state.ready,
        "reason": state.not_ready_reason or None,
        "engine": pipeline.engine.name if pipeline else None,
        "model_key": pipeline.engine.model_key if pipeline else None,
        "models_changed_on_disk": state.models_changed_on_disk(),
        "mouth_mask": mouth_mask(pipeline) if pipeline else None,
        "occlusion": occlusion(pipeline) if pipeline else None,
        "rtsp": {
            "available": state.rtsp.available,
            "reason": state.rtsp.reason,
            "base_url": state.rtsp.base_url() if state.rtsp.available else None,
        },
        "srt": {"available": state.srt.available, "reason": state.srt.reason},
        "codecs": list(s.video_codecs),
        "limits": {
            "max_sessions": s.max_sessions,
            "max_streams": s.max_streams,
            "max_upload_bytes": s.max_upload_bytes,
            "max_image_pixels": s.max_image_pixels,
            "max_identities": s.max_identities,
            "max_identity_bytes": s.max_identity_bytes,
            "max_sessions_per_principal": s.max_sessions_per_principal,
            "max_streams_per_principal": s.max_streams_per_principal,
            "max_viewers_per_output": s.max_viewers_per_output,
            "rates": {
                "uploads": s.rate_uploads,
                "sessions": s.rate_sessions,
                "streams": s.rate_streams,
                "viewers": s.rate_viewers,
            },
            "max_remote_candidates": s.max_remote_candidates,
            "ice_timeout_s": s.ice_timeout_s,
        },
        # The ids only to admin: whose a damaged identity was may not be readable, and ids are not for probing.
        "identities": {
            "damaged": len(state.damaged),
            "damaged_ids": sorted(state.damaged) if principal.is_admin else [],
        },
        "sessions": len(state.sessions) if state.sessions is not None else 0,
        "streams": len(state.streams) if state.streams is not None else 0,
    }
