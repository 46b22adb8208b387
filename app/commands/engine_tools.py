"""`swapcast engines`: make smaller models (pruning, distillation) and compare them with their teacher.

swapcast engines dataset --out DIR [--teacher realesrgan_x4plus] [--heldout astronaut,tom_hanks]
swapcast engines prune --data DIR --out DIR [--model realesrgan_x4plus] [--target 0.3] [--finetune-steps N]
swapcast engines distill --data DIR --out DIR [--student srvgg:64x16 | --student-from FILE] [--init MODEL]
swapcast engines distill-swap --out DIR [--teacher reference_swapper_narrow] [--divisor 2]
swapcast engines report --data DIR --out DIR --teacher MODEL --variant NAME=FILE ...

The face crops come from the sample photos installed packages ship (see `app.media.clips.sample_faces`),
with faces found by the RetinaFace detector; whole photos are held out for evaluation. This module parses the
arguments and prints; the jobs themselves are in `app.engine_jobs`.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.commands.arguments import (
    comma_list,
    fractions,
    non_negative_float,
    non_negative_int,
    open_fraction,
    positive_float,
    positive_int,
    unit_fraction,
)
from app.commands.from_args import picked
from app.errors import UserError

if TYPE_CHECKING:
    from engines.distill import DistillConfig

DEFAULT_TEACHER = "realesrgan_x4plus"
DEFAULT_HELDOUT = "astronaut,tom_hanks"


def add_commands(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ds = actions.add_parser("dataset", help="face crops, degraded inputs and cached teacher outputs")
    ds.add_argument("--out", type=Path, required=True, help="folder for train.npz, heldout.npz, scan.npz")
    ds.add_argument("--teacher", default=DEFAULT_TEACHER, help="model name or ONNX file (default %(default)s)")
    ds.add_argument("--photos", default=None, help="comma list of sample photos (default: all available)")
    ds.add_argument("--heldout", default=DEFAULT_HELDOUT, help="photos kept for evaluation (default %(default)s)")
    ds.add_argument("--lr-size", type=positive_int, default=24, help="low-resolution crop side in pixels (default 24)")
    ds.add_argument("--train-count", type=positive_int, default=192)
    ds.add_argument("--heldout-count", type=positive_int, default=24)
    ds.add_argument("--scan-count", type=positive_int, default=8, help="extra held-out crops for the pruning scan")
    _common(ds)
    ds.set_defaults(func=run_dataset)

    pr = actions.add_parser("prune", help="structured channel pruning with a sensitivity scan")
    _folders(pr)
    pr.add_argument("--model", default=DEFAULT_TEACHER, help="model name or ONNX file (default %(default)s)")
    pr.add_argument("--name", default=None, help="output file stem (default MODEL_pruned)")
    pr.add_argument("--target", type=open_fraction, default=0.3, help="fraction of the budget to remove (default 0.3)")
    pr.add_argument("--budget", choices=("channels", "params", "macs"), default="channels")
    pr.add_argument("--ratios", type=fractions, default=(0.25, 0.5, 0.75), help="ratios the scan tries per layer")
    pr.add_argument("--no-compensate", action="store_true", help="no bias compensation for removed channels")
    pr.add_argument(
        "--finetune-steps", type=non_negative_int, default=0, help="distilled fine-tune from the unpruned model"
    )
    _training(pr, batch=4, lr=5e-5)
    _common(pr)
    pr.set_defaults(func=run_prune)

    di = actions.add_parser("distill", help="distil the dataset's teacher into a smaller network")
    _folders(di)
    di.add_argument("--name", default="student")
    di.add_argument("--student", default="srvgg:64x16", help="srvgg:FEATURESxCONVS (default %(default)s)")
    di.add_argument("--student-from", type=Path, default=None, help="start from this ONNX or .pt network instead")
    di.add_argument("--init", default=None, help="model name or ONNX file whose weights start the student")
    _training(di, batch=8, lr=2e-4)
    _common(di)
    di.set_defaults(func=run_distill)

    sw = actions.add_parser("distill-swap", help="distil an inswapper-contract swapper into a smaller one")
    sw.add_argument("--out", type=Path, required=True)
    sw.add_argument("--teacher", default="reference_swapper_narrow", help="model name or ONNX file")
    sw.add_argument("--name", default="swap_student")
    sw.add_argument("--divisor", type=positive_int, default=2, help="student widths = teacher widths / DIVISOR")
    sw.add_argument("--blocks", type=positive_int, default=None, help="style blocks (default: the teacher's)")
    sw.add_argument("--count", type=positive_int, default=96, help="augmented training crops")
    sw.add_argument("--heldout", default="astronaut", help="photos kept for evaluation (default %(default)s)")
    _training(sw, batch=4, lr=1e-3, alpha=0.0)
    _common(sw)
    sw.set_defaults(func=run_distill_swap)

    rp = actions.add_parser("report", help="markdown/JSON table and PNG grid of variants against the teacher")
    _folders(rp)
    rp.add_argument("--teacher", default=DEFAULT_TEACHER, help="model name or ONNX file")
    rp.add_argument("--variant", action="append", default=[], metavar="NAME=FILE", help="repeat for each variant")
    rp.add_argument("--size", type=positive_int, default=64, help="input side for GMAC and latency (default 64)")
    rp.add_argument("--runs", type=positive_int, default=5, help="timed runs per model (default 5)")
    rp.add_argument("--grid", type=positive_int, default=4, help="faces in the PNG grid (default 4)")
    rp.add_argument("--notes", default="", help="text appended to the markdown report")
    _common(rp)
    rp.set_defaults(func=run_report)


def _folders(p: argparse.ArgumentParser) -> None:
    """`--data` and `--out` of a job that reads a dataset and writes models or a report."""
    p.add_argument("--data", type=Path, required=True, help="a folder made by `swapcast engines dataset`")
    p.add_argument("--out", type=Path, required=True)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--threads", type=positive_int, default=2, help="CPU threads for torch and ONNX Runtime (default 2)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _training(p: argparse.ArgumentParser, *, batch: int, lr: float, alpha: float = 0.3) -> None:
    p.add_argument("--steps", type=positive_int, default=500, help="training steps (default 500)")
    p.add_argument("--batch", type=positive_int, default=batch, help=f"crops per step (default {batch})")
    p.add_argument("--lr", type=positive_float, default=lr, help=f"Adam learning rate (default {lr:g})")
    p.add_argument(
        "--alpha", type=unit_fraction, default=alpha, help=f"weight of the ground-truth term (default {alpha:g})"
    )
    p.add_argument("--edge-weight", type=non_negative_float, default=0.5, help="weight of the Sobel term (default 0.5)")
    p.add_argument("--checkpoint-every", type=positive_int, default=50)
    p.add_argument("--no-resume", action="store_true", help="ignore a checkpoint left in the output folder")


# -- argument handling ----------------------------------------------------------------------------------


def _names(text: str) -> list[str]:
    return list(comma_list(text))


def _config(args: argparse.Namespace) -> DistillConfig:
    from engines.distill import DistillConfig

    return DistillConfig(
        **picked(args, "steps", "batch", "lr", "alpha", "edge_weight", "seed", "checkpoint_every", "threads")
    )


def _resume_and_progress(args: argparse.Namespace) -> dict[str, Any]:
    """What `--no-resume` and `--no-progress` ask of a training job."""
    return {"resume": not args.no_resume, "progress": not args.no_progress}


def _student_shape(text: str) -> tuple[int, int]:
    """`srvgg:FEATURESxCONVS` as (features, convolutions)."""
    kind, _, shape = text.partition(":")
    try:
        feat, convs = (int(v) for v in shape.split("x"))
    except ValueError:
        raise UserError("--student takes srvgg:FEATURESxCONVS, e.g. srvgg:64x16") from None
    if kind != "srvgg" or feat < 1 or convs < 1:
        raise UserError("--student takes srvgg:FEATURESxCONVS, e.g. srvgg:64x16")
    return feat, convs


def _variant(item: str) -> tuple[str, str]:
    name, sep, file = item.partition("=")
    if not sep or not name or not file:
        raise UserError(f"--variant takes NAME=FILE, got {item!r}")
    return name, file


# -- commands -------------------------------------------------------------------------------------------


def run_dataset(args: argparse.Namespace) -> int:
    from app.engine_jobs.dataset import make_dataset

    out: Path = args.out
    meta = make_dataset(
        out,
        teacher=args.teacher,
        photo_names=_names(args.photos) if args.photos else None,
        heldout=_names(args.heldout),
        **picked(args, "lr_size", "train_count", "heldout_count", "scan_count", "seed", "threads"),
        progress=not args.no_progress,
    )
    counts = meta["counts"]
    print(
        f"wrote {out}: {counts['train']} training crops from {meta['train_photos']}, {counts['heldout']} held-out "
        f"and {counts['scan']} scan crops from {meta['heldout_photos']}, x{meta['scale']}, "
        f"teacher {Path(meta['teacher']).name}"
    )
    return 0


def run_prune(args: argparse.Namespace) -> int:
    from app.engine_jobs.prune import prune_model

    finetune = replace(_config(args), steps=args.finetune_steps) if args.finetune_steps > 0 else None
    summary = prune_model(
        **picked(args, "data", "out", "model", "name", "target", "budget", "ratios", "threads"),
        compensate=not args.no_compensate,
        finetune=finetune,
        **_resume_and_progress(args),
    )
    before, after = summary["cost_before"], summary["cost_after"]
    print(
        f"pruned {Path(summary['source']).name}: {before['params'] / 1e6:.2f}M -> {after['params'] / 1e6:.2f}M "
        f"params, {before['gmac']:.2f} -> {after['gmac']:.2f} GMAC at 64x64; {summary['pruned']}"
    )
    if finetune is not None:
        losses = summary["finetune_losses"]
        print(
            f"fine-tuned {finetune.steps} steps: loss {losses[0][1]:.4f} -> {losses[-1][1]:.4f}; {summary['finetuned']}"
        )
    return 0


def run_distill(args: argparse.Namespace) -> int:
    from app.engine_jobs.distill import distill_sr

    summary = distill_sr(
        **picked(args, "data", "out", "name"),
        student=args.student_from if args.student_from is not None else _student_shape(args.student),
        init=args.init,
        config=_config(args),
        **_resume_and_progress(args),
    )
    before, after = summary["train_loss_before"], summary["train_loss_after"]
    print(f"distilled {args.name}: training loss {before:.4f} -> {after:.4f}; {summary['student']}")
    return 0


def run_distill_swap(args: argparse.Namespace) -> int:
    from app.engine_jobs.distill import distill_swap

    summary = distill_swap(
        args.out,
        **picked(args, "teacher", "name", "divisor", "blocks", "count"),
        heldout=set(_names(args.heldout)),
        config=_config(args),
        **_resume_and_progress(args),
    )
    params, teacher_params = summary["student_params"], summary["teacher_params"]
    teacher_text = "?" if teacher_params is None else f"{teacher_params / 1e6:.2f}M"
    print(
        f"swap student {summary['student_spec']}: {params / 1e6:.2f}M params (teacher {teacher_text}); "
        f"held-out loss {summary['heldout_loss_untrained']:.4f} untrained -> "
        f"{summary['heldout_loss_trained']:.4f}; {summary['student']}"
    )
    return 0


def run_report(args: argparse.Namespace) -> int:
    from app.engine_jobs.report import report_variants

    report = report_variants(
        **picked(args, "data", "out", "teacher", "size", "runs", "grid", "notes", "threads"),
        variants=[_variant(item) for item in args.variant],
        progress=not args.no_progress,
    )
    sys.stdout.write(report.markdown())
    print(f"wrote {args.out / 'report.md'}, report.json and grid.png")
    return 0
