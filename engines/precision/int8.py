"""INT8 variants of ONNX models: ONNX Runtime static quantization (QDQ) calibrated on real inputs.

Calibration data is a `CalibrationSet`: for one model, a list of input dicts (name -> array), saved and
loaded as one .npz file. That file is the calibration cache: the inputs are produced once (by the app,
from real face images, see `app.calibration`) and reused by every quantization and TensorRT build.

`quantize_int8` runs in three steps:

1. The graph is brought to opset 13 when it is older (per-channel QDQ needs DequantizeLinear's `axis`,
   which opset 11 lacks: ONNX Runtime refuses such a model at load) and pre-processed with ONNX
   Runtime's `quant_pre_process` (shape inference and basic graph optimisation).
2. Activation ranges are computed here with `create_calibrator`, so that each method gets sensible
   settings: `quantize_static` passes neither the histogram size nor the number of quantized bins to
   its Entropy calibrator, whose defaults (128 and 128) leave it no choice but the full range, the same
   as MinMax. Entropy here uses 512 bins (2048, TensorRT's figure, costs minutes on a 640x640 detector
   on two cores for no measured gain).
3. `quantize_static` writes the QDQ model from those ranges (handed over as its JSON range cache).

Two targets. `onnxruntime` (the `.int8.onnx` variant): unsigned activations with zero points and INT32
biases, what ONNX Runtime's CPU kernels suit. `tensorrt`: the QDQ form TensorRT's ONNX parser takes for
explicit quantization: signed symmetric activations and weights (zero point 0) and FP32 biases.
ONNX Runtime's `QuantizeBias` default adds INT32 `DequantizeLinear` nodes for biases, and TensorRT
accepts `DequantizeLinear` only on INT8/FP8 inputs (onnx-tensorrt's operator table; NVIDIA/TensorRT#4542),
so such a graph does not parse. `tensorrt_qdq_problems` names what TensorRT would refuse.

TensorRT 11 builds strongly typed networks: a layer runs in the type its ONNX tensors have, so the layers
of a QDQ graph that are not quantized (PReLU, Resize, Softmax, the bias adds after each convolution)
would run in FP32. `float16_rest` converts them to FP16: the graph is brought to opset 19 (where
Q/DQ scales may be FP16, so a DequantizeLinear feeds an FP16 convolution directly, with no Cast between
them to stop TensorRT fusing the pair) and converted with onnxconverter-common, inputs and outputs kept
FP32. Accuracy on real inputs is measured in the tests (tests/engines/test_int8_tensorrt.py).

The `onnxruntime` target stores weights in 7 bits (`reduce_range`). On x86 CPUs without VNNI (AVX2, and
AVX-512 without VNNI) ONNX Runtime multiplies unsigned activations by signed weights with an instruction
that adds pairs of products into a saturating 16-bit sum; full 8-bit weights overflow it. The same
reference-swapper INT8 file measured 20.6 dB PSNR against FP32 on an AVX2-only CPU and 25.6 dB on one with
VNNI; with 7-bit weights it passes the 22 dB floor on the AVX2 CPU. A variant is built once and may be
served on any CPU, so it is built to be correct on all of them. TensorRT's target keeps 8-bit weights
(its INT8 kernels do not saturate that way).

Measured here (ONNX Runtime 1.32, CPU, 32 calibration frames): per-channel weights matter most for the
RetinaFace detector (per-tensor lost one of six faces on the group photo in a trial; per-channel MinMax
finds all six with landmarks within 4 px); Percentile is about even with MinMax, Entropy clips the
regression heads' rare large values and moves landmarks further (7 px). Defaults are therefore MinMax
with per-channel weights.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import tempfile
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import onnx

from engines.atomic import atomic_path, replace_file
from engines.errors import ModelError
from engines.onnx_io import check_loads, fed_inputs, load_onnx

log = logging.getLogger(__name__)

Method = Literal["minmax", "entropy", "percentile"]
METHODS: tuple[str, ...] = get_args(Method)
QdqTarget = Literal["onnxruntime", "tensorrt"]
QDQ_TARGETS: tuple[str, ...] = get_args(QdqTarget)
QDQ_MIN_OPSET = 13
FP16_QDQ_OPSET = 19  # QuantizeLinear/DequantizeLinear take FP16 scales from opset 19 on
ENTROPY_BINS = 512
ENTROPY_QUANTIZED_BINS = 128
PERCENTILE = 99.999
PERCENTILE_BINS = 2048
CALIBRATION_CHUNK = 8
CALIBRATION_FORMAT = 1


@dataclass(frozen=True, eq=False)
class CalibrationSet:
    """Inputs to calibrate one model with: `samples[i]` maps every graph input to an array whose first axis
    is the batch (usually 1). `source` says how the data was made."""

    model: str
    samples: tuple[Mapping[str, np.ndarray], ...]
    source: str = ""

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError(f"calibration set for {self.model} has no samples")
        names = list(self.samples[0])
        for index, sample in enumerate(self.samples):
            if list(sample) != names:
                raise ValueError(f"calibration sample {index} has inputs {list(sample)}, sample 0 has {names}")

    @property
    def input_names(self) -> list[str]:
        return list(self.samples[0])

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def items(self) -> int:
        """Total number of batch rows across all samples."""
        return sum(int(next(iter(s.values())).shape[0]) for s in self.samples)

    def head(self, count: int) -> CalibrationSet:
        """The first `count` samples (all of them if there are fewer)."""
        return CalibrationSet(self.model, self.samples[: max(1, count)], self.source)

    def digest(self) -> str:
        """sha256 over input names, shapes, dtypes and bytes: names the data in caches and manifests."""
        return self._digest

    @cached_property
    def _digest(self) -> str:
        h = hashlib.sha256(self.model.encode())
        for sample in self.samples:
            for name, array in sample.items():
                a = np.ascontiguousarray(array)
                h.update(f"{name}|{a.dtype.str}|{a.shape}".encode())
                h.update(a.tobytes())
        return h.hexdigest()

    def save(self, path: Path) -> Path:
        """Write the set to `path` (.npz) atomically. Float32 arrays whose values FP16 holds exactly (the
        detector's integer pixel values minus a mean) are stored as FP16 and restored on load."""
        path = Path(path)
        arrays: dict[str, np.ndarray] = {}
        dtypes: list[list[str]] = []
        for i, sample in enumerate(self.samples):
            row = []
            for j, array in enumerate(sample.values()):
                a = np.ascontiguousarray(array)
                row.append(a.dtype.str)
                if a.dtype == np.float32:
                    half = a.astype(np.float16)
                    if np.array_equal(half.astype(np.float32), a):
                        a = half
                arrays[f"s{i}_{j}"] = a
            dtypes.append(row)
        meta = {
            "format": CALIBRATION_FORMAT,
            "model": self.model,
            "source": self.source,
            "inputs": self.input_names,
            "count": len(self.samples),
            "dtypes": dtypes,
            "digest": self.digest(),
        }
        arrays["meta"] = np.array(json.dumps(meta))
        with atomic_path(path, suffix=".npz") as tmp:  # numpy appends .npz to a name without it
            np.savez_compressed(tmp, **arrays)  # type: ignore[arg-type]
        return path

    @classmethod
    def load(cls, path: Path) -> CalibrationSet:
        """Read a set written by `save`; ModelError naming the file if it is missing or damaged."""
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(str(data["meta"]))
                if meta.get("format") != CALIBRATION_FORMAT:
                    raise ValueError(f"format {meta.get('format')!r}, expected {CALIBRATION_FORMAT}")
                names = list(meta["inputs"])
                samples = tuple(
                    {
                        name: data[f"s{i}_{j}"].astype(np.dtype(meta["dtypes"][i][j]), copy=False)
                        for j, name in enumerate(names)
                    }
                    for i in range(int(meta["count"]))
                )
        except FileNotFoundError:
            raise ModelError(f"no calibration data at {path}") from None
        except (OSError, ValueError, KeyError, TypeError, IndexError, zipfile.BadZipFile) as exc:
            raise ModelError(f"calibration data {path} is damaged ({exc}): delete it to make it again") from None
        loaded = cls(str(meta["model"]), samples, str(meta.get("source", "")))
        if meta.get("digest") and loaded.digest() != meta["digest"]:
            raise ModelError(f"calibration data {path} does not match its recorded digest: delete it to make it again")
        return loaded


class SetReader:
    """ONNX Runtime's CalibrationDataReader over a CalibrationSet (ORT accepts any object with
    `get_next`); `rewind` starts again from the first sample."""

    def __init__(self, calibration: CalibrationSet) -> None:
        self.calibration = calibration
        self._iter: Iterator[Mapping[str, np.ndarray]] = iter(calibration.samples)

    def get_next(self) -> dict[str, np.ndarray] | None:
        sample = next(self._iter, None)
        if sample is None:
            return None
        return {name: np.ascontiguousarray(array) for name, array in sample.items()}

    def rewind(self) -> None:
        self._iter = iter(self.calibration.samples)

    def __len__(self) -> int:
        return len(self.calibration)


@dataclass(frozen=True, slots=True)
class Int8Quantization:
    path: Path
    method: Method
    per_channel: bool
    symmetric_activations: bool
    samples: int
    calibration_digest: str
    opset: int
    target: QdqTarget = "onnxruntime"
    float16_rest: bool = False
    weight_bits: int = 8

    def options(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "float16_rest": self.float16_rest,
            "method": self.method,
            "per_channel": self.per_channel,
            "symmetric_activations": self.symmetric_activations,
            "calibration_samples": self.samples,
            "calibration_digest": self.calibration_digest,
            "opset": self.opset,
            "weight_bits": self.weight_bits,
        }


def _opset(model: onnx.ModelProto) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


def _calibrator_options(method: Method, symmetric: bool) -> dict[str, Any]:
    if method == "entropy":
        return {"num_bins": ENTROPY_BINS, "num_quantized_bins": ENTROPY_QUANTIZED_BINS, "symmetric": symmetric}
    if method == "percentile":
        return {"num_bins": PERCENTILE_BINS, "percentile": PERCENTILE, "symmetric": True}
    return {"symmetric": symmetric}


def quantize_int8(
    src: Path,
    dst: Path,
    calibration: CalibrationSet,
    *,
    method: Method = "minmax",
    per_channel: bool = True,
    symmetric_activations: bool = False,
    op_types: Sequence[str] | None = None,
    exclude_nodes: Sequence[str] = (),
    target: QdqTarget = "onnxruntime",
    float16_rest: bool = False,
) -> Int8Quantization:
    """Write a QDQ INT8 copy of `src` to `dst` (atomically), calibrated on `calibration`.

    Activations are unsigned 8-bit with a zero point (ONNX Runtime's recommendation for x86 CPUs) unless
    `symmetric_activations`, which gives signed 8-bit with zero point 0, the form TensorRT's explicit
    quantization accepts. Weights are signed and symmetric (7 bits for ONNX Runtime, 8 for TensorRT), per
    output channel with `per_channel`.
    `target="tensorrt"` implies symmetric activations and keeps biases FP32 (see the module notes); the
    result is checked with `tensorrt_qdq_problems`. `float16_rest` (TensorRT only) runs the layers that
    are not quantized in FP16 (see the module notes).
    """
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        create_calibrator,
        quant_pre_process,
        quantize_static,
        save_tensors_data,
    )

    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, not {method!r}")
    if target not in QDQ_TARGETS:
        raise ValueError(f"target must be one of {', '.join(QDQ_TARGETS)}, not {target!r}")
    symmetric_activations = symmetric_activations or target == "tensorrt"
    if float16_rest and target != "tensorrt":
        raise ValueError("float16_rest is for the TensorRT target (ONNX Runtime's CPU kernels want FP32 there)")
    src = Path(src)
    dst = Path(dst)
    model = load_onnx(src, f"quantize {src}")
    feed_names = [value.name for value in fed_inputs(model)]
    if sorted(feed_names) != sorted(calibration.input_names):
        raise ModelError(
            f"calibration data for {calibration.model} has inputs {calibration.input_names}; "
            f"{src.name} takes {feed_names}"
        )
    calibrate_method = {
        "minmax": CalibrationMethod.MinMax,
        "entropy": CalibrationMethod.Entropy,
        "percentile": CalibrationMethod.Percentile,
    }[method]
    opset = _opset(model)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".swapcast-int8-", dir=dst.parent) as tmp_dir:
        tmp = Path(tmp_dir)
        if opset < QDQ_MIN_OPSET:
            model = onnx.version_converter.convert_version(model, QDQ_MIN_OPSET)
            opset = QDQ_MIN_OPSET
        upgraded = tmp / "upgraded.onnx"
        onnx.save_model(model, str(upgraded))
        prepared = tmp / "prepared.onnx"
        try:
            quant_pre_process(str(upgraded), str(prepared), skip_symbolic_shape=True)
        except Exception as exc:  # pre-processing is an optimisation: quantize the model as it is
            log.warning("%s: quantization pre-processing failed (%s); quantizing without it", src.name, exc)
            prepared = upgraded

        calibrator = create_calibrator(
            str(prepared),
            list(op_types) if op_types else None,
            augmented_model_path=str(tmp / "augmented.onnx"),
            calibrate_method=calibrate_method,
            extra_options=_calibrator_options(method, symmetric_activations),
        )
        # In chunks: the histogram calibrators hold every activation of the samples they are given (the
        # full-size swapper's would not fit in memory for 64 samples). MinMax ranges merge exactly across
        # calls; histograms merge with re-binning, so their thresholds move slightly. (ONNX Runtime's own
        # `max_intermediate_outputs` drops the outputs it was holding instead of folding them in.)
        for start in range(0, len(calibration), CALIBRATION_CHUNK):
            chunk = CalibrationSet(calibration.model, calibration.samples[start : start + CALIBRATION_CHUNK])
            calibrator.collect_data(SetReader(chunk))
        ranges_path = tmp / "ranges.json"
        save_tensors_data(calibrator.compute_data(), ranges_path)
        del calibrator

        out = tmp / "quantized.onnx"
        reduce_range = target == "onnxruntime"  # 7-bit weights: see the module notes on CPUs without VNNI
        arguments: dict[str, Any] = {
            "calibration_data_reader": SetReader(calibration),
            "quant_format": QuantFormat.QDQ,
            "op_types_to_quantize": list(op_types) if op_types else None,
            "per_channel": per_channel,
            "activation_type": QuantType.QInt8 if symmetric_activations else QuantType.QUInt8,
            "weight_type": QuantType.QInt8,
            "reduce_range": reduce_range,
            "nodes_to_exclude": list(exclude_nodes),
            "calibrate_method": calibrate_method,
            "extra_options": _quantizer_options(target, symmetric_activations),
        }
        if "calibration_cache_path" in inspect.signature(quantize_static).parameters:
            arguments["calibration_cache_path"] = str(ranges_path)  # the ranges computed above
        else:  # older ONNX Runtime: quantize_static calibrates again with its own settings
            log.warning("this onnxruntime cannot take precomputed ranges; %s uses its default bins", method)
        try:
            quantize_static(str(prepared), str(out), **arguments)
        except Exception as exc:  # ORT raises plain Exceptions and ValueErrors for graphs it cannot quantize
            raise ModelError(f"cannot quantize {src.name} to INT8: {exc}") from exc
        if float16_rest:
            out = _float16_rest(out, tmp / "quantized-fp16.onnx")
            opset = max(opset, FP16_QDQ_OPSET)
        check_loads(out, f"the INT8 quantization of {src.name}", optimize=not float16_rest)
        if target == "tensorrt":
            problems = tensorrt_qdq_problems(onnx.load(str(out)))
            if problems:
                raise ModelError(f"the TensorRT QDQ form of {src.name} would not parse: {problems[0]}")
        replace_file(out, dst)
    return Int8Quantization(
        path=dst,
        method=method,
        per_channel=per_channel,
        symmetric_activations=symmetric_activations,
        samples=len(calibration),
        calibration_digest=calibration.digest(),
        opset=opset,
        target=target,
        float16_rest=float16_rest,
        weight_bits=7 if reduce_range else 8,
    )


