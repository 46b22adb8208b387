"""Viewer tokens: `vt_<id>_<secret>`, minted by an output's owner for one output (a session's or a stream's
swapped video), good only for that output's WHEP endpoint and viewer page. They can go into an OBS Browser
Source URL or a proxy's log without giving away anything but the picture: no listing, no switching, no RTSP
login, no TURN.

Kept like API keys (`app.auth.bearer_secret`: an id to find the record, a salt and the SHA-256 of salt +
secret; the secret is shown once), in memory: a token lives as long as its output, is revoked with `DELETE`,
and ends with the credential that minted it. A channel's own token (`app.channels`) is kept with the channel
instead, and ends when the channel's credentials are rotated or the channel is deleted.
"""

import secrets
import threading
from dataclasses import dataclass
from datetime import UTC, datetime

from app.auth.bearer_secret import StoredSecret, credential_pattern, matches, new_secret, split
from app.auth.principal import Principal

VIEWER_PREFIX = "vt_"
TOKEN_PATTERN = credential_pattern(VIEWER_PREFIX, 16)
MAX_PER_OUTPUT = 16


class TooManyViewerTokens(Exception):
    """An output already has `MAX_PER_OUTPUT` tokens: revoke one first."""


@dataclass(frozen=True)
class ViewerToken:
    id: str
    output: str  # `session/ID`, `stream/ID` or `channel/NAME`
    owner: str  # the output's owner
    minted_by: str  # the credential that minted it: revoking that credential revokes this token
    salt: str
    hash: str
    created: str

    @property
    def credential(self) -> str:
        return f"viewer:{self.id}"

    def public(self) -> dict[str, str]:
        return {"id": self.id, "output": self.output, "created": self.created}


def new_viewer_token(output: str, owner: str, minted_by: str) -> tuple[ViewerToken, str]:
    """A token for `output` and its record (which holds only the salted hash); `minted_by` is the credential
    whose revocation ends it ("" for none)."""
    token_id = secrets.token_hex(8)
    secret, stored = new_secret()
    record = ViewerToken(
        id=token_id,
        output=output,
        owner=owner,
        minted_by=minted_by,
        salt=stored.salt,
        hash=stored.hash,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    return record, f"{VIEWER_PREFIX}{token_id}_{secret}"


class ViewerTokens:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokens: dict[str, ViewerToken] = {}

    def mint(self, output: str, owner: str, minted_by: Principal) -> tuple[ViewerToken, str]:
        """A new token for `output`; returns its record and the token, which is not stored."""
        record, token = new_viewer_token(output, owner, minted_by.credential)
        with self._lock:
            if sum(1 for t in self._tokens.values() if t.output == output) >= MAX_PER_OUTPUT:
                raise TooManyViewerTokens(f"{output} has {MAX_PER_OUTPUT} viewer tokens already: revoke one first")
            self._tokens[record.id] = record
        return record, token

    def adopt(self, record: ViewerToken) -> None:
        """Accept a token kept elsewhere (a channel's, stored with the channel so that it outlives restarts)."""
        with self._lock:
            self._tokens[record.id] = record

    def verify(self, token: str) -> Principal | None:
        """The viewer principal this token stands for, or None. Constant time in the secret."""
        token_id, secret = split(TOKEN_PATTERN, token)
        with self._lock:
            record = self._tokens.get(token_id)
        if not matches(secret, StoredSecret(record.salt, record.hash) if record else None) or record is None:
            return None
        return Principal(record.credential, "viewer", frozenset(), record.credential, record.output)

    def of_output(self, output: str) -> list[ViewerToken]:
        with self._lock:
            return sorted((t for t in self._tokens.values() if t.output == output), key=lambda t: (t.created, t.id))

    def get(self, output: str, token_id: str) -> ViewerToken | None:
        with self._lock:
            record = self._tokens.get(token_id)
        return record if record is not None and record.output == output else None

    def revoke(self, token_id: str) -> ViewerToken | None:
        with self._lock:
            return self._tokens.pop(token_id, None)

    def revoke_minted_by(self, credentials: set[str]) -> list[ViewerToken]:
        """Revoke every token minted with one of `credentials`; returns them."""
        with self._lock:
            gone = [t for t in self._tokens.values() if t.minted_by in credentials]
            for record in gone:
                del self._tokens[record.id]
        return gone

    def forget_output(self, output: str) -> None:
        """The output ended: its tokens go with it."""
        with self._lock:
            for record in [t for t in self._tokens.values() if t.output == output]:
                del self._tokens[record.id]
