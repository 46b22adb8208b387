"""`swapcast engines`: make smaller models (pruning, distillation) and compare them with their teacher.

swapcast engines dataset --out DIR [--teacher realesrgan_x4plus] [--heldout astronaut,tom_hanks]
swapcast engines prune --data DIR --out DIR [--model realesrgan_x4plus] [--target 0.3] [--finetune-steps N]
swapcast engines distill --data DIR --out DIR [--student srvgg:64x16 | --student-from FILE] [--init MODEL]
swapcast engines distill-swap --out DIR [--teacher reference_swapper_narrow] [--divisor 2]
swapcast engines report --data DIR --out DIR --teacher MODEL --variant NAME=FILE ...

The face crops come from the sample photos installed packages ship (see `app.media.clips.sample_faces`),
with faces found by the RetinaFace detector; whole photos are held out for evaluation.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from app.commands.arguments import (
    fractions,
    non_negative_float,
    non_negative_int,
    open_fraction,
    positive_float,
    positive_int,
    unit_fraction,
)
from app.errors import UserError
from app.model_store import open_model_store

if TYPE_CHECKING:
    from torch import nn

    from engines.distill import DistillConfig, SourceImage, SRSet
    from engines.store import ModelStore
    from engines.swap_student import AlignedCrop

log = logging.getLogger(__name__)

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
    pr.add_argument("--data", type=Path, required=True, help="a folder made by `swapcast engines dataset`")
    pr.add_argument("--out", type=Path, required=True)
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
    di.add_argument("--data", type=Path, required=True, help="a folder made by `swapcast engines dataset`")
    di.add_argument("--out", type=Path, required=True)
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
    rp.add_argument("--data", type=Path, required=True, help="a folder made by `swapcast engines dataset`")
    rp.add_argument("--out", type=Path, required=True)
    rp.add_argument("--teacher", default=DEFAULT_TEACHER, help="model name or ONNX file")
    rp.add_argument("--variant", action="append", default=[], metavar="NAME=FILE", help="repeat for each variant")
    rp.add_argument("--size", type=positive_int, default=64, help="input side for GMAC and latency (default 64)")
    rp.add_argument("--runs", type=positive_int, default=5, help="timed runs per model (default 5)")
    rp.add_argument("--grid", type=positive_int, default=4, help="faces in the PNG grid (default 4)")
    rp.add_argument("--notes", default="", help="text appended to the markdown report")
    _common(rp)
    rp.set_defaults(func=run_report)


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


# -- helpers --------------------------------------------------------------------------------------------


def model_path(spec: str, store: ModelStore) -> Path:
    """An ONNX file given by path, or a model the store imports or builds."""
    path = Path(spec).expanduser()
    if path.suffix == ".onnx" or path.exists():
        if not path.is_file():
            raise UserError(f"model file {path} does not exist")
        return path
    from engines.registry import get_entry

    get_entry(spec)  # a clear error for an unknown name
    return store.ensure(spec)


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {path} ({exc}); make the folder with `swapcast engines dataset`") from None
    return data


def _photos(names: list[str] | None) -> dict[str, np.ndarray]:
    """Sample photos as RGB arrays, by name."""
    from app.media.clips import load_sample, sample_faces

    available = sample_faces()
    wanted = names if names is not None else sorted(available)
    return {name: np.ascontiguousarray(load_sample(name)[:, :, ::-1]) for name in wanted}


def _detect(photos: dict[str, np.ndarray], threads: int, store: ModelStore) -> dict[str, list[Any]]:
    """Faces (app.pipeline.types.Face) found in each RGB photo."""
    from app.pipeline.detect import DetectorConfig, RetinaFaceDetector
    from app.runtime.onnx import OnnxModel

    model = OnnxModel(store.ensure("retinaface_mnet025"), threads=threads)
    detector = RetinaFaceDetector(model, DetectorConfig(refine_landmarks=True))
    return {name: detector.process([np.ascontiguousarray(rgb[:, :, ::-1])])[0] for name, rgb in photos.items()}


def face_sources(photos: dict[str, np.ndarray], threads: int, store: ModelStore) -> list[SourceImage]:
    """The photos with their face boxes; a photo where no face is found (a tight crop such as the Tom Hanks
    sample) counts as one face filling the frame."""
    from engines.distill import SourceImage

    found = _detect(photos, threads, store)
    sources = []
    for name, rgb in photos.items():
        boxes = tuple(tuple(float(v) for v in face.box) for face in found[name])
        if not boxes:
            h, w = rgb.shape[:2]
            boxes = ((0.0, 0.0, float(w), float(h)),)
        sources.append(SourceImage(name, rgb, boxes))  # type: ignore[arg-type]
    return sources


def aligned_crops(photos: dict[str, np.ndarray], threads: int, store: ModelStore) -> list[AlignedCrop]:
    """arcface_128 crops (RGB) of every face found in the photos."""
    from app.pipeline.align import AlignSpec, estimate_matrix, warp_crop
    from engines.swap_student import AlignedCrop

    spec = AlignSpec("arcface_128", 128)
    found = _detect(photos, threads, store)
    crops = []
    for name, rgb in photos.items():
        bgr = np.ascontiguousarray(rgb[:, :, ::-1])
        for face in found[name]:
            crop = warp_crop(bgr, estimate_matrix(face.landmarks, spec), spec.size)
            crops.append(AlignedCrop(name, np.ascontiguousarray(crop[:, :, ::-1])))
    return crops


def _scale_of(path: Path, threads: int) -> int:
    from engines.distill import run_teacher

    probe = np.zeros((1, 3, 8, 8), np.float32)
    out = run_teacher(path, {"input": probe}, threads=threads, progress=False)
    if out.shape[2] % 8:
        raise UserError(f"{path.name} does not upscale by a whole factor ({out.shape[2]} from 8)")
    return out.shape[2] // 8


def _config(args: argparse.Namespace) -> DistillConfig:
    from engines.distill import DistillConfig

    return DistillConfig(
        steps=args.steps,
        batch=args.batch,
        lr=args.lr,
        alpha=args.alpha,
        edge_weight=args.edge_weight,
        seed=args.seed,
        checkpoint_every=args.checkpoint_every,
        threads=args.threads,
    )


def _load_data(folder: Path, name: str) -> SRSet:
    from engines.distill import load_set

    path = folder / f"{name}.npz"
    if not path.is_file():
        raise UserError(f"{path} is missing; make the folder with `swapcast engines dataset`")
    return load_set(path)


def _export(net: nn.Module, path: Path, meta: dict[str, str]) -> float:
    from engines.export import export_verified, sample_inputs

    return export_verified(net, path, feeds=sample_inputs(net, size=16, batch=2), metadata=meta)


def _cost(path: Path, size: int = 64) -> dict[str, float]:
    from engines.model_cost import model_cost

    cost = model_cost(path, input_shapes={"input": [1, 3, size, size]})
    return {"params": cost.params, "gmac": round(cost.gmacs, 3), "input_size": size}


def _passive_openmp() -> None:
    """Make torch's OpenMP workers sleep, not spin, between parallel regions. On a CPU shared with other
    processes spinning workers steal each other's cores, and training runs several times slower. Only
    effective before torch is first imported, so every command calls this first."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _set_threads(threads: int) -> None:
    _passive_openmp()
    import torch

    torch.set_num_threads(threads)


