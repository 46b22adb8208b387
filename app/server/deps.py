"""`Annotated` dependencies shared by the routes."""

from typing import Annotated

from fastapi import Depends, Request

from app.identity.store import IdentityStore
from app.observability import Metrics
from app.pipeline.pipeline import FramePipeline
from app.server.channels import ChannelManager
from app.server.revocation import RevocationWatcher
from app.server.sessions import SessionManager
from app.server.settings import ServerSettings
from app.server.state import NotReady, ServerState
from app.server.streams import StreamManager


def get_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.swapcast
    return state


StateDep = Annotated[ServerState, Depends(get_state)]


def get_revocation(request: Request) -> RevocationWatcher:
    watcher: RevocationWatcher = request.app.state.revocation
    return watcher


RevocationDep = Annotated[RevocationWatcher, Depends(get_revocation)]


def not_ready(state: ServerState) -> NotReady:
    return NotReady(state.not_ready_reason)


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


def get_channels(state: StateDep) -> ChannelManager:
    """Channels work before the models are loaded: their consumers get the slate meanwhile."""
    return state.require_channels()


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
