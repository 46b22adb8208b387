"""Where reduced-precision variants of a model live, and the sidecar record each one carries.

Variants sit beside the model file they were made from, named after its stem (`ModelFiles.variant` and
`ModelFiles.variant_record` in engines.model_files: `<stem>.fp16.onnx` + `<stem>.fp16.json`, `<stem>.int8.onnx`
+ `<stem>.int8.json`; TensorRT engines, see engines.tensorrt.manifest, are named there too).

The record names the source's sha256, so a variant made from another version of the model is refused,
and the variant's own sha256, so a damaged or swapped file is refused too. It also keeps how the variant
was made and the quality measured against FP32 when it was made.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, get_args

from engines.atomic import write_text_atomic
from engines.errors import ModelError
from engines.model_files import record_path

Precision = Literal["fp32", "fp16", "int8"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
RECORD_FORMAT = 1


@dataclass(frozen=True)
class VariantRecord:
    """What an ONNX variant was made from and how (written beside it as JSON)."""

    model: str
    precision: str
    file: str
    sha256: str
    source_file: str
    source_sha256: str
    tool: str
    options: dict[str, Any] = field(default_factory=dict)
    quality: dict[str, Any] = field(default_factory=dict)
    created: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    format: int = RECORD_FORMAT

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, where: Path) -> VariantRecord:
        try:
            raw = json.loads(text)
            if not isinstance(raw, dict):
                raise TypeError("not a JSON object")
            if raw.get("format") != RECORD_FORMAT:
                raise ValueError(f"record format {raw.get('format')!r}, expected {RECORD_FORMAT}")
            return cls(**raw)
        except (ValueError, TypeError) as exc:
            raise ModelError(
                f"the variant record {where} is unreadable ({exc}): delete the variant and make it again"
            ) from None


def write_record(variant: Path, record: VariantRecord) -> Path:
    return write_text_atomic(record_path(variant), record.to_json())


def read_record(variant: Path) -> VariantRecord:
    """The record beside `variant`; ModelError when it is missing or unreadable."""
    path = record_path(variant)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelError(f"{Path(variant).name} has no record ({path.name}): make the variant again") from None
    except OSError as exc:
        raise ModelError(f"cannot read the variant record {path} ({exc})") from None
    return VariantRecord.from_json(text, path)


def check_variant(variant: Path, source_sha256: str | None) -> VariantRecord:
    """The record of `variant` if the variant belongs to the source with `source_sha256` and is intact.

    Raises ModelError with the reason otherwise (missing file or record, other source, damaged file).
    """
    from engines.store import check_file

    variant = Path(variant)
    if not variant.is_file():
        raise ModelError(f"no variant at {variant}")
    record = read_record(variant)
    if source_sha256 is not None and record.source_sha256 != source_sha256:
        raise ModelError(
            f"{variant.name} was made from another version of {record.source_file} "
            f"(sha256 {record.source_sha256[:12]}, the model now is {source_sha256[:12]}): make it again"
        )
    if not check_file(variant, record.sha256):
        raise ModelError(f"{variant.name} does not match the sha256 in its record: it is damaged, make it again")
    return record