# -- commands -------------------------------------------------------------------------------------------


def run_dataset(args: argparse.Namespace) -> int:
    _passive_openmp()
    from engines.distill import Augment, Degradation, make_sr_set, run_teacher, save_set, split_by_image

    store = open_model_store()
    teacher = model_path(args.teacher, store)
    scale = _scale_of(teacher, args.threads)
    photos = _photos(_names(args.photos) if args.photos else None)
    sources = face_sources(photos, args.threads, store)
    train_photos, heldout_photos = split_by_image(sources, _names(args.heldout))
    progress = not args.no_progress
    common = {"lr_size": args.lr_size, "scale": scale}
    train = make_sr_set(
        train_photos, args.train_count, seed=args.seed, augment=Augment(), degradation=Degradation(), **common
    )
    heldout = make_sr_set(heldout_photos, args.heldout_count, seed=args.seed + 1, **common)
    scan = make_sr_set(heldout_photos, args.scan_count, seed=args.seed + 2, **common)
    train.teacher = run_teacher(teacher, {"input": train.lr}, threads=args.threads, progress=progress)
    heldout.teacher = run_teacher(teacher, {"input": heldout.lr}, threads=args.threads, progress=progress)
    out: Path = args.out
    save_set(out / "train.npz", train)
    save_set(out / "heldout.npz", heldout)
    save_set(out / "scan.npz", scan)
    meta = {
        "teacher": str(teacher),
        "scale": scale,
        "lr_size": args.lr_size,
        "seed": args.seed,
        "train_photos": [s.image_id for s in train_photos],
        "heldout_photos": [s.image_id for s in heldout_photos],
        "faces": {s.image_id: len(s.faces) for s in sources},
        "counts": {"train": len(train), "heldout": len(heldout), "scan": len(scan)},
        "train": "augmented (flip, rotation, zoom-out, colour jitter), degraded (blur, downscale, noise, JPEG)",
        "heldout": "clean area downscale, no augmentation",
    }
    _write_json(out / "dataset.json", meta)
    print(
        f"wrote {out}: {len(train)} training crops from {meta['train_photos']}, {len(heldout)} held-out "
        f"and {len(scan)} scan crops from {meta['heldout_photos']}, x{scale}, teacher {teacher.name}"
    )
    return 0


