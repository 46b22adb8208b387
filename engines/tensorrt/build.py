"""Build a serialized TensorRT engine from an ONNX model, with its sidecar manifest.

* Explicit batch, one optimisation profile: batch 1..max_batch (tuned for `opt_batch`) so the dynamic
  batcher can send any batch up to max; other free axes (the detector's and the enhancer's height and
  width) get the ranges the caller gives.
* Precision. TensorRT 10 ("builder-flags" mode): FP16 and INT8 are builder flags on the FP32 network;
  INT8 is calibrated by an entropy calibrator (`engines.tensorrt.calibrator`) fed by the CalibrationSet,
  with a calibration cache file, and FP16 is allowed beside it for layers without INT8 kernels.
  TensorRT 11 removed those flags and calibrators ("strongly-typed" mode): the network is parsed from
  an FP16 ONNX (`engines.precision.fp16`, inputs and outputs kept FP32) or from the TensorRT form of the
  QDQ ONNX (`engines.precision.int8`, target "tensorrt": symmetric, FP32 biases, the layers that are
  not quantized in FP16), made here from the same source and calibration data.
  INT8 calibration (TensorRT 10) feeds batches no larger than any input's profile allows, and caches
  its result in `calibration_cache`, which callers name with `ModelFiles.calibration_cache`: keyed by
  the calibration data's digest and the TensorRT version.
* A timing cache file shared between builds on one GPU and TensorRT version, read before and written
  after each build; an unreadable or mismatched one is replaced by a fresh one (said in the log).
* Cubic Resize: where TensorRT's parser refuses the model and it has cubic Resize nodes (Real-ESRGAN's
  compact nets), it is parsed again with those made linear (`engines.resize_modes`: PSNR 52-54 dB from
  the cubic output, measured) and the manifest records the rewrite.
* The engine and the timing cache are written with the shared atomic writer (`engines.atomic`), then
  the manifest (`engines.tensorrt.manifest`).

`tensorrt` and the CUDA bindings are imported only when a build starts; on a machine without them the
build fails with one ModelError line saying what to install.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import onnx

from engines.atomic import write_bytes_atomic
from engines.errors import ModelError
from engines.precision.int8 import CalibrationSet
from engines.precision.variants import Precision
from engines.resize_modes import cubic_resizes, with_linear_resize
from engines.tensorrt.manifest import (
    EngineManifest,
    ProfileShape,
    import_tensorrt,
    probe_platform,
    write_manifest,
)

log = logging.getLogger(__name__)

EnginePrecision = Precision  # a TensorRT plan is built at one of the variant precisions
DimRange = tuple[int, int, int]  # min, opt, max


@dataclass(frozen=True)
class BuildOptions:
    precision: EnginePrecision = "fp16"
    max_batch: int = 32
    opt_batch: int | None = None  # default: min(8, max_batch)
    dims: Mapping[str, DimRange] = field(default_factory=dict)  # symbolic dim name -> (min, opt, max)
    workspace_gib: float = 4.0
    timing_cache: Path | None = None
    calibration: CalibrationSet | None = None
    calibration_batch: int = 8
    calibration_cache: Path | None = None  # name it with ModelFiles.calibration_cache: keyed by data and TensorRT
    optimization_level: int | None = None  # TensorRT's builder optimisation level 0-5 (None: its default, 3)


def graph_inputs(model: onnx.ModelProto) -> dict[str, list[int | str]]:
    """Each fed input's shape: ints for fixed axes, the symbol (or "?") for free ones."""
    initializers = {init.name for init in model.graph.initializer}
    shapes: dict[str, list[int | str]] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dims: list[int | str] = []
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_value"):
                dims.append(int(dim.dim_value))
            else:
                dims.append(dim.dim_param or "?")
        shapes[value.name] = dims
    return shapes


