"""`Annotated` dependencies shared by the routes."""

from typing import Annotated

from fastapi import Depends, HTTPException, Request

from app.identity.store import IdentityNotFound, IdentityStore, IdentityUnreadable
from app.media.webrtc import SessionManager
from app.observability import Metrics
from app.pipeline.pipeline import FramePipeline
from app.pipeline.swap import PreparedSource
from app.server.ingest import StreamManager
from app.server.settings import ServerSettings
from app.server.state import NotReady, ServerState


def get_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.swapcast
    return state


StateDep = Annotated[ServerState, Depends(get_state)]


def not_ready(state: ServerState) -> HTTPException:
    return HTTPException(
        503,
        f"not ready: {state.not_ready_reason}",
        headers={"Retry-After": str(state.settings.retry_after_s)},
    )


async def load_identity(state: ServerState, identity_id: str) -> PreparedSource:
    """The prepared identity for a session or a stream, or the HTTP error that explains why not."""
    try:
        return await state.load_source(identity_id)
    except IdentityNotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except IdentityUnreadable as exc:
        raise HTTPException(409, str(exc)) from None
    except NotReady as exc:
        retry = {"Retry-After": str(state.settings.retry_after_s)}
        raise HTTPException(503, f"not ready: {exc}", headers=retry) from None


def get_settings(state: StateDep) -> ServerSettings:
    return state.settings


def get_metrics(state: StateDep) -> Metrics:
    return state.metrics


def get_store(state: StateDep) -> IdentityStore:
    return state.store


def get_pipeline(state: StateDep) -> FramePipeline:
    if not state.ready or state.pipeline is None:
        raise not_ready(state)
    return state.pipeline


def get_sessions(state: StateDep) -> SessionManager:
    if not state.ready or state.sessions is None:
        raise not_ready(state)
    return state.sessions


def get_streams(state: StateDep) -> StreamManager:
    if not state.ready or state.streams is None:
        raise not_ready(state)
    return state.streams


SettingsDep = Annotated[ServerSettings, Depends(get_settings)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
StoreDep = Annotated[IdentityStore, Depends(get_store)]
PipelineDep = Annotated[FramePipeline, Depends(get_pipeline)]
SessionsDep = Annotated[SessionManager, Depends(get_sessions)]
StreamsDep = Annotated[StreamManager, Depends(get_streams)]
