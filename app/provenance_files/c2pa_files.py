"""C2PA manifests on files `swapcast swap` writes, and their validation (the maintained `c2pa-python` binding).

The manifest says what was done (opened the target, replaced a face: digital source type "composite
synthetic"), by which software version and swap engine, and when, with the target file as the parent
ingredient. c2pa-python 0.38 signs and reads MP4/MOV/M4V, JPEG, PNG and WebP among others (not Matroska or
WebM), with ES256/384/512, PS256/384/512 or Ed25519; the signer certificate must be an end-entity certificate
chaining to a CA (a self-signed leaf is refused)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from app.errors import UserError
from app.provenance.settings import ProvenanceSettings
from engines.atomic import atomic_path

MIME = {
    ".mp4": "video/mp4",
    ".m4v": "video/mp4",
    ".mov": "video/quicktime",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".png": "image/png",
    ".webp": "image/webp",
}
ALGORITHMS = ("es256", "es384", "es512", "ps256", "ps384", "ps512", "ed25519")
COMPOSITE_SYNTHETIC = "http://cv.iptc.org/newscodes/digitalsourcetype/compositeSynthetic"
TARGET_LABEL = "target"


def software_version() -> str:
    try:
        return metadata.version("swapcast")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def mime_of(path: Path) -> str:
    mime = MIME.get(path.suffix.lower())
    if mime is None:
        raise UserError(
            f"C2PA cannot be embedded in {path.suffix or 'files without a suffix'}: use one of "
            f"{', '.join(sorted(MIME))}, or set SWAPCAST_C2PA=false"
        )
    return mime


def manifest(*, output: Path, target: Path, engine: str, watermark: str | None, when: datetime) -> dict[str, Any]:
    agent = {"name": "swapcast", "version": software_version()}
    parameters: dict[str, Any] = {"engine": engine, "operation": "face replaced"}
    if watermark is not None:
        parameters["watermark"] = watermark
    return {
        "claim_generator_info": [agent],
        "title": output.name,
        "assertions": [
            {
                "label": "c2pa.actions",
                "data": {
                    "actions": [
                        {"action": "c2pa.opened", "parameters": {"ingredientIds": [TARGET_LABEL]}},
                        {
                            "action": "c2pa.edited",
                            "description": "face replaced",
                            "digitalSourceType": COMPOSITE_SYNTHETIC,
                            "softwareAgent": agent,
                            "when": when.isoformat(timespec="seconds"),
                            "parameters": parameters,
                        },
                    ]
                },
            }
        ],
    }


def _read(path: Path | None, what: str) -> bytes:
    if path is None:
        raise UserError(f"C2PA signing needs SWAPCAST_C2PA_{what.upper()}")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read the C2PA {what} {path}: {exc.strerror}") from None


def signing_configured(settings: ProvenanceSettings) -> bool:
    return settings.c2pa and settings.c2pa_cert is not None and settings.c2pa_key is not None


def sign_file(
    path: Path, *, target: Path, engine: str, settings: ProvenanceSettings, watermark: str | None = None
) -> None:
    """Embed a signed manifest into `path` (replaced atomically; on any failure `path` is removed, so no unsigned
    file is left where a signed one was asked for)."""
    import c2pa

    try:
        mime, target_mime = mime_of(path), MIME.get(target.suffix.lower())
        alg = settings.c2pa_alg.lower()
        if alg not in ALGORITHMS:
            raise UserError(f"unknown C2PA signing algorithm {settings.c2pa_alg!r}; use one of {', '.join(ALGORITHMS)}")
        info = c2pa.C2paSignerInfo(
            alg.encode(),
            _read(settings.c2pa_cert, "cert"),
            _read(settings.c2pa_key, "key"),
            settings.c2pa_tsa_url.encode() if settings.c2pa_tsa_url else None,
        )
        body = manifest(output=path, target=target, engine=engine, watermark=watermark, when=datetime.now(UTC))
        with c2pa.Signer.from_info(info) as signer, c2pa.Builder(body) as builder:
            ingredient = {"title": target.name, "relationship": "parentOf", "label": TARGET_LABEL}
            with target.open("rb") as source:
                builder.add_ingredient(ingredient, target_mime or "application/octet-stream", source)
            with atomic_path(path, suffix=path.suffix) as tmp, path.open("rb") as source, tmp.open("w+b") as dest:
                builder.sign(signer, mime, source, dest)
    except c2pa.C2paError as exc:
        path.unlink(missing_ok=True)
        raise UserError(f"C2PA signing failed: {exc}") from None
    except BaseException:
        path.unlink(missing_ok=True)
        raise


@dataclass
class VerifyReport:
    path: Path
    state: str  # Trusted, Valid, Invalid, or "none" when there is no manifest
    failures: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    generator: str | None = None
    trusted_required: bool = False

    @property
    def valid(self) -> bool:
        if self.trusted_required:
            return self.state == "Trusted"
        # Without trust anchors an unknown signer is the only failure a valid file may show.
        return self.state in ("Valid", "Trusted") and all(f == "signingCredential.untrusted" for f in self.failures)

    def lines(self) -> list[str]:
        out = [f"{self.path}: {'valid' if self.valid else 'NOT valid'} (C2PA state {self.state})"]
        if self.generator:
            out.append(f"made by: {self.generator}")
        if self.actions:
            out.append(f"actions: {', '.join(self.actions)}")
        if self.failures:
            out.append(f"failures: {', '.join(self.failures)}")
        return out


def verify_file(path: Path, *, trust_anchors: Path | None = None) -> VerifyReport:
    """Validate the manifest embedded in `path`; with `trust_anchors` the signer must chain to one of them."""
    import c2pa

    if not path.is_file():
        raise UserError(f"file not found: {path}")
    context = None
    if trust_anchors is not None:
        anchors = _read(trust_anchors, "trust anchors").decode(errors="replace")
        context = c2pa.Context(c2pa.Settings.from_dict({"trust": {"trust_anchors": anchors}}))
    try:
        with c2pa.Reader(str(path), context=context) as reader:
            state = reader.get_validation_state() or "Invalid"
            results = reader.get_validation_results() or {}
            store = json.loads(reader.json())
    except c2pa.C2paError.ManifestNotFound:
        return VerifyReport(path, "none", ["no C2PA manifest"], trusted_required=trust_anchors is not None)
    except c2pa.C2paError as exc:
        return VerifyReport(path, "Invalid", [str(exc).splitlines()[0]], trusted_required=trust_anchors is not None)
    failures = [f["code"] for f in results.get("activeManifest", {}).get("failure", [])]
    active = store.get("manifests", {}).get(store.get("active_manifest", ""), {})
    actions: list[str] = []
    for assertion in active.get("assertions", []):
        if str(assertion.get("label", "")).startswith("c2pa.actions"):
            for action in assertion.get("data", {}).get("actions", []):
                actions.append(str(action.get("description") or action.get("action")))
    generator = ", ".join(
        f"{g.get('name')} {g.get('version', '')}".strip() for g in active.get("claim_generator_info", [])
    )
    return VerifyReport(path, state, failures, actions, generator or None, trusted_required=trust_anchors is not None)