def profile_shapes(
    inputs: Mapping[str, list[int | str]],
    *,
    max_batch: int,
    opt_batch: int | None = None,
    dims: Mapping[str, DimRange] | None = None,
) -> dict[str, ProfileShape]:
    """The optimisation profile for `inputs` (from `graph_inputs`).

    Axis 0 is the batch: 1..max_batch, tuned for `opt_batch` (default min(8, max_batch)); a graph whose
    batch is fixed at 1 gets 1..1. Other fixed axes stay as they are; a free axis takes its range from
    `dims`, by symbol or by "input:axis". ValueError names any free axis left without a range.
    """
    if max_batch < 1:
        raise ValueError(f"max_batch must be at least 1, not {max_batch}")
    opt = min(opt_batch if opt_batch is not None else 8, max_batch)
    ranges = dict(dims or {})
    profiles = {}
    for name, shape in inputs.items():
        if not shape:
            raise ValueError(f"input {name!r} is a scalar: no batch axis to build a profile on")
        axes: list[DimRange] = []
        batch = shape[0]
        if isinstance(batch, int) and batch != 1:
            raise ValueError(f"input {name!r} has a fixed batch of {batch}: make the graph batch-dynamic first")
        axes.append((1, 1, 1) if isinstance(batch, int) else (1, max(1, opt), max_batch))
        for axis, dim in enumerate(shape[1:], start=1):
            if isinstance(dim, int):
                axes.append((dim, dim, dim))
                continue
            chosen = ranges.get(f"{name}:{axis}") or ranges.get(dim)
            if chosen is None:
                raise ValueError(
                    f"input {name!r} axis {axis} ({dim!r}) is free: give its min, opt and max (dims[{dim!r}])"
                )
            axes.append((int(chosen[0]), int(chosen[1]), int(chosen[2])))
        low, mid, high = zip(*axes, strict=True)
        profiles[name] = ProfileShape(tuple(low), tuple(mid), tuple(high))
    return profiles


def build_mode(trt: Any) -> Literal["builder-flags", "strongly-typed"]:
    """TensorRT 10 still has the FP16/INT8 builder flags; 11 only builds strongly typed networks."""
    if hasattr(trt.BuilderFlag, "FP16") and hasattr(trt, "IInt8EntropyCalibrator2"):
        return "builder-flags"
    return "strongly-typed"


def _parse(trt: Any, builder: Any, logger: Any, source: Path, strongly_typed: bool) -> Any:
    flags = 0
    creation = getattr(trt, "NetworkDefinitionCreationFlag", None)
    if strongly_typed and creation is not None and hasattr(creation, "STRONGLY_TYPED"):
        flags |= 1 << int(creation.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(source)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        first = errors[0].splitlines()[0] if errors else "no error recorded"
        raise ModelError(f"TensorRT cannot parse {source.name}: {first} ({len(errors)} errors)")
    return network, parser


def _strongly_typed_source(source: Path, precision: EnginePrecision, options: BuildOptions, work: Path) -> Path:
    """The ONNX TensorRT 11 builds from: FP16 for fp16, QDQ (symmetric) for int8, the source for fp32."""
    if precision == "fp16":
        from engines.precision.fp16 import convert_fp16

        return convert_fp16(source, work / f"{source.stem}.fp16.onnx").path
    if precision == "int8":
        from engines.precision.int8 import quantize_int8

        if options.calibration is None:
            raise ModelError("an INT8 engine needs calibration data")
        return quantize_int8(
            source, work / f"{source.stem}.qdq.onnx", options.calibration, target="tensorrt", float16_rest=True
        ).path
    return source


def build_engine(
    source: Path,
    engine: Path,
    *,
    model: str,
    source_sha256: str,
    options: BuildOptions,
) -> EngineManifest:
    """Build `engine` from the ONNX `source` (whose registry sha256 is `source_sha256`), write it and its
    manifest, and return the manifest. ModelError on any failure, with nothing left at `engine`."""
    trt = import_tensorrt()
    platform = probe_platform()
    source = Path(source)
    engine = Path(engine)
    precision = options.precision
    if precision == "int8" and options.calibration is None:
        raise ModelError(f"an INT8 engine for {model} needs calibration data")
    profiles = profile_shapes(
        graph_inputs(onnx.load(str(source), load_external_data=False)),
        max_batch=options.max_batch,
        opt_batch=options.opt_batch,
        dims=options.dims,
    )
    mode = build_mode(trt)
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    engine.parent.mkdir(parents=True, exist_ok=True)
    calibrator = None
    with tempfile.TemporaryDirectory(prefix=".swapcast-trt-", dir=engine.parent) as tmp:
        strongly_typed = mode == "strongly-typed"
        parse_from = _strongly_typed_source(source, precision, options, Path(tmp)) if strongly_typed else source
        network, _parser, rewrites = _parse_or_fall_back(trt, builder, logger, parse_from, strongly_typed, Path(tmp))
        inputs = tuple(network.get_input(i).name for i in range(network.num_inputs))
        outputs = tuple(network.get_output(i).name for i in range(network.num_outputs))
        if set(inputs) != set(profiles):
            raise ModelError(f"TensorRT sees inputs {list(inputs)} in {source.name}, ONNX declares {list(profiles)}")

        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(options.workspace_gib * (1 << 30)))
        if options.optimization_level is not None:  # lower: faster builds, fewer tactics tried
            config.builder_optimization_level = options.optimization_level
        profile = builder.create_optimization_profile()
        for name, shape in profiles.items():
            profile.set_shape(name, shape.min, shape.opt, shape.max)
        config.add_optimization_profile(profile)

        if mode == "builder-flags" and precision in ("fp16", "int8"):
            config.set_flag(trt.BuilderFlag.FP16)
        if mode == "builder-flags" and precision == "int8":
            calibrator = _attach_calibrator(trt, builder, config, profiles, options, options.calibration_cache)

        _use_timing_cache(config, options.timing_cache)

        log.info("building %s (%s, %s) on %s; this takes minutes", engine.name, precision, mode, platform.gpu_name)
        try:
            serialized = builder.build_serialized_network(network, config)
        finally:
            if calibrator is not None:
                calibrator.free()
        if calibrator is not None:
            calibrator.feed.raise_error()  # what TensorRT swallowed inside get_batch
        if serialized is None:
            raise ModelError(f"TensorRT could not build an engine from {source.name} (see its log above)")
        data = bytes(memoryview(serialized))
        write_bytes_atomic(engine, data)
        if options.timing_cache is not None:
            write_bytes_atomic(options.timing_cache, bytes(memoryview(config.get_timing_cache().serialize())))

    manifest = EngineManifest(
        model=model,
        precision=precision,
        source_file=source.name,
        source_sha256=source_sha256,
        engine_sha256=hashlib.sha256(data).hexdigest(),
        tensorrt_version=platform.tensorrt_version,
        gpu_name=platform.gpu_name,
        compute_capability=platform.compute_capability,
        build_mode=mode,
        inputs=inputs,
        outputs=outputs,
        profiles=profiles,
        calibration=options.calibration.digest() if precision == "int8" and options.calibration else None,
        rewrites=tuple(rewrites),
    )
    write_manifest(engine, manifest)
    return manifest


