"""ICE servers for the web page: STUN URLs as configured, and TURN with credentials, either static or minted
per request from a secret shared with the TURN server (coturn's `use-auth-secret`, the "TURN REST API"
scheme: username `<expiry unix time>:<label>`, password base64(HMAC-SHA1(secret, username)))."""

import base64
import hashlib
import hmac
import time
from typing import Any

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

TURN_SCHEMES = ("turn:", "turns:")


class IceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SWAPCAST_", extra="ignore")

    turn_urls: list[str] = Field(
        default_factory=list,
        description=(
            "TURN URLs handed to the page (JSON list of turn: or turns: URLs, e.g. "
            '["turn:turn.example.org:3478?transport=udp"]); they need a secret or a static '
            "credential."
        ),
    )
    turn_secret: SecretStr | None = Field(
        None,
        description=(
            "Secret shared with the TURN server (coturn's static-auth-secret): credentials are minted per request."
        ),
    )
    turn_username: str | None = Field(
        None, description="Static TURN username (with SWAPCAST_TURN_CREDENTIAL), instead of a shared secret."
    )
    turn_credential: SecretStr | None = Field(None, description="Static TURN password (with SWAPCAST_TURN_USERNAME).")
    # A TURN server cannot be told that a key was revoked: this is how long a minted login outlives its key.
    turn_ttl_s: int = Field(3600, ge=60, description="How long minted TURN credentials are valid, in seconds.")
    turn_ttl_max_h: float = Field(
        12.0, gt=0, le=24, description="The longest SWAPCAST_TURN_TTL_S allowed, in hours (at most 24)."
    )

    @field_validator("turn_urls")
    @classmethod
    def _turn_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(TURN_SCHEMES):
                raise ValueError(f"{url!r} is not a turn: or turns: URL")
        return urls

    @model_validator(mode="after")
    def _one_kind_of_credential(self) -> "IceSettings":
        static = self.turn_username is not None or self.turn_credential is not None
        if static and self.turn_secret is not None:
            raise ValueError("set either SWAPCAST_TURN_SECRET or SWAPCAST_TURN_USERNAME/_CREDENTIAL, not both")
        if static and (self.turn_username is None or self.turn_credential is None):
            raise ValueError("SWAPCAST_TURN_USERNAME and SWAPCAST_TURN_CREDENTIAL go together")
        if self.turn_urls and not static and self.turn_secret is None:
            raise ValueError("TURN URLs need credentials: SWAPCAST_TURN_SECRET or SWAPCAST_TURN_USERNAME/_CREDENTIAL")
        if self.turn_ttl_s > self.turn_ttl_max_h * 3600:
            raise ValueError(
                f"SWAPCAST_TURN_TTL_S={self.turn_ttl_s} is longer than SWAPCAST_TURN_TTL_MAX_H "
                f"({self.turn_ttl_max_h:g} h)"
            )
        return self


def mint_turn_credential(secret: str, label: str, ttl_s: int, now: float | None = None) -> tuple[str, str]:
    """A username valid until now + ttl_s and its password, as a TURN server sharing `secret` checks them."""
    expiry = int(now if now is not None else time.time()) + ttl_s
    username = f"{expiry}:{label}"
    digest = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return username, base64.b64encode(digest).decode()


def client_ice_servers(stun_urls: list[str], ice: IceSettings, label: str = "swapcast") -> list[dict[str, Any]]:
    """The `iceServers` list for an RTCPeerConnection."""
    servers: list[dict[str, Any]] = [{"urls": [url]} for url in stun_urls if url.startswith(("stun:", "stuns:"))]
    if ice.turn_urls:
        if ice.turn_secret is not None:
            username, credential = mint_turn_credential(ice.turn_secret.get_secret_value(), label, ice.turn_ttl_s)
        else:
            assert ice.turn_username is not None and ice.turn_credential is not None  # the validator checked
            username, credential = ice.turn_username, ice.turn_credential.get_secret_value()
        servers.append({"urls": list(ice.turn_urls), "username": username, "credential": credential})
    return servers
