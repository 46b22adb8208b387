"""Access settings from the environment (prefix SWAPCAST_), validated once at start-up."""

import ipaddress
import os
import socket
from pathlib import Path

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_data_dir() -> Path:
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "swapcast"


def default_keys_file() -> Path:
    return default_data_dir() / "keys.json"


class AccessSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SWAPCAST_", extra="ignore")

    keys_file: Path = Field(
        default_factory=default_keys_file, description="The API keys file `swapcast keys` writes (salted hashes only)."
    )

    # JWTs from an identity provider: one of a shared HS256 secret, a PEM public key (RS256/ES256), or a JWKS file.
    jwt_secret: SecretStr | None = Field(None, description="HS256 secret (at least 32 bytes) to verify JWTs with.")
    jwt_public_key_file: Path | None = Field(
        None, description="PEM public key to verify JWTs with (RS256 or ES256 by key type)."
    )
    jwt_jwks_file: Path | None = Field(None, description="JWKS file to verify JWTs with (keys by kid).")
    jwt_issuer: str | None = Field(None, description="The iss a JWT must carry.")
    jwt_audience: str | None = Field(None, description="The aud a JWT must carry; required with any JWT key.")
    jwt_leeway_s: float = Field(30.0, ge=0.0, le=600.0, description="Clock leeway for a JWT's exp and nbf, in seconds.")

    # Serve without any credential on a non-loopback address (everyone acts as the local principal).
    allow_anonymous: bool = Field(
        False,
        description=("Serve without any credential on a non-loopback address (everyone acts as the local principal)."),
    )
    # Host header values accepted; None = the bind host, the public host, localhost, 127.0.0.1 and ::1.
    allowed_hosts: list[str] | None = Field(
        None,
        description=(
            "Host header values accepted (JSON list); unset: the bind host, the public host, "
            "localhost, 127.0.0.1, ::1 (and the machine's names on a wildcard bind)."
        ),
    )
    # Origins a browser page may call the API from (CORS); none by default: only the server's own page.
    cors_origins: list[str] = Field(
        default_factory=list,
        description=("Origins a browser page may call the API from (JSON list); none: only the server's own page."),
    )
    # Wait this long per recent authentication failure from one address (capped), before answering.
    auth_failure_delay_s: float = Field(
        0.2,
        ge=0.0,
        le=5.0,
        description=("Delay per authentication failure from one address in the last minute, before answering."),
    )
    auth_failure_delay_max_s: float = Field(2.0, ge=0.0, le=30.0, description="Cap of that delay.")

    # One JSON line per security event: "stdout", a file path, or None for no audit log.
    audit_log: str | None = Field(
        None, description="One JSON line per security event: stdout or a file path; unset: off."
    )

    # Each RTSP output gets its own login, handed only to its owner (OBS and ffmpeg: rtsp://user:pass@host/...).
    rtsp_auth: bool = Field(
        True, description=("Give each RTSP output its own login (Digest authentication), handed only to its owner.")
    )

    # Serve /metrics without credentials on this loopback-only port as well (the usual Prometheus set-up).
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="Also serve /metrics without credentials on this loopback-only port."
    )

    tls_cert: Path | None = Field(None, description="TLS certificate (PEM) to serve HTTPS with; with SWAPCAST_TLS_KEY.")
    tls_key: Path | None = Field(None, description="TLS private key (PEM); with SWAPCAST_TLS_CERT.")

    @model_validator(mode="after")
    def _one_jwt_key_source(self) -> "AccessSettings":
        sources = [s for s in (self.jwt_secret, self.jwt_public_key_file, self.jwt_jwks_file) if s is not None]
        if len(sources) > 1:
            raise ValueError("set one of SWAPCAST_JWT_SECRET, SWAPCAST_JWT_PUBLIC_KEY_FILE, SWAPCAST_JWT_JWKS_FILE")
        if self.jwt_secret is not None and len(self.jwt_secret.get_secret_value().encode()) < 32:
            raise ValueError("SWAPCAST_JWT_SECRET must be at least 32 bytes (shorter HS256 keys are weak)")
        if sources and not self.jwt_audience:
            # A token minted for another service of the same provider must not work here.
            raise ValueError("set SWAPCAST_JWT_AUDIENCE: tokens are accepted only for this server's audience")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("set both SWAPCAST_TLS_CERT and SWAPCAST_TLS_KEY, or neither")
        return self

    @property
    def jwt_configured(self) -> bool:
        return any(s is not None for s in (self.jwt_secret, self.jwt_public_key_file, self.jwt_jwks_file))

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(settings: AccessSettings, bind_host: str, public_host: str | None) -> list[str]:
    """Host header values to accept: as set, or this server's own names (a wildcard bind adds the machine's
    host name and addresses, as other machines will call it)."""
    if settings.allowed_hosts is not None:
        return [h.strip("[]").lower() for h in settings.allowed_hosts]
    names = ["localhost", "127.0.0.1", "::1", bind_host, public_host or ""]
    if bind_host in ("0.0.0.0", "::", ""):
        names += machine_names()
    hosts: list[str] = []
    for name in names:
        name = name.strip("[]").lower()
        if name and name not in ("0.0.0.0", "::") and name not in hosts:
            hosts.append(name)
    return hosts


def machine_names() -> list[str]:
    try:
        hostname, aliases, addresses = socket.gethostbyname_ex(socket.gethostname())
    except OSError:  # no resolvable host name: only the configured names
        return []
    return [hostname, *aliases, *addresses]
