"""The files made from a model, all beside it and named after its file's stem: the one place that names them.

For `inswapper_128.onnx` (registry sha256 `e4a3f08c753c...`), on an NVIDIA H200 with TensorRT 10.9.0.34:

    inswapper_128.e4a3f08c753c.dynamic.onnx    batch-dynamic rewrite of a fixed-batch graph ("local" when
                                               the model has no known sha256)
    inswapper_128.fp16.onnx   + .fp16.json     FP16 variant and its record (engines.precision.variants)
    inswapper_128.int8.onnx   + .int8.json     INT8 QDQ variant and its record (for ONNX Runtime)
    inswapper_128.int8-trt.onnx + .json        INT8 QDQ in the form TensorRT parses (engines.precision.int8)
    inswapper_128.nvidia-h200.fp16.engine      TensorRT engine ...
    inswapper_128.nvidia-h200.fp16.json        ... and its manifest (engines.tensorrt.manifest)
    inswapper_128.nvidia-h200.int8.calib-<data digest>.trt10.9.0.34.cache
                                               TensorRT's INT8 calibration cache, for one set of
                                               calibration data and one TensorRT version
    inswapper_128.calibration.npz              calibration inputs made from real faces (CalibrationSet)
    timing.nvidia-h200.trt10.9.0.34.cache      TensorRT timing cache, shared by every model in the folder

These names are what existing model folders hold: changing one orphans the files already made.
"""

from __future__ import annotations

import glob
import re
from dataclasses import dataclass
from pathlib import Path

SHA_PREFIX = 12


def gpu_slug(gpu_name: str) -> str:
    """A file-name-safe form of a GPU name: "NVIDIA H200" -> "nvidia-h200"."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")
    return slug or "gpu"


def record_path(artifact: Path) -> Path:
    """The JSON sidecar of a variant (its record) or an engine (its manifest): `.json` for its last suffix."""
    return Path(artifact).with_suffix(".json")


def keyed_calibration_cache(engine: Path, data_digest: str, tensorrt_version: str) -> Path:
    """TensorRT's INT8 calibration cache beside `engine`, named after the calibration data's digest and the
    TensorRT version: a cache made from other data, or by another TensorRT, is never read."""
    engine = Path(engine)
    return engine.with_name(f"{engine.stem}.calib-{data_digest[:16]}.trt{tensorrt_version}.cache")


@dataclass(frozen=True, slots=True)
class ModelFiles:
    """The files of the model at `model` whose expected sha256 is `sha256` (None when nothing pins it)."""

    model: Path
    sha256: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "model", Path(self.model))

    @property
    def folder(self) -> Path:
        return self.model.parent

    @property
    def stem(self) -> str:
        return self.model.stem

    def _beside(self, name: str) -> Path:
        return self.model.with_name(name)

    @property
    def dynamic(self) -> Path:
        """Where the batch-dynamic rewrite of a fixed-batch graph is cached (named after the sha256 it was
        made from, so a new version of the model gets a new rewrite)."""
        return self._beside(f"{self.stem}.{(self.sha256 or 'local')[:SHA_PREFIX]}.dynamic.onnx")

    def variant(self, precision: str) -> Path:
        """The ONNX variant at `precision`: the model itself for fp32."""
        if precision == "fp32":
            return self.model
        return self._beside(f"{self.stem}.{precision}.onnx")

    @property
    def tensorrt_qdq(self) -> Path:
        """The INT8 QDQ graph made for TensorRT (symmetric, FP32 biases): `swapcast engines int8 --target
        tensorrt`."""
        return self._beside(f"{self.stem}.int8-trt.onnx")

    def variant_record(self, precision: str) -> Path:
        return record_path(self.variant(precision))

    def engine(self, gpu_name: str, precision: str) -> Path:
        """The TensorRT engine built from this model for one GPU model and precision."""
        return self._beside(f"{self.stem}.{gpu_slug(gpu_name)}.{precision}.engine")

    def engine_manifest(self, gpu_name: str, precision: str) -> Path:
        return record_path(self.engine(gpu_name, precision))

    def engines(self, precision: str | None = None) -> list[Path]:
        """The TensorRT engines built from this model that are on disk (for any GPU), sorted by name."""
        ending = f".{glob.escape(precision)}.engine" if precision is not None else ".engine"
        return sorted(self.folder.glob(f"{glob.escape(self.stem)}.*{ending}"))

    def calibration_cache(self, gpu_name: str, precision: str, data_digest: str, tensorrt_version: str) -> Path:
        """TensorRT's INT8 calibration cache for the engine of that GPU and precision, made from that data by
        that TensorRT (`engines.tensorrt.build` names it so from the engine it builds)."""
        return keyed_calibration_cache(self.engine(gpu_name, precision), data_digest, tensorrt_version)

    @property
    def calibration_data(self) -> Path:
        """The calibration inputs made for this model from real faces (a CalibrationSet, .npz)."""
        return self._beside(f"{self.stem}.calibration.npz")

    def timing_cache(self, gpu_name: str, tensorrt_version: str) -> Path:
        """TensorRT's timing cache, shared by every build in the folder for one GPU and TensorRT version."""
        return self.folder / f"timing.{gpu_slug(gpu_name)}.trt{tensorrt_version}.cache"