def _float16_rest(src: Path, dst: Path) -> Path:
    from onnxconverter_common.float16 import convert_float_to_float16

    from engines.precision.fp16 import default_op_block_list

    model = onnx.load(str(src))
    if _opset(model) < FP16_QDQ_OPSET:
        model = onnx.version_converter.convert_version(model, FP16_QDQ_OPSET)
    converted = convert_float_to_float16(model, keep_io_types=True, op_block_list=default_op_block_list())
    onnx.save_model(converted, str(dst))
    return dst


def _quantizer_options(target: QdqTarget, symmetric_activations: bool) -> dict[str, Any]:
    """quantize_static's extra options: TensorRT's form keeps biases FP32 and every zero point at 0."""
    options: dict[str, Any] = {"ActivationSymmetric": symmetric_activations, "WeightSymmetric": True}
    if target == "tensorrt":
        options.update(
            QuantizeBias=False,  # INT32 bias DequantizeLinear: TensorRT's parser refuses it
            ActivationSymmetric=True,
            WeightSymmetric=True,
            DedicatedQDQPair=False,
            AddQDQPairToWeight=False,  # INT8 weight initializers behind a DequantizeLinear: what TensorRT folds
        )
    return options


TENSORRT_QDQ_TYPES = frozenset({onnx.TensorProto.INT8, onnx.TensorProto.FLOAT8E4M3FN})


