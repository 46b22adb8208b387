"""Provenance settings (prefix SWAPCAST_): the watermark on every output, the visible label, C2PA signing."""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.provenance.embed import DEFAULT_STRENGTH


def default_data_dir() -> Path:
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "swapcast"


def host_server_id() -> int:
    """A 16-bit server id derived from the host name, used when none is configured."""
    return int.from_bytes(hashlib.sha256(socket.gethostname().encode()).digest()[:2], "big")


class ProvenanceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SWAPCAST_", extra="ignore")

    watermark: bool = Field(True, description="Put the invisible watermark on every output frame.")
    watermark_strength: float = Field(
        DEFAULT_STRENGTH, gt=0.0, le=8.0, description="Watermark strength, RMS grey levels."
    )
    # The mark's key: marks made with one key are read only with it. A deployment sets its own.
    watermark_key: str = Field(
        "swapcast",
        min_length=1,
        description="The watermark's key: marks are read only with the key that made them. Set your own.",
    )
    server_id: int | None = Field(
        None, ge=0, lt=1 << 16, description="16-bit server id in the watermark; unset: derived from the host name."
    )
    mark_registry: Path = Field(
        default_factory=lambda: default_data_dir() / "marks.jsonl",
        description="Where issued marks are recorded (session or stream, identity, owner).",
    )
    label: bool = Field(
        False,
        description=("Put the visible AI-generated label on every output, unless a session or stream asks otherwise."),
    )
    owner: str | None = Field(
        None,
        description=(
            "Owner of files `swapcast swap` writes when --owner is not given; unset: the operating-system user."
        ),
    )

    c2pa: bool = Field(
        True,
        description=("Sign files `swapcast swap` writes with a C2PA manifest, when a key and certificate are set."),
    )
    c2pa_cert: Path | None = Field(None, description="PEM certificate chain of the C2PA signer, signer first.")
    c2pa_key: Path | None = Field(None, description="PEM private key of the C2PA signer.")
    c2pa_alg: str = Field("es256", description="C2PA signing algorithm: es256/384/512, ps256/384/512 or ed25519.")
    c2pa_tsa_url: str | None = Field(None, description="Time-stamp authority for C2PA signatures; unset: none.")

    def resolved_server_id(self) -> int:
        return self.server_id if self.server_id is not None else host_server_id()