def run_prune(args: argparse.Namespace) -> int:
    _passive_openmp()
    from engines.distill import distill, run_teacher, save_student, sr_train_data
    from engines.prune import prune_network
    from engines.torchnets import load_onnx_net

    _set_threads(args.threads)
    source = model_path(args.model, open_model_store())
    meta = _read_json(args.data / "dataset.json")
    train, scan = _load_data(args.data, "train"), _load_data(args.data, "scan")
    ratios: tuple[float, ...] = args.ratios
    net = load_onnx_net(source)
    progress = not args.no_progress
    result = prune_network(
        net,  # type: ignore[arg-type]
        scan.lr,
        target=args.target,
        budget=args.budget,
        ratios=ratios,
        heldout_gt=scan.hr,
        calibration=None if args.no_compensate else train.lr[:32],
        progress=progress,
    )
    name = args.name or f"{source.stem}_pruned"
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    provenance = {"swapcast.pruned_from": source.name, "swapcast.prune_target": f"{args.target} of {args.budget}"}
    err = _export(result.net, out / f"{name}.onnx", provenance)
    save_student(out / f"{name}.pt", result.net, provenance)
    summary: dict[str, Any] = {
        "source": str(source),
        "pruned": str(out / f"{name}.onnx"),
        "export_max_abs_error": err,
        "cost_before": _cost(source),
        "cost_after": _cost(out / f"{name}.onnx"),
        "plan": result.plan.to_dict(),
    }
    before, after = summary["cost_before"], summary["cost_after"]
    print(
        f"pruned {source.name}: {before['params'] / 1e6:.2f}M -> {after['params'] / 1e6:.2f}M params, "
        f"{before['gmac']:.2f} -> {after['gmac']:.2f} GMAC at 64x64; {out / f'{name}.onnx'}"
    )
    if args.finetune_steps > 0:
        args.steps = args.finetune_steps
        config = _config(args)
        data = sr_train_data(train)
        if Path(meta["teacher"]).name != source.name:
            # Fine-tune from the unpruned model itself, whatever teacher the data set was made with.
            data.soft = run_teacher(source, {"input": train.lr}, threads=args.threads, progress=progress)
        trained = distill(
            result.net, data, config, out / f"{name}_ft.work", resume=not args.no_resume, progress=progress
        )
        ft_name = f"{name}_ft"
        ft_meta = {**provenance, "swapcast.finetune_steps": str(config.steps)}
        summary["finetuned"] = str(out / f"{ft_name}.onnx")
        summary["finetune_export_max_abs_error"] = _export(trained.net, out / f"{ft_name}.onnx", ft_meta)
        save_student(out / f"{ft_name}.pt", trained.net, ft_meta)
        summary["finetune_losses"] = trained.losses
        print(
            f"fine-tuned {config.steps} steps: loss {trained.losses[0][1]:.4f} -> {trained.losses[-1][1]:.4f}; "
            f"{out / f'{ft_name}.onnx'}"
        )
    _write_json(out / f"{name}.json", summary)
    return 0


def _student(args: argparse.Namespace, scale: int) -> nn.Module:
    from engines.distill import load_student
    from engines.torchnets import SRVGG, SRVGGSpec, load_onnx_net

    if args.student_from is not None:
        path: Path = args.student_from
        if not path.is_file():
            raise UserError(f"--student-from {path} does not exist")
        return load_onnx_net(path) if path.suffix == ".onnx" else load_student(path)
    kind, _, shape = args.student.partition(":")
    try:
        feat, convs = (int(v) for v in shape.split("x"))
    except ValueError:
        raise UserError("--student takes srvgg:FEATURESxCONVS, e.g. srvgg:64x16") from None
    if kind != "srvgg" or feat < 1 or convs < 1:
        raise UserError("--student takes srvgg:FEATURESxCONVS, e.g. srvgg:64x16")
    if scale not in (2, 3, 4):
        raise UserError(f"an SRVGG student upscales by 2, 3 or 4, the data set needs {scale}")
    import torch

    torch.manual_seed(args.seed)
    net = SRVGG(SRVGGSpec.compact(feat, convs, shuffle=scale))
    if args.init:
        init = SRVGG.from_onnx(model_path(args.init, open_model_store()))
        if init.spec != net.spec:
            raise UserError(f"--init {args.init} is an SRVGG of another shape ({init.spec}) than {net.spec}")
        net = init
    return net


