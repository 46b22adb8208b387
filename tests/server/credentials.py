"""Keys and tokens for the access tests: real keys in a real keys file, real JWTs signed with PyJWT."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jwt

from app.auth.keys import KeyStore
from app.auth.scopes import ADMIN, ALL_SCOPES
from app.auth.settings import AccessSettings

JWT_SECRET = "a-test-secret-of-at-least-thirty-two-bytes!"
JWT_ISSUER = "https://id.example"
JWT_AUDIENCE = "swapcast"
USER_SCOPES = [s for s in ALL_SCOPES if s != ADMIN]


@dataclass
class Credentials:
    keys_file: Path
    owner: str
    other: str
    admin: str
    revoked: str
    without: dict[str, str]  # scope -> a key with every user scope but that one

    @property
    def bad_key(self) -> str:
        return self.owner[:-4] + ("AAAA" if not self.owner.endswith("AAAA") else "BBBB")


def make_credentials(keys_file: Path) -> Credentials:
    store = KeyStore(keys_file)
    owner = store.create("alice", USER_SCOPES)[1]
    other = store.create("bob", USER_SCOPES)[1]
    admin = store.create("root", [ADMIN])[1]
    revoked_record, revoked = store.create("mallory", USER_SCOPES)
    store.revoke(revoked_record.id)
    without = {
        scope: store.create(f"no-{scope.replace(':', '-')}", [s for s in USER_SCOPES if s != scope])[1]
        for scope in USER_SCOPES
    }
    return Credentials(keys_file, owner, other, admin, revoked, without)


def token(
    claims: dict[str, Any] | None = None,
    *,
    key: Any = JWT_SECRET,
    algorithm: str = "HS256",
    headers: dict[str, Any] | None = None,
) -> str:
    now = int(time.time())
    body: dict[str, Any] = {
        "sub": "carol",
        "iss": JWT_ISSUER,
        "aud": JWT_AUDIENCE,
        "iat": now,
        "exp": now + 300,
        "scope": " ".join(USER_SCOPES),
    }
    body.update(claims or {})
    return jwt.encode(body, key, algorithm=algorithm, headers=headers)


def bearer(credential: str | None) -> dict[str, str]:
    """The page's header plus Authorization when there is a credential."""
    headers = {"X-Swapcast": "1"}
    if credential:
        headers["Authorization"] = f"Bearer {credential}"
    return headers


@dataclass
class TwoUsers:
    """A server whose keys file holds two users' keys, alice's and bob's (every user scope, no admin)."""

    server: Any  # a tests.server.harness.RunningServer
    root: Path
    alice: str
    bob: str

    def call(self, method: str, path: str, key: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(method, f"{self.server.base_url}{path}", headers=bearer(key), timeout=30, **kwargs)


@contextmanager
def two_users_server(root: Path, pipeline_factory: Callable[..., Any], **overrides: Any) -> Iterator[TwoUsers]:
    """A server (the tests' settings and `overrides`) with its data and keys file under `root`."""
    from tests.server.harness import server_settings, start_server  # the harness is the heavier import

    store = KeyStore(root / "keys.json")
    alice, bob = (store.create(name, USER_SCOPES)[1] for name in ("alice", "bob"))
    access = AccessSettings(keys_file=root / "keys.json", auth_failure_delay_s=0.0)
    with start_server(server_settings(root / "identities", access=access, **overrides), pipeline_factory) as server:
        yield TwoUsers(server, root, alice, bob)
