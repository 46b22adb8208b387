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

    watermark: bool = True  # the invisible mark on every output frame
    watermark_strength: float = Field(DEFAULT_STRENGTH, gt=0.0, le=8.0)  # RMS grey levels
    # The mark's key: marks made with one key are read only with it. A deployment sets its own.
    watermark_key: str = Field("swapcast", min_length=1)
    server_id: int | None = Field(None, ge=0, lt=1 << 16)  # None: derived from the host name
    mark_registry: Path = Field(default_factory=lambda: default_data_dir() / "marks.jsonl")
    label: bool = False  # the visible "AI-generated" label, unless a session or stream asks otherwise
    owner: str | None = None  # owner of files `swapcast swap` writes, when `--owner` is not given (else the OS user)

    c2pa: bool = True  # sign files `swapcast swap` writes, when a key and certificate are set
    c2pa_cert: Path | None = None  # PEM certificate chain, signer first
    c2pa_key: Path | None = None  # PEM private key of the signer
    c2pa_alg: str = "es256"
    c2pa_tsa_url: str | None = None

    def resolved_server_id(self) -> int:
        return self.server_id if self.server_id is not None else host_server_id()
