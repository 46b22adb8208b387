"""Where reduced-precision variants of a model live, and the sidecar record each one carries.

Variants sit beside the model file they were made from, named after its stem:

    <stem>.fp16.onnx  + <stem>.fp16.json      FP16 (ONNX)
    <stem>.int8.onnx  + <stem>.int8.json      INT8 QDQ (ONNX), for ONNX Runtime
    <stem>.int8-trt.onnx + .json              INT8 QDQ in the form TensorRT parses (engines.precision.int8)
    <stem>.<gpu>.<precision>.engine + .json   TensorRT engines (see engines.tensorrt.manifest)

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

from engines.atomic import write_bytes_atomic
from engines.errors import ModelError

Precision = Literal["fp32", "fp16", "int8"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
RECORD_FORMAT = 1


def variant_path(model_path: Path, precision: Precision) -> Path:
    """`<stem>.<precision>.onnx` beside the model (`model_path` itself for fp32)."""
    model_path = Path(model_path)
    if precision == "fp32":
        return model_path
    return model_path.with_name(f"{model_path.stem}.{precision}.onnx")


def tensorrt_qdq_path(model_path: Path) -> Path:
    """`<stem>.int8-trt.onnx`: the INT8 QDQ graph made for TensorRT (symmetric, FP32 biases)."""
    model_path = Path(model_path)
    return model_path.with_name(f"{model_path.stem}.int8-trt.onnx")


def record_path(artifact: Path) -> Path:
    """The sidecar JSON of a variant or engine: the same name with `.json` for its suffix."""
    return Path(artifact).with_suffix(".json")


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


def write_json_atomic(path: Path, text: str) -> Path:
    """Write `text` to `path` through a temporary file in the same folder."""
    return write_bytes_atomic(Path(path), text.encode("utf-8"))


def write_record(variant: Path, record: VariantRecord) -> Path:
    return write_json_atomic(record_path(variant), record.to_json())


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
