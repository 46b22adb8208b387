"""Checks on stored identities, so that damage on disk is found at start-up and refused with a reason instead of
breaking the identity list or starting a session that returns no frames.

`parse_identity` validates `meta.json` strictly (types, ranges, id); `PreparedSpec` is what an engine's prepared
data looks like (shape, dtype), learnt by preparing a synthetic face once; `check_prepared` refuses arrays of
another shape or dtype, or with NaN or infinity; `audit` walks a store and names every damaged identity.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from app.identity.consent import Consent
from app.identity.images import FORMATS
from app.identity.record import Identity
from app.pipeline.align import TEMPLATES
from app.pipeline.types import Face

if TYPE_CHECKING:
    from app.pipeline.swap import SwapEngine

MAX_STORED_NAME = 1000
_REFERENCE_SIZE = 256


class DamagedIdentity(ValueError):
    """A stored identity whose files fail a check; the message says which and why."""


@dataclass(frozen=True)
class PreparedSpec:
    shape: tuple[int, ...]
    dtype: str

    @classmethod
    def of_engine(cls, engine: SwapEngine) -> PreparedSpec:
        """The engine's prepared layout. The mesh engine prepares only a face its landmark model finds, so its
        layout is its record type; the others show theirs on a grey picture with a face placed on the alignment
        template."""
        from app.pipeline.mesh import MeshEngine, source_record_dtype  # the landmark model's code, only when asked

        inner: object = engine
        while (wrapped := getattr(inner, "inner", None)) is not None:  # wrappers (the mouth mask) prepare as inner
            inner = wrapped
        if isinstance(inner, MeshEngine):
            return cls((1,), str(source_record_dtype(inner.align.size)))
        image = np.full((_REFERENCE_SIZE, _REFERENCE_SIZE, 3), 127, np.uint8)
        landmarks = (TEMPLATES["arcface_128"] * _REFERENCE_SIZE).astype(np.float32)
        box = np.array([0, 0, _REFERENCE_SIZE, _REFERENCE_SIZE], np.float32)
        data = engine.prepare(image, Face(box=box, score=1.0, landmarks=landmarks)).data
        return cls(tuple(int(n) for n in data.shape), str(data.dtype))


def check_prepared(data: np.ndarray, spec: PreparedSpec | None) -> None:
    """`DamagedIdentity` when the array is not what the engine prepares, or holds NaN or infinity."""
    if spec is not None and (tuple(data.shape) != spec.shape or str(data.dtype) != spec.dtype):
        raise DamagedIdentity(
            f"prepared data is {data.dtype}{list(data.shape)}, the engine prepares {spec.dtype}{list(spec.shape)}"
        )
    names = data.dtype.names
    for values in [data[name] for name in names] if names else [data]:  # a record (the mesh engine's): each field
        if values.dtype.kind not in "fiub":
            raise DamagedIdentity(f"prepared data has a non-numeric dtype {data.dtype}")
        if values.dtype.kind == "f" and not bool(np.isfinite(values).all()):
            raise DamagedIdentity("prepared data holds NaN or infinite values")


_OPTIONAL = {"owner", "photos"}  # absent in identities stored before owners, or several photos, were recorded
MAX_PHOTOS = 10  # photos one identity may be enrolled from
_RECORDS = {"consent"}  # checked by their own parser; absent in identities stored before consent was recorded


def _field_types() -> dict[str, tuple[type, ...]]:
    expected: dict[str, tuple[type, ...]] = {f.name: (str,) for f in fields(Identity) if f.name not in _RECORDS}
    expected.update(faces=(int,), width=(int,), height=(int,), face_index=(int, type(None)), owner=(str, type(None)))
    expected.update(photos=(int,))
    return expected


def parse_identity(raw: Any, identity_id: str) -> Identity:
    """The identity described by parsed `meta.json`; `DamagedIdentity` for anything missing, mistyped or out of
    range (a `width` of "abc", `faces` of null, an id that is not its directory's)."""
    if not isinstance(raw, dict):
        raise DamagedIdentity("metadata is not a JSON object")
    expected = _field_types()
    missing = sorted(set(expected) - set(raw) - _OPTIONAL)
    if missing:
        raise DamagedIdentity(f"metadata lacks {', '.join(missing)}")
    values: dict[str, Any] = {name: raw.get(name) for name in expected}
    values["photos"] = raw.get("photos", 1)
    for name, types in expected.items():
        value = values[name]
        if isinstance(value, bool) or not isinstance(value, types):
            raise DamagedIdentity(f"metadata field {name} has the wrong type ({type(value).__name__})")
    try:
        consent = Consent.from_json(raw["consent"]) if raw.get("consent") is not None else None
    except ValueError:
        raise DamagedIdentity("metadata has a malformed consent record") from None
    identity = Identity(**values, consent=consent)
    if identity.id != identity_id:
        raise DamagedIdentity("metadata does not match its directory")
    if identity.format not in FORMATS:
        raise DamagedIdentity("metadata names an unknown image format")
    if identity.faces < 1 or identity.width < 1 or identity.height < 1:
        raise DamagedIdentity("metadata has a face count or size below 1")
    if not 1 <= identity.photos <= MAX_PHOTOS:
        raise DamagedIdentity(f"metadata has {identity.photos} photos, not 1 to {MAX_PHOTOS}")
    if identity.face_index is not None and not 0 <= identity.face_index < identity.faces:
        raise DamagedIdentity("metadata chooses a face that does not exist")
    if len(identity.name) > MAX_STORED_NAME:
        raise DamagedIdentity("metadata has an over-long name")
    return identity


def read_identity(directory: Path) -> Identity:
    try:
        raw = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DamagedIdentity("meta.json is missing") from None
    except (OSError, ValueError):
        raise DamagedIdentity("meta.json is not readable JSON") from None
    return parse_identity(raw, directory.name)


def check_directory(directory: Path, spec: PreparedSpec | None = None, model_key_file: str | None = None) -> None:
    """`DamagedIdentity` with the first problem found in one identity's directory."""
    identity = read_identity(directory)
    for number, name in enumerate(identity.image_files, 1):
        photo = directory / name
        if not photo.is_file() or photo.stat().st_size == 0:
            which = "the photo" if identity.photos == 1 else f"photo {number} of {identity.photos}"
            raise DamagedIdentity(f"{which} is missing or empty")
    if not (directory / "thumb.jpg").is_file():
        raise DamagedIdentity("the thumbnail is missing")
    for path in sorted((directory / "prepared").glob("*.npy")):
        try:
            data = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError):
            raise DamagedIdentity(f"prepared data {path.name} is not readable") from None
        check_prepared(data, spec if path.name == model_key_file else None)
