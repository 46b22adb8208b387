"""One object per server that answers "who is this request?": API keys, JWTs or local mode, with the failure
delay, the audit log and the owners of live resources."""

import weakref
from dataclasses import dataclass

from app.auth.audit import AuditLog
from app.auth.failures import FailureDelay
from app.auth.keys import KeyStore, key_id_of
from app.auth.principal import Principal, local_principal
from app.auth.settings import AccessSettings, allowed_hosts, is_loopback
from app.auth.tokens import TokenRejected, TokenVerifier


class Unauthenticated(Exception):
    """Missing or unacceptable credentials; the message is safe to return to the client."""

    def __init__(self, reason: str, *, key_id: str | None = None, invalid: bool = True) -> None:
        super().__init__(reason)
        self.key_id = key_id
        self.invalid = invalid  # a credential was sent and refused (RFC 6750 `invalid_token`)


@dataclass(frozen=True)
class Ownership:
    owner: str
    credential: str


class Owners:
    """The owner of each live session and stream, forgotten with the object."""

    def __init__(self) -> None:
        self._owners: weakref.WeakKeyDictionary[object, Ownership] = weakref.WeakKeyDictionary()

    def set(self, resource: object, principal: Principal) -> None:
        self._owners[resource] = Ownership(principal.id, principal.credential)

    def of(self, resource: object) -> Ownership | None:
        return self._owners.get(resource)

    def visible(self, principal: Principal, resource: object) -> bool:
        ownership = self._owners.get(resource)
        return principal.can_see(ownership.owner if ownership else None)


def refusal_to_serve(settings: AccessSettings, bind_host: str, keys: KeyStore) -> str | None:
    """Why the server must not start on this address with these settings, or None."""
    if is_loopback(bind_host) or settings.allow_anonymous or settings.jwt_configured or keys.has_active():
        return None
    return (
        f"refusing to serve on {bind_host} without credentials: create a key with "
        "`swapcast keys create NAME --scope admin` (or configure SWAPCAST_JWT_*), "
        "or set SWAPCAST_ALLOW_ANONYMOUS=true to let anyone who can reach it in"
    )


class Access:
    def __init__(self, settings: AccessSettings, *, bind_host: str, public_host: str | None = None) -> None:
        self.settings = settings
        self.keys = KeyStore(settings.keys_file)
        self.tokens = TokenVerifier(settings) if settings.jwt_configured else None
        self.audit = AuditLog(settings.audit_log)
        self.failures = FailureDelay(settings.auth_failure_delay_s, settings.auth_failure_delay_max_s)
        self.loopback = is_loopback(bind_host)
        self.hosts = allowed_hosts(settings, bind_host, public_host)
        self.owners = Owners()
        self._keys_seen: set[str] = set()

    @property
    def local_mode(self) -> bool:
        """No credentials configured and only this machine can connect (or anonymous use was asked for):
        every request acts as the local principal."""
        if self.tokens is not None or self.keys.has_active():
            return False
        return self.loopback or self.settings.allow_anonymous

    def describe(self) -> str:
        """One line for the start-up banner."""
        if self.local_mode:
            if self.loopback:
                return "local mode: no keys or tokens configured, every request here acts as the local principal"
            return "ANONYMOUS: SWAPCAST_ALLOW_ANONYMOUS=true lets anyone who can reach this server do anything"
        ways = []
        active = sum(1 for r in self.keys.records() if r.active)
        if active:
            ways.append(f"API keys ({active} active, {self.keys.path})")
        if self.tokens is not None:
            ways.append("JWT" + (f" from {self.settings.jwt_issuer}" if self.settings.jwt_issuer else ""))
        return "Authorization: Bearer, " + " or ".join(ways)

    def authenticate(self, token: str | None) -> Principal:
        if self.local_mode:
            return local_principal()
        if not token:
            raise Unauthenticated("credentials required: send Authorization: Bearer <key or token>", invalid=False)
        if token.startswith("sk_"):
            record = self.keys.verify(token)
            if record is None:
                raise Unauthenticated("invalid or revoked API key", key_id=key_id_of(token))
            if record.id not in self._keys_seen:
                self._keys_seen.add(record.id)
                self.audit.event("key_first_use", key_id=record.id, principal=f"key:{record.name}")
            return Principal(f"key:{record.name}", "key", frozenset(record.scopes), record.id)
        if self.tokens is None:
            raise Unauthenticated("invalid API key")
        try:
            claims = self.tokens.verify(token)
        except TokenRejected as exc:
            raise Unauthenticated(str(exc)) from None
        principal_id = f"jwt:{claims.subject}"
        return Principal(principal_id, "jwt", claims.scopes, principal_id)

    def close(self) -> None:
        self.audit.close()
