"""Who a request acts for."""

from dataclasses import dataclass
from typing import Literal

from app.auth.scopes import ADMIN, ALL_SCOPES

PrincipalKind = Literal["key", "jwt", "local", "viewer"]
LOCAL_ID = "local"


@dataclass(frozen=True)
class Principal:
    """`id` owns resources (`key:NAME`, `jwt:SUB` or `local`); `credential` is what authenticated this request
    (a key id, `jwt:SUB`, `local`, `viewer:TOKEN_ID`): revoking that credential ends what it started. A viewer
    token's principal has no scopes and owns nothing: it may only watch `output` (`session/ID`, `stream/ID`)."""

    id: str
    kind: PrincipalKind
    scopes: frozenset[str]
    credential: str
    output: str | None = None

    def watches(self, output: str) -> bool:
        """Whether this is a viewer token's principal for `output`."""
        return self.kind == "viewer" and self.output == output

    @property
    def is_admin(self) -> bool:
        return ADMIN in self.scopes

    def allows(self, scope: str) -> bool:
        return scope in self.scopes or self.is_admin

    def can_see(self, owner: str | None) -> bool:
        """Owners see their own; admin sees all, including resources from before owners were recorded."""
        return self.is_admin or (owner is not None and owner == self.id)


def local_principal() -> Principal:
    """The one principal of local mode: the person at this machine, allowed everything."""
    return Principal(LOCAL_ID, "local", frozenset(ALL_SCOPES), LOCAL_ID)