def tensorrt_qdq_problems(model: onnx.ModelProto) -> list[str]:
    """What TensorRT's ONNX parser would refuse in a QDQ graph: a DequantizeLinear whose input is not INT8
    (or FP8), a QuantizeLinear that does not produce INT8, and a non-zero zero point. Empty: parseable."""
    from onnx import numpy_helper

    initializers = {init.name: init for init in model.graph.initializer}
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.graph.value_info, *inferred.graph.input]}
    types.update({name: init.data_type for name, init in initializers.items()})
    problems = []
    for node in model.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        label = node.name or node.output[0]
        zero_point = node.input[2] if len(node.input) > 2 else ""
        if zero_point in initializers:
            zp = numpy_helper.to_array(initializers[zero_point])
            if zp.dtype.kind in "iu" and zp.any():
                problems.append(f"{node.op_type} {label} has a non-zero zero point")
            produced = initializers[zero_point].data_type
            if node.op_type == "QuantizeLinear" and produced not in TENSORRT_QDQ_TYPES:
                problems.append(f"QuantizeLinear {label} produces {onnx.TensorProto.DataType.Name(produced)}")
        if node.op_type == "DequantizeLinear":
            elem = types.get(node.input[0])
            if elem is not None and elem not in TENSORRT_QDQ_TYPES:
                name = onnx.TensorProto.DataType.Name(elem)
                problems.append(f"DequantizeLinear {label} takes {name} (TensorRT takes INT8/FP8 only)")
    return problems