def calibration_batch_size(options: BuildOptions, profiles: Mapping[str, ProfileShape]) -> int:
    """Items per calibration batch: as asked, but no more than the data has or any input's profile takes."""
    assert options.calibration is not None
    largest = min(shape.max[0] for shape in profiles.values())
    return max(1, min(options.calibration_batch, largest, options.calibration.items))


def _attach_calibrator(
    trt: Any,
    builder: Any,
    config: Any,
    profiles: Mapping[str, ProfileShape],
    options: BuildOptions,
    cache_path: Path | None,
) -> Any:
    from engines.tensorrt.calibrator import CalibrationBatches, CalibrationCache, entropy_calibrator

    assert options.calibration is not None
    batch = calibration_batch_size(options, profiles)
    batches = CalibrationBatches(options.calibration, batch, list(profiles), fill_last=True)
    calibration_profile = builder.create_optimization_profile()
    for name, shape in profiles.items():
        fixed = (batch, *batches.item_shape(name))
        if not shape.accepts(fixed):
            raise ModelError(f"calibration items of {name!r} have shape {fixed[1:]}, outside the profile {shape.max}")
        calibration_profile.set_shape(name, fixed, fixed, fixed)
    config.set_flag(trt.BuilderFlag.INT8)
    config.set_calibration_profile(calibration_profile)
    calibrator = entropy_calibrator(batches, CalibrationCache(cache_path))
    config.int8_calibrator = calibrator
    return calibrator


def _use_timing_cache(config: Any, path: Path | None) -> None:
    """Give the build the timing cache at `path` (a fresh one when there is none, or when TensorRT cannot
    read or will not use what is there: it is rewritten after the build)."""
    data = b""
    if path is not None:
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            data = b""
    if data:
        try:
            cache = config.create_timing_cache(data)
            if cache is not None and config.set_timing_cache(cache, False):
                return
            why = "TensorRT did not accept it"
        except Exception as exc:  # TensorRT raises RuntimeError/TypeError for a damaged blob
            why = f"{type(exc).__name__}: {exc}"
        log.warning("timing cache %s is unusable (%s); starting a fresh one", path, why)
    config.set_timing_cache(config.create_timing_cache(b""), False)


def _parse_or_fall_back(
    trt: Any, builder: Any, logger: Any, source: Path, strongly_typed: bool, work: Path
) -> tuple[Any, Any, list[str]]:
    """Parse `source`; where TensorRT refuses it and it has cubic Resize nodes, parse a copy with those made
    linear instead. Returns (network, parser, rewrites made)."""
    try:
        network, parser = _parse(trt, builder, logger, source, strongly_typed)
        return network, parser, []
    except ModelError as refused:
        model = onnx.load(str(source))
        cubic = cubic_resizes(model)
        if not cubic:
            raise
        linear = work / f"{source.stem}.linear-resize.onnx"
        onnx.save_model(with_linear_resize(model), str(linear))
        log.warning("%s; parsing again with %d cubic Resize nodes made linear", refused, len(cubic))
        network, parser = _parse(trt, builder, logger, linear, strongly_typed)
        return network, parser, [f"Resize cubic->linear ({len(cubic)} nodes)"]
