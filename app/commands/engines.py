"""`swapcast engines`: reduced-precision variants and TensorRT engines of a model; `swapcast bench-engines`.

swapcast engines fp16 NAME [--block-op OP]...
swapcast engines int8 NAME [--method minmax|entropy|percentile] [--per-channel|--no-per-channel] [--samples N]
                      [--target onnxruntime|tensorrt] [--fp32-rest]
swapcast engines build-trt NAME --precision fp16|int8|fp32 [--max-batch 32]
swapcast bench-engines [--full] [--runs N] [--output FILE]

Variants are written beside the model (`<stem>.fp16.onnx`, `<stem>.int8.onnx`, `<stem>.<gpu>.<precision>.engine`),
each with a JSON record of its source and quality; the pipeline loads them when SWAPCAST_PRECISION asks.
Models whose graph fixes the batch at 1 are made from their batch-dynamic rewrite, so every variant batches.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from app.commands.engines_group import engines_actions
from app.errors import ModelError, UserError
from engines import registry
from engines.store import ModelStore, sha256_file

if TYPE_CHECKING:
    import numpy as np

    from engines.precision.int8 import CalibrationSet, Method, QdqTarget
    from engines.precision.quality import QualityReport

log = logging.getLogger(__name__)

VERIFY_ITEMS = 4


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    actions = engines_actions(sub)

    fp16 = actions.add_parser("fp16", help="write <model>.fp16.onnx (inputs and outputs stay FP32)")
    fp16.add_argument("name", metavar="NAME")
    fp16.add_argument("--block-op", action="append", default=[], metavar="OP", help="also keep this op type FP32")
    fp16.set_defaults(func=run_fp16)

    int8 = actions.add_parser("int8", help="write <model>.int8.onnx (QDQ, calibrated on real face images)")
    int8.add_argument("name", metavar="NAME")
    int8.add_argument("--method", choices=("minmax", "entropy", "percentile"), default="minmax")
    int8.add_argument(
        "--per-channel",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="per-output-channel weight scales (default on; the detector needs them)",
    )
    int8.add_argument("--samples", type=int, default=None, help="calibration samples (default per role: 32-64)")
    int8.add_argument(
        "--recognizer",
        default="auto",
        metavar="NAME",
        help="swappers: recognizer for the identity latents (auto: SWAPCAST_RECOGNIZER_MODEL if present; none: "
        "random unit latents)",
    )
    int8.add_argument(
        "--target",
        choices=("onnxruntime", "tensorrt"),
        default="onnxruntime",
        help="onnxruntime: <model>.int8.onnx; tensorrt: <model>.int8-trt.onnx, the QDQ form TensorRT parses "
        "(symmetric, FP32 biases), made and checked without a GPU",
    )
    int8.add_argument(
        "--fp32-rest",
        action="store_true",
        help="tensorrt target: keep the layers that are not quantized in FP32 (default: FP16)",
    )
    int8.set_defaults(func=run_int8)

    trt = actions.add_parser("build-trt", help="build a TensorRT engine for this GPU (needs swapcast[gpu])")
    trt.add_argument("name", metavar="NAME")
    trt.add_argument("--precision", choices=("fp16", "int8", "fp32"), required=True)
    trt.add_argument("--max-batch", type=int, default=32, help="largest batch the engine accepts (default 32)")
    trt.add_argument("--opt-batch", type=int, default=None, help="batch the kernels are tuned for (default 8)")
    trt.add_argument("--samples", type=int, default=None, help="INT8 calibration samples")
    trt.add_argument("--recognizer", default="auto", metavar="NAME")
    trt.add_argument("--workspace-gib", type=float, default=4.0)
    trt.set_defaults(func=run_build_trt)

    bench = sub.add_parser(
        "bench-engines", help="FP32/FP16/INT8/torch variants: latency, size and quality vs FP32 (table and JSON)"
    )
    bench.add_argument("--full", action="store_true", help="also the full-size reference swapper (slow on a CPU)")
    bench.add_argument("--runs", type=int, default=30, help="timed runs per variant (default 30)")
    bench.add_argument("--threads", type=int, default=None, help="threads per model (default: all cores)")
    bench.add_argument("--output", type=Path, default=None, help="write the JSON here instead of after the table")
    bench.set_defaults(func=run_bench)


@dataclass(frozen=True)
class Source:
    """A model as variants are made from it: its registry file, the FP32 file that runs (the batch-dynamic
    rewrite of a fixed-batch graph) and the registry sha256 variants record."""

    name: str
    original: Path
    runnable: Path
    sha256: str


def fixed_batch(path: Path) -> bool:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    initializers = {init.name for init in model.graph.initializer}
    first = next(value for value in model.graph.input if value.name not in initializers)
    dims = first.type.tensor_type.shape.dim
    return bool(dims) and dims[0].HasField("dim_value") and dims[0].dim_value == 1


def source_for(store: ModelStore, name: str) -> Source:
    from app.pipeline.factory import dynamic_path
    from engines.onnx_batch import make_batch_dynamic

    entry = registry.get_entry(name)
    if not entry.file.endswith(".onnx"):
        raise UserError(f"model {name} is not an ONNX model ({entry.file})")
    original = store.ensure(name)
    sha256, _ = store.expected(name)
    if sha256 is None:
        raise ModelError(f"model {name} has no recorded sha256 to tie its variants to")
    runnable = original
    if fixed_batch(original):
        dynamic = dynamic_path(store, name)
        try:
            runnable = dynamic if dynamic.is_file() else make_batch_dynamic(original, dynamic)
        except ModelError as exc:
            log.warning("%s keeps its fixed batch of 1 (%s)", name, exc)
    return Source(name, original, runnable, sha256)


def _recognizer(choice: str, store: ModelStore) -> str | None:
    if choice == "none":
        return None
    if choice != "auto":
        registry.get_entry(choice)
        return choice
    from app.settings import PipelineSettings

    wanted = PipelineSettings().recognizer_model
    return wanted if store.status(wanted) == "verified" else None


def _verify_feeds(calibration: CalibrationSet) -> dict[str, np.ndarray]:
    import numpy as np

    head = calibration.samples[:VERIFY_ITEMS]
    return {name: np.concatenate([s[name] for s in head]) for name in calibration.input_names}


def _tool(package: str) -> str:
    try:
        return f"{package} {metadata.version(package)}"
    except metadata.PackageNotFoundError:
        return package


def make_fp16(
    store: ModelStore, name: str, block_ops: tuple[str, ...] = (), recognizer: str | None = None
) -> tuple[Path, QualityReport]:
    """Write `<stem>.fp16.onnx` and its record; returns (path, QualityReport on real inputs)."""
    from app.calibration import calibration_set
    from engines.precision.fp16 import convert_fp16
    from engines.precision.quality import measure
    from engines.precision.variants import VariantRecord, variant_path, write_record

    source = source_for(store, name)
    calibration = calibration_set(store, name, source.runnable, VERIFY_ITEMS, recognizer_model=recognizer)
    feeds = _verify_feeds(calibration)
    dst = variant_path(source.original, "fp16")
    ranges = {k: v[:2] for k, v in feeds.items()}  # every activation is held: two samples bound the memory
    result = convert_fp16(source.runnable, dst, extra_block_ops=block_ops, range_feeds=ranges)
    quality = measure(source.runnable, dst, feeds)
    write_record(
        dst,
        VariantRecord(
            model=name,
            precision="fp16",
            file=dst.name,
            sha256=sha256_file(dst),
            source_file=source.original.name,
            source_sha256=source.sha256,
            tool=_tool("onnxconverter-common"),
            options={
                "keep_io_types": result.keep_io_types,
                "extra_block_ops": list(block_ops),
                "blocked_nodes": list(result.blocked_nodes),
            },
            quality={**quality.to_dict(), "inputs": "first calibration samples"},
        ),
    )
    return dst, quality


def make_int8(
    store: ModelStore,
    name: str,
    *,
    method: Method = "minmax",
    per_channel: bool = True,
    samples: int | None = None,
    recognizer: str | None = None,
    target: QdqTarget = "onnxruntime",
    float16_rest: bool = False,
) -> tuple[Path, QualityReport]:
    """Write `<stem>.int8.onnx` (or `<stem>.int8-trt.onnx` for TensorRT) and its record; returns (path,
    QualityReport on calibration inputs)."""
    from app.calibration import calibration_set
    from engines.precision.int8 import quantize_int8
    from engines.precision.quality import measure
    from engines.precision.variants import VariantRecord, tensorrt_qdq_path, variant_path, write_record

    source = source_for(store, name)
    calibration = calibration_set(store, name, source.runnable, samples, recognizer_model=recognizer)
    dst = tensorrt_qdq_path(source.original) if target == "tensorrt" else variant_path(source.original, "int8")
    result = quantize_int8(
        source.runnable,
        dst,
        calibration,
        method=method,
        per_channel=per_channel,
        target=target,
        float16_rest=float16_rest,
    )
    quality = measure(source.runnable, dst, _verify_feeds(calibration), optimize=not float16_rest)
    write_record(
        dst,
        VariantRecord(
            model=name,
            precision="int8",
            file=dst.name,
            sha256=sha256_file(dst),
            source_file=source.original.name,
            source_sha256=source.sha256,
            tool=_tool("onnxruntime"),
            options={**result.options(), "calibration_source": calibration.source},
            quality={**quality.to_dict(), "inputs": "first calibration samples"},
        ),
    )
    return dst, quality


def _size(path: Path) -> str:
    return f"{path.stat().st_size / 1e6:.1f} MB"


def run_fp16(args: argparse.Namespace) -> int:
    store = ModelStore()
    registry.get_entry(args.name)
    path, quality = make_fp16(store, args.name, tuple(args.block_op), _recognizer("auto", store))
    print(f"{args.name}: {path} ({_size(path)}); vs FP32: {quality.describe()}")
    return 0


def run_int8(args: argparse.Namespace) -> int:
    if args.samples is not None and args.samples < 1:
        raise UserError("--samples must be at least 1")
    if args.fp32_rest and args.target != "tensorrt":
        raise UserError("--fp32-rest is for --target tensorrt")
    store = ModelStore()
    registry.get_entry(args.name)
    path, quality = make_int8(
        store,
        args.name,
        method=args.method,
        per_channel=args.per_channel,
        samples=args.samples,
        recognizer=_recognizer(args.recognizer, store),
        target=args.target,
        float16_rest=args.target == "tensorrt" and not args.fp32_rest,
    )
    print(f"{args.name}: {path} ({_size(path)}); vs FP32 on calibration inputs: {quality.describe()}")
    return 0


def _profile_dims(name: str, detect_size: int) -> dict[str, tuple[int, int, int]]:
    role = registry.get_entry(name).role
    if role == "detector":
        return {"height": (32, detect_size, detect_size), "width": (32, detect_size, detect_size)}
    if role == "enhancer":
        return {"height": (32, 128, 256), "width": (32, 128, 256)}
    return {}


def run_build_trt(args: argparse.Namespace) -> int:
    from engines.tensorrt.manifest import engine_path, import_tensorrt, probe_platform

    import_tensorrt()  # before any work: one clear line on machines without TensorRT
    registry.get_entry(args.name)
    if args.max_batch < 1 or (args.opt_batch is not None and not 1 <= args.opt_batch <= args.max_batch):
        raise UserError("need --max-batch >= 1 and 1 <= --opt-batch <= --max-batch")
    from app.calibration import calibration_set
    from app.settings import PipelineSettings
    from engines.tensorrt.build import BuildOptions, build_engine

    store = ModelStore()
    platform = probe_platform()
    source = source_for(store, args.name)
    engine = engine_path(source.original, platform.gpu_name, args.precision)
    calibration = None
    if args.precision == "int8":
        recognizer = _recognizer(args.recognizer, store)
        calibration = calibration_set(store, args.name, source.runnable, args.samples, recognizer_model=recognizer)
    options = BuildOptions(
        precision=args.precision,
        max_batch=args.max_batch,
        opt_batch=args.opt_batch,
        dims=_profile_dims(args.name, PipelineSettings().detect_size),
        workspace_gib=args.workspace_gib,
        timing_cache=source.original.parent / f"timing.{platform.slug}.trt{platform.tensorrt_version}.cache",
        calibration=calibration,
    )
    try:
        manifest = build_engine(source.runnable, engine, model=args.name, source_sha256=source.sha256, options=options)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    facts = f"{_size(engine)}, {manifest.precision}, {manifest.build_mode}, batch 1..{manifest.max_batch}"
    print(f"{args.name}: {engine} ({facts})")
    return 0


def run_bench(args: argparse.Namespace) -> int:
    from app.bench.engines_bench import EnginesBenchConfig, format_table, run_engines_bench

    if args.runs < 1:
        raise UserError("--runs must be at least 1")
    config = EnginesBenchConfig(full=args.full, runs=args.runs, threads=args.threads)
    result = run_engines_bench(ModelStore(), config)
    print(format_table(result))
    text = json.dumps(result, indent=2)
    if args.output:
        args.output.write_text(text + "\n")
        print(f"JSON written to {args.output}")
    else:
        sys.stdout.write(text + "\n")
    return 0