def run_distill(args: argparse.Namespace) -> int:
    _passive_openmp()
    from engines.distill import distill, mean_loss, save_student, sr_train_data

    _set_threads(args.threads)
    meta = _read_json(args.data / "dataset.json")
    scale = int(meta["scale"])
    train = _load_data(args.data, "train")
    student = _student(args, scale)
    import torch

    with torch.no_grad():
        probe = student(torch.zeros(1, 3, 8, 8))
    if probe.shape[-1] != 8 * scale:
        raise UserError(f"the student upscales 8 px to {probe.shape[-1]} px; the data set is x{scale}")
    config = _config(args)
    data = sr_train_data(train)
    start_loss = mean_loss(student, data, config)
    out: Path = args.out
    progress = not args.no_progress
    result = distill(student, data, config, out / f"{args.name}.work", resume=not args.no_resume, progress=progress)
    provenance = {"swapcast.teacher": Path(meta["teacher"]).name, "swapcast.distill_steps": str(config.steps)}
    err = _export(result.net, out / f"{args.name}.onnx", provenance)
    save_student(out / f"{args.name}.pt", result.net, provenance)
    end_loss = mean_loss(result.net, data, config)
    _write_json(
        out / f"{args.name}.json",
        {
            "student": str(out / f"{args.name}.onnx"),
            "cost": _cost(out / f"{args.name}.onnx"),
            "teacher": meta["teacher"],
            "teacher_cost": _cost(Path(meta["teacher"])),
            "config": asdict(config),
            "train_loss_before": start_loss,
            "train_loss_after": end_loss,
            "export_max_abs_error": err,
            "losses": result.losses,
        },
    )
    print(f"distilled {args.name}: training loss {start_loss:.4f} -> {end_loss:.4f}; {out / f'{args.name}.onnx'}")
    return 0


def run_distill_swap(args: argparse.Namespace) -> int:
    _passive_openmp()
    from engines.distill import mean_loss
    from engines.swap_student import (
        default_student_spec,
        distill_swapper,
        new_student,
        parameter_count,
        swap_train_data,
        teacher_emap,
    )

    _set_threads(args.threads)
    store = open_model_store()
    teacher = model_path(args.teacher, store)
    heldout_names = set(_names(args.heldout))
    crops = aligned_crops(_photos(None), args.threads, store)
    train = [c for c in crops if c.image_id not in heldout_names]
    test = [c for c in crops if c.image_id in heldout_names]
    if not train or not test:
        raise UserError(f"need faces both outside and inside the held-out photos {sorted(heldout_names)}")
    progress = not args.no_progress
    data = swap_train_data(teacher, train, args.count, seed=args.seed, threads=args.threads, progress=progress)
    heldout = swap_train_data(
        teacher, test, max(4, len(test)), seed=args.seed + 1, threads=args.threads, progress=progress, augment=False
    )
    spec = default_student_spec(teacher, args.divisor, args.blocks)
    config = _config(args)
    student = distill_swapper(
        teacher, data, args.out, spec=spec, config=config, resume=not args.no_resume, progress=progress, name=args.name
    )
    untrained = new_student(spec, teacher_emap(teacher), config.seed)
    params = parameter_count(student.net)
    before, after = mean_loss(untrained, heldout, config), mean_loss(student.net, heldout, config)
    summary = {
        "teacher": str(teacher),
        "student": str(student.onnx_path),
        "student_spec": spec.to_dict(),
        "student_params": params,
        "teacher_params": student.teacher_params,
        "heldout_loss_untrained": before,
        "heldout_loss_trained": after,
        "export_max_abs_error": student.export_error,
        "losses": student.result.losses,
    }
    _write_json(args.out / f"{args.name}.json", summary)
    teacher_text = "?" if student.teacher_params is None else f"{student.teacher_params / 1e6:.2f}M"
    print(
        f"swap student {spec.to_dict()}: {params / 1e6:.2f}M params (teacher {teacher_text}); "
        f"held-out loss {before:.4f} untrained -> {after:.4f}; {student.onnx_path}"
    )
    return 0


def run_report(args: argparse.Namespace) -> int:
    _passive_openmp()
    from engines.report import Variant, build_report

    meta = _read_json(args.data / "dataset.json")
    heldout = _load_data(args.data, "heldout")
    store = open_model_store()
    teacher = model_path(args.teacher, store)
    if Path(meta["teacher"]).name != teacher.name:
        heldout.teacher = None  # cached outputs belong to another teacher: run this one
    variants = []
    for item in args.variant:
        name, sep, file = item.partition("=")
        if not sep or not name or not file:
            raise UserError(f"--variant takes NAME=FILE, got {item!r}")
        variants.append(Variant(name, model_path(file, store)))
    report = build_report(
        heldout,
        Variant(teacher.stem, teacher),
        variants,
        args.out,
        scale=int(meta["scale"]),
        input_size=args.size,
        threads=args.threads,
        latency_runs=args.runs,
        grid_items=args.grid,
        notes=args.notes,
        progress=not args.no_progress,
    )
    sys.stdout.write(report.markdown())
    print(f"wrote {args.out / 'report.md'}, report.json and grid.png")
    return 0
