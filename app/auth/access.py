"""One object per server that answers "who is this request?": API keys, JWTs, viewer tokens or local mode, with
the failure delay, the audit log and the owners of live resources.

Local mode is decided at start-up and can only end: a server that started with a keys file or JWT settings never
falls back to it. Revoking the last key, emptying or deleting the keys file leaves a server that refuses everyone
(fail closed), not one that lets everyone in."""

import logging
import weakref
from dataclasses import dataclass

from app.auth.audit import AuditLog
from app.auth.failures import FailureDelay
from app.auth.keys import KeyStore, KeyStoreError, key_id_of
from app.auth.principal import Principal, local_principal
from app.auth.settings import AccessSettings, allowed_hosts, is_loopback
from app.auth.tokens import TokenRejected, TokenVerifier
from app.auth.viewer_tokens import VIEWER_PREFIX, ViewerTokens

log = logging.getLogger(__name__)
KEYS_UNREADABLE = "credentials cannot be checked: the server's keys file is unreadable (its log says why)"


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
    """The owner of each live session, stream and channel, forgotten with the object."""

    def __init__(self) -> None:
        self._owners: weakref.WeakKeyDictionary[object, Ownership] = weakref.WeakKeyDictionary()

    def set(self, resource: object, principal: Principal) -> None:
        self._owners[resource] = Ownership(principal.id, principal.credential)

    def record(self, resource: object, owner: str, credential: str) -> None:
        """An owner known from storage (a channel's), with the credential that made it ("" when none ends it)."""
        self._owners[resource] = Ownership(owner, credential)

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
        self.viewer_tokens = ViewerTokens()
        self._keys_seen: set[str] = set()
        self._keys_problem: str | None = None
        # Credentials are configured when JWT settings are, or when a keys file exists (even an empty or
        # unreadable one): from then on there is no local mode.
        self._configured = self.tokens is not None or self.keys.exists()

    @property
    def configured(self) -> bool:
        """Credentials were configured at start-up or since; once true, it stays true."""
        if not self._configured and self.keys.exists():
            self._configured = True
            log.warning("a keys file appeared at %s: local mode ends, requests need credentials", self.keys.path)
        return self._configured

    @property
    def local_mode(self) -> bool:
        """No credentials were ever configured and only this machine can connect (or anonymous use was asked
        for): every request acts as the local principal."""
        return not self.configured and (self.loopback or self.settings.allow_anonymous)

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
        if not ways:
            return (
                f"no active key in {self.keys.path}: every request is refused (401) until "
                "`swapcast keys create NAME --scope ...`"
            )
        return "Authorization: Bearer, " + " or ".join(ways)

    def problem(self) -> str | None:
        """Why credentials cannot be checked now (for `/readyz`; no server paths), or None."""
        try:
            self.keys.refresh()
        except KeyStoreError as exc:
            self._log_keys_problem(str(exc))
            return "access control unavailable: the keys file cannot be read"
        self._keys_problem = None
        return None

    def _log_keys_problem(self, detail: str) -> None:
        """The full reason goes to the operator's log once per change; callers only hear that it failed."""
        if detail != self._keys_problem:
            self._keys_problem = detail
            log.error("%s; every request that needs credentials gets 503 until it is fixed", detail)

    def authenticate(self, token: str | None) -> Principal:
        """The principal of an API request; `Unauthenticated`, or `KeyStoreError` (with a message safe to
        return) when the keys file cannot be read."""
        try:
            return self._authenticate(token)
        except KeyStoreError as exc:
            self._log_keys_problem(str(exc))
            raise KeyStoreError(KEYS_UNREADABLE) from None

    def authenticate_viewer(self, token: str | None) -> Principal:
        """Like `authenticate`, but a viewer token (read-only, one output) is accepted too."""
        if token and token.startswith(VIEWER_PREFIX) and not self.local_mode:
            viewer = self.viewer_tokens.verify(token)
            if viewer is None:
                raise Unauthenticated("invalid or revoked viewer token")
            return viewer
        return self.authenticate(token)

    def _authenticate(self, token: str | None) -> Principal:
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
