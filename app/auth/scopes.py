"""The scopes a credential can carry. `admin` implies every other scope and sees every owner's resources."""

from typing import Final, Literal

Scope = Literal["identities:write", "identities:read", "sessions", "streams", "metrics", "admin"]

IDENTITIES_WRITE: Final = "identities:write"
IDENTITIES_READ: Final = "identities:read"
SESSIONS: Final = "sessions"
STREAMS: Final = "streams"
METRICS: Final = "metrics"
ADMIN: Final = "admin"

ALL_SCOPES: Final[tuple[Scope, ...]] = (IDENTITIES_WRITE, IDENTITIES_READ, SESSIONS, STREAMS, METRICS, ADMIN)


def parse_scopes(values: list[str] | str) -> frozenset[str]:
    """Scopes from a list, or from one space-separated string (the OAuth `scope` claim); unknown names are
    kept out so a token minted for another service grants nothing here."""
    names = values.split() if isinstance(values, str) else [str(v) for v in values]
    return frozenset(name for name in names if name in ALL_SCOPES)


def unknown_scopes(values: list[str]) -> list[str]:
    return [value for value in values if value not in ALL_SCOPES]
