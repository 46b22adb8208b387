"""`swapcast engines fp16|int8|build-trt`: reduced-precision variants and TensorRT plans of a model.

swapcast engines fp16 NAME [--block-op OP]...
swapcast engines int8 NAME [--method minmax|entropy|percentile] [--per-channel|--no-per-channel] [--samples N]
                      [--target onnxruntime|tensorrt] [--fp32-rest]
swapcast engines build-trt NAME --precision fp16|int8|fp32 [--max-batch 32]

The work is done by `app.variants`; these commands parse, call and print.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import get_args

from app.commands.arguments import positive_float, positive_int
from app.commands.from_args import picked
from app.errors import UserError
from app.names import PRECISIONS
from engines import registry


def add_commands(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from engines.precision.int8 import Method, QdqTarget

    fp16 = actions.add_parser("fp16", help="write <model>.fp16.onnx (inputs and outputs stay FP32)")
    fp16.add_argument("name", metavar="NAME")
    fp16.add_argument("--block-op", action="append", default=[], metavar="OP", help="also keep this op type FP32")
    fp16.set_defaults(func=run_fp16)

    int8 = actions.add_parser("int8", help="write <model>.int8.onnx (QDQ, calibrated on real face images)")
    int8.add_argument("name", metavar="NAME")
    int8.add_argument("--method", choices=get_args(Method), default="minmax")
    int8.add_argument(
        "--per-channel",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="per-output-channel weight scales (default on; the detector needs them)",
    )
    _calibration(int8)
    int8.add_argument(
        "--target",
        choices=get_args(QdqTarget),
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

    trt = actions.add_parser("build-trt", help="build a TensorRT plan for this GPU (needs swapcast[gpu])")
    trt.add_argument("name", metavar="NAME")
    trt.add_argument("--precision", choices=PRECISIONS, required=True)
    trt.add_argument("--max-batch", type=positive_int, default=32, help="largest batch the plan accepts (default 32)")
    trt.add_argument("--opt-batch", type=positive_int, default=None, help="batch the kernels are tuned for (default 8)")
    _calibration(trt)
    trt.add_argument("--workspace-gib", type=positive_float, default=4.0)
    trt.set_defaults(func=run_build_trt)


def _calibration(p: argparse.ArgumentParser) -> None:
    """`--samples` and `--recognizer` of an INT8 calibration (an int8 variant, an INT8 TensorRT plan)."""
    p.add_argument("--samples", type=positive_int, default=None, help="calibration samples (default per role: 32-64)")
    p.add_argument(
        "--recognizer",
        default="auto",
        metavar="NAME",
        help="swappers: recognizer for the identity latents (auto: SWAPCAST_RECOGNIZER_MODEL if present; none: "
        "random unit latents)",
    )


def _size(path: Path) -> str:
    return f"{path.stat().st_size / 1e6:.1f} MB"


def run_fp16(args: argparse.Namespace) -> int:
    from app.model_store import open_model_store
    from app.variants import calibration_recognizer, make_fp16

    store = open_model_store()
    registry.get_entry(args.name)
    path, quality = make_fp16(store, args.name, tuple(args.block_op), calibration_recognizer("auto", store))
    print(f"{args.name}: {path} ({_size(path)}); vs FP32: {quality.describe()}")
    return 0


def run_int8(args: argparse.Namespace) -> int:
    from app.model_store import open_model_store
    from app.variants import calibration_recognizer, make_int8

    if args.fp32_rest and args.target != "tensorrt":
        raise UserError("--fp32-rest is for --target tensorrt")
    store = open_model_store()
    registry.get_entry(args.name)
    path, quality = make_int8(
        store,
        args.name,
        method=args.method,
        per_channel=args.per_channel,
        samples=args.samples,
        recognizer=calibration_recognizer(args.recognizer, store),
        target=args.target,
        float16_rest=args.target == "tensorrt" and not args.fp32_rest,
    )
    print(f"{args.name}: {path} ({_size(path)}); vs FP32 on calibration inputs: {quality.describe()}")
    return 0


def run_build_trt(args: argparse.Namespace) -> int:
    from app.model_store import open_model_store
    from app.settings import PipelineSettings
    from app.variants import TrtPlanRequest, build_trt_plan

    if args.opt_batch is not None and args.opt_batch > args.max_batch:
        raise UserError("need --opt-batch <= --max-batch")
    fields = ("name", "precision", "max_batch", "opt_batch", "samples", "recognizer", "workspace_gib")
    request = TrtPlanRequest(**picked(args, *fields))
    plan, manifest = build_trt_plan(open_model_store(), request, PipelineSettings())
    facts = f"{_size(plan)}, {manifest.precision}, {manifest.build_mode}, batch 1..{manifest.max_batch}"
    print(f"{args.name}: {plan} ({facts})")
    return 0
