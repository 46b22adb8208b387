"""Distillation: a smaller super-resolution network trained on the data set's teacher outputs, and a smaller
inswapper-contract swapper trained on its teacher's swaps; each writes `<name>.onnx`, `<name>.pt` and
`<name>.json`."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.engine_jobs.inputs import (
    aligned_crops,
    cost,
    export,
    load_data,
    model_path,
    photos,
    read_json,
    set_threads,
    write_json,
)
from app.errors import UserError
from app.model_store import open_model_store

if TYPE_CHECKING:
    from torch import nn

    from engines.distill import DistillConfig

StudentShape = tuple[int, int]  # an SRVGG student's features and convolutions


def _student(student: Path | StudentShape, scale: int, init: str | None, seed: int) -> nn.Module:
    """The network to train: loaded from a file, or a new SRVGG of that shape (`init`: whose weights start it)."""
    from engines.distill import load_student
    from engines.torchnets import SRVGG, SRVGGSpec, load_onnx_net

    if isinstance(student, Path):
        if not student.is_file():
            raise UserError(f"--student-from {student} does not exist")
        return load_onnx_net(student) if student.suffix == ".onnx" else load_student(student)
    if scale not in (2, 3, 4):
        raise UserError(f"an SRVGG student upscales by 2, 3 or 4, the data set needs {scale}")
    import torch

    feat, convs = student
    torch.manual_seed(seed)
    net = SRVGG(SRVGGSpec.compact(feat, convs, shuffle=scale))
    if init:
        first = SRVGG.from_onnx(model_path(init, open_model_store()))
        if first.spec != net.spec:
            raise UserError(f"--init {init} is an SRVGG of another shape ({first.spec}) than {net.spec}")
        net = first
    return net


def distill_sr(
    data: Path,
    out: Path,
    *,
    name: str,
    student: Path | StudentShape,
    init: str | None,
    config: DistillConfig,
    resume: bool,
    progress: bool,
) -> dict[str, Any]:
    """Distil the data set's teacher into `student` (a network file, or the shape of a new SRVGG); returns what
    `<name>.json` records."""
    set_threads(config.threads)
    from engines.distill import distill, mean_loss, save_student, sr_train_data

    meta = read_json(data / "dataset.json")
    scale = int(meta["scale"])
    train = load_data(data, "train")
    net = _student(student, scale, init, config.seed)
    import torch

    with torch.no_grad():
        probe = net(torch.zeros(1, 3, 8, 8))
    if probe.shape[-1] != 8 * scale:
        raise UserError(f"the student upscales 8 px to {probe.shape[-1]} px; the data set is x{scale}")
    train_data = sr_train_data(train)
    start_loss = mean_loss(net, train_data, config)
    result = distill(net, train_data, config, out / f"{name}.work", resume=resume, progress=progress)
    provenance = {"swapcast.teacher": Path(meta["teacher"]).name, "swapcast.distill_steps": str(config.steps)}
    err = export(result.net, out / f"{name}.onnx", provenance)
    save_student(out / f"{name}.pt", result.net, provenance)
    end_loss = mean_loss(result.net, train_data, config)
    summary: dict[str, Any] = {
        "student": str(out / f"{name}.onnx"),
        "cost": cost(out / f"{name}.onnx"),
        "teacher": meta["teacher"],
        "teacher_cost": cost(Path(meta["teacher"])),
        "config": asdict(config),
        "train_loss_before": start_loss,
        "train_loss_after": end_loss,
        "export_max_abs_error": err,
        "losses": result.losses,
    }
    write_json(out / f"{name}.json", summary)
    return summary


def distill_swap(
    out: Path,
    *,
    teacher: str,
    name: str,
    divisor: int,
    blocks: int | None,
    count: int,
    heldout: set[str],
    config: DistillConfig,
    resume: bool,
    progress: bool,
) -> dict[str, Any]:
    """Distil the swapper `teacher` into one `divisor` times narrower, trained on augmented crops of the sample
    photos outside `heldout` and judged on those inside; returns what `<name>.json` records."""
    set_threads(config.threads)
    from engines.distill import mean_loss
    from engines.swap_student import (
        default_student_spec,
        distill_swapper,
        new_student,
        parameter_count,
        swap_train_data,
        teacher_emap,
    )

    threads, seed = config.threads, config.seed
    store = open_model_store()
    teacher_path = model_path(teacher, store)
    crops = aligned_crops(photos(None), threads, store)
    train = [c for c in crops if c.image_id not in heldout]
    test = [c for c in crops if c.image_id in heldout]
    if not train or not test:
        raise UserError(f"need faces both outside and inside the held-out photos {sorted(heldout)}")
    train_data = swap_train_data(teacher_path, train, count, seed=seed, threads=threads, progress=progress)
    test_data = swap_train_data(
        teacher_path, test, max(4, len(test)), seed=seed + 1, threads=threads, progress=progress, augment=False
    )
    spec = default_student_spec(teacher_path, divisor, blocks)
    student = distill_swapper(
        teacher_path, train_data, out, spec=spec, config=config, resume=resume, progress=progress, name=name
    )
    untrained = new_student(spec, teacher_emap(teacher_path), seed)
    summary: dict[str, Any] = {
        "teacher": str(teacher_path),
        "student": str(student.onnx_path),
        "student_spec": spec.to_dict(),
        "student_params": parameter_count(student.net),
        "teacher_params": student.teacher_params,
        "heldout_loss_untrained": mean_loss(untrained, test_data, config),
        "heldout_loss_trained": mean_loss(student.net, test_data, config),
        "export_max_abs_error": student.export_error,
        "losses": student.result.losses,
    }
    write_json(out / f"{name}.json", summary)
    return summary
