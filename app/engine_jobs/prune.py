"""Structured channel pruning of a model with a sensitivity scan on the data set, then (optionally) a distilled
fine-tune from the unpruned model; writes `<name>.onnx`, `<name>.pt`, `<name>.json` (and `<name>_ft.*`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.engine_jobs.inputs import cost, export, load_data, model_path, read_json, set_threads, write_json
from app.model_store import open_model_store

if TYPE_CHECKING:
    from engines.distill import DistillConfig
    from engines.prune import Budget


def prune_model(
    data: Path,
    out: Path,
    *,
    model: str,
    name: str | None,
    target: float,
    budget: Budget,
    ratios: tuple[float, ...],
    compensate: bool,
    finetune: DistillConfig | None,
    resume: bool,
    threads: int,
    progress: bool,
) -> dict[str, Any]:
    """Prune `model` (a name or ONNX file) by `target` of its `budget`; returns what `<name>.json` records.
    `finetune`: the training of the fine-tune (none without it)."""
    set_threads(threads)
    from engines.distill import distill, run_teacher, save_student, sr_train_data
    from engines.prune import prune_network
    from engines.torchnets import load_onnx_net

    source = model_path(model, open_model_store())
    meta = read_json(data / "dataset.json")
    train, scan = load_data(data, "train"), load_data(data, "scan")
    net = load_onnx_net(source)
    result = prune_network(
        net,  # type: ignore[arg-type]
        scan.lr,
        target=target,
        budget=budget,
        ratios=ratios,
        heldout_gt=scan.hr,
        calibration=train.lr[:32] if compensate else None,
        progress=progress,
    )
    name = name or f"{source.stem}_pruned"
    out.mkdir(parents=True, exist_ok=True)
    provenance = {"swapcast.pruned_from": source.name, "swapcast.prune_target": f"{target} of {budget}"}
    err = export(result.net, out / f"{name}.onnx", provenance)
    save_student(out / f"{name}.pt", result.net, provenance)
    summary: dict[str, Any] = {
        "source": str(source),
        "pruned": str(out / f"{name}.onnx"),
        "export_max_abs_error": err,
        "cost_before": cost(source),
        "cost_after": cost(out / f"{name}.onnx"),
        "plan": result.plan.to_dict(),
    }
    if finetune is not None:
        train_data = sr_train_data(train)
        if Path(meta["teacher"]).name != source.name:
            # Fine-tune from the unpruned model itself, whatever teacher the data set was made with.
            train_data.soft = run_teacher(source, {"input": train.lr}, threads=threads, progress=progress)
        trained = distill(result.net, train_data, finetune, out / f"{name}_ft.work", resume=resume, progress=progress)
        ft_name = f"{name}_ft"
        ft_meta = {**provenance, "swapcast.finetune_steps": str(finetune.steps)}
        summary["finetuned"] = str(out / f"{ft_name}.onnx")
        summary["finetune_export_max_abs_error"] = export(trained.net, out / f"{ft_name}.onnx", ft_meta)
        save_student(out / f"{ft_name}.pt", trained.net, ft_meta)
        summary["finetune_losses"] = trained.losses
    write_json(out / f"{name}.json", summary)
    return summary
