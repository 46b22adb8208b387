"""JWTs from an existing identity provider, checked with PyJWT.

The accepted algorithms follow from the configured key and nothing else: HS256 for a shared secret, RS256 or
ES256 for a public key or JWKS file. So `alg: none` is refused, and so is an HS256 token signed with the
public key as its secret (the RS/HS confusion), whatever the token's header says. `exp` and `sub` are
required; `nbf`, `iss` and `aud` are checked as configured, within the leeway.
"""

import json
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from app.auth.scopes import parse_scopes
from app.auth.settings import AccessSettings


class TokenRejected(Exception):
    """The token is not acceptable; the message says why (safe to return to the client)."""


class TokenConfigError(Exception):
    """The configured key material cannot be used."""


@dataclass(frozen=True)
class TokenClaims:
    subject: str
    scopes: frozenset[str]


class TokenVerifier:
    def __init__(self, settings: AccessSettings) -> None:
        self._issuer = settings.jwt_issuer
        self._audience = settings.jwt_audience
        self._leeway = settings.jwt_leeway_s
        self._keys: dict[str | None, tuple[Any, list[str]]] = {}
        if settings.jwt_secret is not None:
            self._keys[None] = (settings.jwt_secret.get_secret_value().encode(), ["HS256"])
        elif settings.jwt_public_key_file is not None:
            self._keys[None] = _public_key(settings.jwt_public_key_file.read_bytes(), settings.jwt_public_key_file.name)
        elif settings.jwt_jwks_file is not None:
            self._keys = _jwks(settings.jwt_jwks_file.read_text(encoding="utf-8"))
        else:
            raise TokenConfigError("no JWT key configured")

    def verify(self, token: str) -> TokenClaims:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise TokenRejected(f"malformed token: {exc}") from None
        kid = header.get("kid")
        entry = self._keys.get(kid) if kid in self._keys else self._keys.get(None)
        if entry is None and len(self._keys) == 1:
            entry = next(iter(self._keys.values()))
        if entry is None:
            raise TokenRejected("unknown signing key (kid)")
        key, algorithms = entry
        required = ["exp", "sub"]
        if self._issuer is not None:
            required.append("iss")
        if self._audience is not None:
            required.append("aud")
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=algorithms,
                audience=self._audience,
                issuer=self._issuer,
                leeway=self._leeway,
                options={"require": required},
            )
        except jwt.ExpiredSignatureError:
            raise TokenRejected("token expired") from None
        except jwt.ImmatureSignatureError:
            raise TokenRejected("token not yet valid") from None
        except jwt.InvalidAudienceError:
            raise TokenRejected("token is for another audience") from None
        except jwt.InvalidIssuerError:
            raise TokenRejected("token is from another issuer") from None
        except jwt.InvalidAlgorithmError:
            raise TokenRejected(f"token algorithm not allowed (this server accepts {', '.join(algorithms)})") from None
        except jwt.PyJWTError as exc:
            raise TokenRejected(f"invalid token: {exc}") from None
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            raise TokenRejected("token has no subject")
        raw_scopes = claims.get("scope", claims.get("scp", []))
        if not isinstance(raw_scopes, str | list):
            raise TokenRejected("token scopes must be a string or a list")
        return TokenClaims(subject, parse_scopes(raw_scopes))


def _public_key(pem: bytes, where: str) -> tuple[Any, list[str]]:
    try:
        key = load_pem_public_key(pem)
    except ValueError as exc:
        raise TokenConfigError(f"{where}: not a PEM public key ({exc})") from None
    if isinstance(key, rsa.RSAPublicKey):
        return key, ["RS256"]
    if isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1):
        return key, ["ES256"]
    raise TokenConfigError(f"{where}: use an RSA key (RS256) or a P-256 key (ES256)")


def _jwks(text: str) -> dict[str | None, tuple[Any, list[str]]]:
    try:
        keyset = jwt.PyJWKSet.from_json(text)
    except (jwt.PyJWTError, ValueError, json.JSONDecodeError) as exc:
        raise TokenConfigError(f"unusable JWKS file: {exc}") from None
    keys: dict[str | None, tuple[Any, list[str]]] = {}
    for jwk in keyset.keys:
        algorithm = jwk.algorithm_name
        if algorithm not in ("RS256", "ES256"):
            continue
        keys[jwk.key_id] = (jwk.key, [algorithm])
    if not keys:
        raise TokenConfigError("the JWKS file has no RS256 or ES256 key")
    return keys
