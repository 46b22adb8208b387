"""The two kinds of live output the API serves alike, a session's and an ingest stream's: their common routes
(listing, reading, switching identity, WHEP, viewer tokens) are written once and registered per kind. Channels
are watched through the same WHEP routes."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Depends

from app.auth.access import Access
from app.auth.guard import requires
from app.auth.principal import Principal
from app.auth.scopes import SESSIONS, STREAMS
from app.live.adapter import LiveOutput, Watchable
from app.server.channels import Channel, ChannelNotFound
from app.server.deps import get_channels, get_sessions, get_streams
from app.server.owned import owned_output
from app.server.sessions import SessionNotFound
from app.server.state import ServerState
from app.server.streams import StreamNotFound


@dataclass(frozen=True)
class OutputKind:
    plural: str  # in paths: /v1/sessions/...
    scope: str
    manager: Callable[[ServerState], Any]  # the kind's manager (503 while the server is not ready)
    not_found: Callable[[str], LookupError]
    id_name: str = "id"  # what the path parameter calls the output: session_id, ..., a channel's `name`

    @property
    def singular(self) -> str:  # in output keys: session/ID
        return self.plural[:-1]

    @property
    def param(self) -> str:  # the path parameter's name: session_id, stream_id, name
        return f"{self.singular}_id" if self.id_name == "id" else self.id_name

    def owned(self, state: ServerState, output_id: str, principal: Principal, access: Access) -> LiveOutput:
        """The output if `principal` may use it (its owner, admin, or a viewer token of it on the routes that
        take one); its kind's "not found" otherwise."""
        output: LiveOutput = self.manager(state).get(output_id)
        return owned_output(output, self.singular, principal, access, self.not_found)

    def watched(self, state: ServerState, output_id: str, principal: Principal, access: Access) -> Watchable:
        """The same, for the routes that only watch the output (WHEP), which channels have too."""
        output: Watchable = self.manager(state).get(output_id)
        return owned_output(output, self.singular, principal, access, self.not_found)

    def every(self, state: ServerState) -> list[LiveOutput]:
        """All live outputs of the kind, whoever owns them."""
        return list(self.manager(state).outputs())

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


SESSION_OUTPUTS = OutputKind("sessions", SESSIONS, get_sessions, SessionNotFound)
STREAM_OUTPUTS = OutputKind("streams", STREAMS, get_streams, StreamNotFound)
OUTPUT_KINDS = (SESSION_OUTPUTS, STREAM_OUTPUTS)
CHANNEL_OUTPUTS = OutputKind("channels", SESSIONS, get_channels, ChannelNotFound, id_name="name")
# What WHEP viewers may watch: every live output, and channels, whoever publishes into them.
WATCHED_KINDS = (*OUTPUT_KINDS, CHANNEL_OUTPUTS)


def owned_channel(state: ServerState, name: str, principal: Principal, access: Access) -> Channel:
    """The channel if `principal` owns it (or is admin): publishing into it and managing it; 404 otherwise."""
    channels = state.require_channels()
    channel = channels.get(name)
    if not access.owners.visible(principal, channel):
        raise ChannelNotFound(name)
    return channel
