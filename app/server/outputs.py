"""The two kinds of live output the API serves alike, a session's and an ingest stream's: their common routes
(listing, reading, switching identity, WHEP, viewer tokens) are written once and registered per kind."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Depends

from app.auth.access import Access
from app.auth.guard import requires
from app.auth.principal import Principal
from app.auth.scopes import SESSIONS, STREAMS
from app.live.adapter import LiveOutput
from app.server.deps import get_sessions, get_streams
from app.server.owned import owned_session, owned_stream
from app.server.state import ServerState


@dataclass(frozen=True)
class OutputKind:
    plural: str  # in paths: /v1/sessions/...
    singular: str  # in output keys: session/ID
    param: str  # the path parameter's name: session_id
    scope: str
    find: Callable[[ServerState, str, Principal, Access], LiveOutput]
    every: Callable[[ServerState], list[LiveOutput]]  # all live outputs of the kind, whoever owns them

    def owned(self, state: ServerState, output_id: str, principal: Principal, access: Access) -> LiveOutput:
        """The output if `principal` may use it (its owner, admin, or a viewer token of it on the routes that
        take one); its kind's "not found" otherwise."""
        return self.find(state, output_id, principal, access)

    def key(self, output_id: str) -> str:
        return f"{self.singular}/{output_id}"

    def path(self, suffix: str = "") -> str:
        return f"/v1/{self.plural}/{{{self.param}}}{suffix}"

    def user(self) -> Any:
        """The dependency of a route for the output's owner (the kind's scope)."""
        return Depends(requires(self.scope))

    def viewer(self) -> Any:
        """The same, or a viewer token of the output."""
        return Depends(requires(self.scope, viewer_token=True))


SESSION_OUTPUTS = OutputKind(
    "sessions",
    "session",
    "session_id",
    SESSIONS,
    lambda state, output_id, principal, access: owned_session(get_sessions(state), output_id, principal, access),
    lambda state: list(get_sessions(state).sessions()),
)
STREAM_OUTPUTS = OutputKind(
    "streams",
    "stream",
    "stream_id",
    STREAMS,
    lambda state, output_id, principal, access: owned_stream(get_streams(state), output_id, principal, access),
    lambda state: list(get_streams(state).streams()),
)
OUTPUT_KINDS = (SESSION_OUTPUTS, STREAM_OUTPUTS)
