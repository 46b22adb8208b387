"""JWTs from an identity provider: good tokens give a principal with their scopes; expired, not yet valid,
wrong audience or issuer, unsigned (`alg: none`), HS/RS-confused and forged tokens are refused."""

import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from app.auth.settings import AccessSettings
from app.auth.tokens import TokenConfigError, TokenRejected, TokenVerifier

SECRET = "x" * 40
ISSUER = "https://id.example"
AUDIENCE = "swapcast"


def claims(**extra: Any) -> dict[str, Any]:
    now = int(time.time())
    body: dict[str, Any] = {"sub": "carol", "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 300}
    body.update(extra)
    return body


def hs_verifier(**extra: Any) -> TokenVerifier:
    return TokenVerifier(
        AccessSettings(jwt_secret=SECRET, jwt_issuer=ISSUER, jwt_audience=AUDIENCE, jwt_leeway_s=5, **extra)
    )


def test_a_good_token_names_the_subject_and_its_known_scopes() -> None:
    verifier = hs_verifier()
    found = verifier.verify(jwt.encode(claims(scope="sessions identities:read unknown:x"), SECRET, "HS256"))
    assert found.subject == "carol" and found.scopes == {"sessions", "identities:read"}
    as_list = verifier.verify(jwt.encode(claims(scp=["streams", "admin"]), SECRET, "HS256"))
    assert as_list.scopes == {"streams", "admin"}


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (claims(exp=int(time.time()) - 60), "expired"),
        (claims(nbf=int(time.time()) + 120), "not yet valid"),
        (claims(aud="another-service"), "another audience"),
        (claims(iss="https://evil.example"), "another issuer"),
        ({k: v for k, v in claims().items() if k != "exp"}, "exp"),
        ({k: v for k, v in claims().items() if k != "sub"}, "sub"),
    ],
    ids=["expired", "not-yet-valid", "wrong-audience", "wrong-issuer", "no-exp", "no-sub"],
)
def test_invalid_claims_are_refused(body: dict[str, Any], reason: str) -> None:
    with pytest.raises(TokenRejected, match=reason):
        hs_verifier().verify(jwt.encode(body, SECRET, "HS256"))


def test_expiry_within_the_leeway_is_accepted() -> None:
    assert hs_verifier().verify(jwt.encode(claims(exp=int(time.time()) - 2), SECRET, "HS256")).subject == "carol"


def test_forged_and_unsigned_tokens_are_refused() -> None:
    verifier = hs_verifier()
    with pytest.raises(TokenRejected, match="invalid token"):
        verifier.verify(jwt.encode(claims(), "y" * 40, "HS256"))
    unsigned = jwt.encode(claims(), None, "none")
    with pytest.raises(TokenRejected, match="algorithm not allowed"):
        verifier.verify(unsigned)
    with pytest.raises(TokenRejected, match="malformed"):
        verifier.verify("not.a.token")


def pem_public(key: Any) -> bytes:
    return bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def test_rs256_public_key_accepts_its_tokens_and_refuses_hs256_signed_with_the_public_key(tmp_path: Path) -> None:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public_file = tmp_path / "idp.pem"
    public_file.write_bytes(pem_public(private))
    verifier = TokenVerifier(AccessSettings(jwt_public_key_file=public_file, jwt_audience=AUDIENCE))
    assert verifier.verify(jwt.encode(claims(), private, "RS256")).subject == "carol"
    # The RS/HS confusion: an HS256 token whose HMAC key is the server's public key. PyJWT refuses to sign
    # with a PEM key as an HMAC secret, so it is made by hand as an attacker would.
    import base64
    import hashlib
    import hmac

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps(claims()).encode())
    signature = hmac.new(public_file.read_bytes(), f"{head}.{body}".encode(), hashlib.sha256).digest()
    with pytest.raises(TokenRejected, match="algorithm not allowed"):
        verifier.verify(f"{head}.{body}.{b64(signature)}")
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with pytest.raises(TokenRejected, match="invalid token"):
        verifier.verify(jwt.encode(claims(), other, "RS256"))


def test_es256_jwks_file_picks_the_key_by_kid(tmp_path: Path) -> None:
    first = ec.generate_private_key(ec.SECP256R1())
    second = ec.generate_private_key(ec.SECP256R1())
    jwks = {"keys": []}
    for kid, key in (("one", first), ("two", second)):
        jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
        jwks["keys"].append({**jwk, "kid": kid, "alg": "ES256", "use": "sig"})
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(jwks))
    verifier = TokenVerifier(AccessSettings(jwt_jwks_file=path, jwt_audience=AUDIENCE))
    assert verifier.verify(jwt.encode(claims(), second, "ES256", headers={"kid": "two"})).subject == "carol"
    with pytest.raises(TokenRejected, match="invalid token"):
        verifier.verify(jwt.encode(claims(), first, "ES256", headers={"kid": "two"}))
    with pytest.raises(TokenRejected, match="unknown signing key"):
        verifier.verify(jwt.encode(claims(), first, "ES256", headers={"kid": "three"}))


def test_unusable_key_settings_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("not a key")
    with pytest.raises(TokenConfigError, match="not a PEM public key"):
        TokenVerifier(AccessSettings(jwt_public_key_file=bad, jwt_audience=AUDIENCE))
    with pytest.raises(ValueError, match="at least 32 bytes"):
        AccessSettings(jwt_secret="short")
    with pytest.raises(ValueError, match="set one of"):
        AccessSettings(jwt_secret=SECRET, jwt_jwks_file=bad)
    with pytest.raises(ValueError, match="SWAPCAST_JWT_AUDIENCE"):
        AccessSettings(jwt_secret=SECRET)
