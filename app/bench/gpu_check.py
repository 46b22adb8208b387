"""One prepared check of the GPU path, for the first machine with an NVIDIA GPU: `scripts/gpu-check.sh`.

Sections, each reported as {"status": "ok" | "failed" | "skipped", "reason", ...figures} in one JSON file
(rewritten after every section, so a stopped run still leaves what it measured):

* versions: driver, CUDA, torch, cuda-bindings, TensorRT, ONNX Runtime, and what is wrong with the mix
  (`engines.tensorrt.versions`);
* pytest_gpu: `pytest -m gpu`;
* torch: per model, FP32 (TF32 off) and FP16 against ONNX Runtime, the CUDA-graph capture outcome per
  batch size, and latency eager vs replayed. On a CPU (`--dry`) the same models are checked for what a
  capture needs (no host reads on the meta device) and FP32 parity;
* capture_concurrency: graphs captured on one thread while another runs eager work, errors counted;
* tensorrt: per model, an FP16 and an INT8 engine built (optimisation level 1, to fit the budget) and
  run against ONNX Runtime (where TensorRT is installed; INT8 needs PyAV for its calibration clips),
  with whether the parser took the cubic Resize;
* bench_engines, bench_batch: `swapcast bench-engines` and `swapcast bench-batch` (batching on; both
  need PyAV for their clips).

Parts whose requirements are missing are skipped with the reason. The whole run keeps to `--budget`
seconds (default 450, inside the 8 minutes the script allows): a part that cannot start in time is
skipped and says so.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from app.pipeline.timing import call_times
from engines.atomic import write_bytes_atomic

MODELS = ("retinaface_mnet025", "reference_swapper_narrow", "realesr_animevideov3_x2", "realesr_animevideov3_x3")
BATCHES = (1, 2, 4, 8)
TIMED_RUNS = 10
TRT_OPTIMIZATION_LEVEL = 1  # quick builds to fit the time budget; served engines use TensorRT's default (3)
BENCH_RESERVE_S = 150.0  # kept for the two benchmarks when TensorRT builds run long
ROOT = Path(__file__).resolve().parents[2]


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def cuda_ready() -> bool:
    if not has("torch"):
        return False
    import torch

    return bool(torch.cuda.is_available())


def shapes_for(name: str, batch: int) -> dict[str, tuple[int, ...]]:
    if name == "retinaface_mnet025":
        return {"input": (batch, 3, 480, 640)}
    if name.startswith("reference_swapper"):
        return {"target": (batch, 3, 128, 128), "source": (batch, 512)}
    return {"input": (batch, 3, 128, 128)}


def feeds_for(name: str, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs in each model's range: detector pixels minus the mean, crops in [0, 1], unit latents."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for input_name, shape in shapes_for(name, batch).items():
        if name == "retinaface_mnet025":
            feeds[input_name] = (rng.integers(0, 256, shape) - 110.0).astype(np.float32)
        elif len(shape) == 2:
            latent = rng.standard_normal(shape).astype(np.float32)
            feeds[input_name] = latent / np.linalg.norm(latent, axis=1, keepdims=True)
        else:
            feeds[input_name] = rng.random(shape, dtype=np.float32)
    return feeds


def profile_dims(name: str) -> dict[str, tuple[int, int, int]]:
    """TensorRT profile ranges of the free axes: the detector up to 640, enhancer crops up to 256."""
    if name == "retinaface_mnet025":
        return {"height": (32, 480, 640), "width": (32, 640, 640)}
    if name.startswith("realesr"):
        return {"height": (32, 128, 256), "width": (32, 128, 256)}
    return {}


def max_abs(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.abs(x.astype(np.float32) - y.astype(np.float32)).max()) for x, y in zip(a, b, strict=True))


def p50_ms(call: Callable[[], object], runs: int = TIMED_RUNS) -> float:
    return round(float(np.median(call_times(call, runs))) * 1000.0, 3)


class Check:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.deadline = time.monotonic() + args.budget
        self.report: dict[str, Any] = {"dry": args.dry, "budget_s": args.budget, "sections": {}}
        self.gpu = cuda_ready() and not args.dry
        # Engines and batch-dynamic rewrites go here, never beside the user's models.
        self.work = Path(args.output).resolve().parent / ".gpu-check-work"
        self.work.mkdir(parents=True, exist_ok=True)
        from app.model_store import open_model_store
        from engines.store import ModelStore

        self.store = ModelStore(args.model_dir) if args.model_dir else open_model_store()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        write_bytes_atomic(self.args.output, (json.dumps(self.report, indent=2, default=str) + "\n").encode())

    def section(self, name: str, run: Callable[[], dict[str, Any]], *, needs: float = 5.0) -> None:
        started = time.monotonic()
        if self.left() < needs:
            result: dict[str, Any] = {"status": "skipped", "reason": f"time budget: {self.left():.0f} s left"}
        else:
            try:
                result = run()
                result.setdefault("status", "ok")
            except Exception as exc:  # a failed part is a finding: report it and go on with the rest
                result = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
        result["seconds"] = round(time.monotonic() - started, 1)
        self.report["sections"][name] = result
        self.save()
        print(f"gpu-check: {name}: {result['status']} ({result['seconds']} s){' - ' + result.get('reason', '')}")

    # -- sections -------------------------------------------------------------------------------------

    def versions(self) -> dict[str, Any]:
        from engines.tensorrt.versions import installed_stack, stack_problems

        torch_cuda = None
        gpu = None
        if has("torch"):
            import torch

            torch_cuda = torch.version.cuda
            if torch.cuda.is_available():
                gpu = {
                    "name": torch.cuda.get_device_name(0),
                    "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
                }
        driver = None
        if shutil.which("nvidia-smi"):
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            driver = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
        stack = installed_stack(torch_cuda)
        return {
            "python": sys.version.split()[0],
            "driver": driver,
            "gpu": gpu,
            "torch": _version("torch"),
            "torch_cuda": torch_cuda,
            "cuda_bindings": stack.cuda_bindings,
            "tensorrt": stack.tensorrt,
            "tensorrt_cuda_major": stack.tensorrt_cuda,
            "onnxruntime": _version("onnxruntime"),
            "onnx2torch": _version("onnx2torch"),
            "pyav": _version("av"),
            "stack_problems": stack_problems(stack),
        }

    def pytest_gpu(self) -> dict[str, Any]:
        if self.args.dry:
            return {"status": "skipped", "reason": "dry mode"}
        timeout = max(30.0, min(self.left() * 0.3, 140.0))
        command = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests"]
        try:
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"status": "failed", "reason": f"pytest -m gpu ran past {timeout:.0f} s"}
        summary = (done.stdout.strip().splitlines() or [""])[-1]
        status = "ok" if done.returncode in (0, 5) else "failed"
        return {"status": status, "returncode": done.returncode, "summary": summary, "tail": done.stdout[-3000:]}

    def _runnable(self, name: str) -> Path:
        """The model's file, or its batch-dynamic rewrite (in the check's own folder) when its batch is fixed."""
        import onnx

        from engines.onnx_batch import make_batch_dynamic

        original = self.store.ensure(name)
        model = onnx.load(str(original), load_external_data=False)
        initializers = {init.name for init in model.graph.initializer}
        first = next(value for value in model.graph.input if value.name not in initializers)
        dims = first.type.tensor_type.shape.dim
        if not (dims and dims[0].HasField("dim_value") and dims[0].dim_value == 1):
            return original
        dynamic = self.work / f"{original.stem}.dynamic.onnx"
        return dynamic if dynamic.is_file() else make_batch_dynamic(original, dynamic)

    def torch(self) -> dict[str, Any]:
        if not has("torch") or not has("onnx2torch"):
            return {"status": "skipped", "reason": "PyTorch or onnx2torch is not installed"}
        models: dict[str, Any] = {}
        for name in self.args.models:
            if self.left() < 20:
                models[name] = {"status": "skipped", "reason": "time budget"}
                continue
            try:
                models[name] = self._torch_model(name)
            except Exception as exc:  # one model's failure must not hide the others'
                models[name] = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
        failed = [n for n, r in models.items() if r.get("status") == "failed"]
        return {"status": "failed" if failed else "ok", "device": "cuda" if self.gpu else "cpu", "models": models}

    def _torch_model(self, name: str) -> dict[str, Any]:
        import torch

        from app.runtime.onnx import OnnxModel
        from app.runtime.torch_backend import TorchModel
        from app.runtime.torch_graphs import host_reads

        path = self._runnable(name)
        feeds = feeds_for(name, 2)
        want = OnnxModel(path).run(feeds)
        result: dict[str, Any] = {"file": path.name}
        if not self.gpu:  # what a capture needs, checked on the meta device; FP32 parity on the CPU
            model = TorchModel(path, device="cpu", cuda_graphs=False)
            example = [torch.from_numpy(feeds[n]) for n in model.input_names]
            module = model._static_module(example)
            result["capture_ready"] = module is not None and host_reads(module, example) is None
            result["fp32_max_abs_vs_onnxruntime"] = max_abs(model.run(feeds), want)
            result["status"] = (
                "ok" if result["capture_ready"] and result["fp32_max_abs_vs_onnxruntime"] < 1e-3 else ("failed")
            )
            return result
        fp32 = TorchModel(path, device="cuda", precision="fp32", cuda_graphs=False)
        result["fp32_tf32_off_max_abs_vs_onnxruntime"] = max_abs(fp32.run(feeds), want)
        eager = TorchModel(path, device="cuda", precision="fp16", cuda_graphs=False)
        graphs = TorchModel(path, device="cuda", precision="fp16")
        result["fp16_max_abs_vs_onnxruntime"] = max_abs(eager.run(feeds), want)
        outcomes = graphs.prepare_graphs([shapes_for(name, b) for b in BATCHES])
        per_batch = {}
        for batch in BATCHES:
            batch_feeds = feeds_for(name, batch, seed=batch)
            outcome = next((o for k, o in outcomes.items() if k[0][0][0] == batch), "not tried")
            row: dict[str, Any] = {"capture": outcome}
            row["eager_fp16_p50_ms"] = p50_ms(functools.partial(eager.run, batch_feeds))
            if outcome == "captured":
                replayed = graphs.run(batch_feeds)
                row["graph_vs_eager_max_abs"] = max_abs(replayed, eager.run(batch_feeds))
                row["graph_fp16_p50_ms"] = p50_ms(functools.partial(graphs.run, batch_feeds))
            per_batch[str(batch)] = row
        result["batches"] = per_batch
        ok = result["fp32_tf32_off_max_abs_vs_onnxruntime"] < 1e-3 and all(
            r["capture"] == "captured" for r in per_batch.values()
        )
        result["status"] = "ok" if ok else "failed"
        return result

    def capture_concurrency(self) -> dict[str, Any]:
        if not self.gpu:
            return {"status": "skipped", "reason": "dry mode" if self.args.dry else "no CUDA device for PyTorch"}
        from app.runtime.torch_backend import TorchModel

        eager = TorchModel(self._runnable("realesr_animevideov3_x2"), device="cuda", cuda_graphs=False)
        graphs = TorchModel(self._runnable("retinaface_mnet025"), device="cuda", precision="fp16")
        errors: list[str] = []
        runs = 0
        stop = threading.Event()

        def busy() -> None:
            nonlocal runs
            feeds = feeds_for("realesr_animevideov3_x2", 2)
            while not stop.is_set():
                try:
                    eager.run(feeds)
                    runs += 1
                except Exception as exc:  # counted: the point of this part
                    errors.append(f"{type(exc).__name__}: {exc}"[:200])

        worker = threading.Thread(target=busy, daemon=True)
        worker.start()
        try:
            outcomes = graphs.prepare_graphs([shapes_for("retinaface_mnet025", b) for b in BATCHES])
        finally:
            stop.set()
            worker.join(60)
        captured = sum(1 for o in outcomes.values() if o == "captured")
        status = "ok" if not errors and captured == len(BATCHES) else "failed"
        return {
            "status": status,
            "eager_runs": runs,
            "errors": len(errors),
            "first_errors": errors[:3],
            "captured": captured,
            "tried": len(outcomes),
        }

    def tensorrt(self) -> dict[str, Any]:
        if not has("tensorrt"):
            return {"status": "skipped", "reason": "TensorRT is not installed"}
        if not self.gpu:
            return {"status": "skipped", "reason": "dry mode" if self.args.dry else "no CUDA device"}
        models: dict[str, Any] = {}
        for name in self.args.models:
            for precision in ("fp16", "int8"):
                key = f"{name}:{precision}"
                if self.left() < BENCH_RESERVE_S + 45:
                    models[key] = {"status": "skipped", "reason": "time budget (kept for the benchmarks)"}
                elif precision == "int8" and not has("av"):
                    models[key] = {"status": "skipped", "reason": "PyAV is not installed (calibration clips need it)"}
                else:
                    try:
                        models[key] = self._tensorrt_model(name, precision)
                    except Exception as exc:  # reported per engine
                        models[key] = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
        failed = [k for k, r in models.items() if r.get("status") == "failed"]
        return {"status": "failed" if failed else "ok", "engines": models}

    def _tensorrt_model(self, name: str, precision: str) -> dict[str, Any]:
        from app.runtime.onnx import OnnxModel
        from app.runtime.tensorrt import TensorRTModel
        from engines.model_files import ModelFiles
        from engines.tensorrt.build import BuildOptions, build_engine
        from engines.tensorrt.manifest import probe_platform

        platform = probe_platform()
        runnable = self._runnable(name)
        sha256, _ = self.store.expected(name)
        calibration = None
        if precision == "int8":
            from app.calibration import calibration_set

            calibration = calibration_set(self.store, name, runnable, 16)
        files = ModelFiles(self.work / f"{name}.onnx")
        engine = files.engine(platform.gpu_name, precision)
        options = BuildOptions(
            precision=precision,  # type: ignore[arg-type]
            max_batch=8,
            dims=profile_dims(name),
            calibration=calibration,
            calibration_cache=(
                files.calibration_cache(platform.gpu_name, precision, calibration.digest(), platform.tensorrt_version)
                if calibration is not None
                else None
            ),
            optimization_level=TRT_OPTIMIZATION_LEVEL,
            timing_cache=files.timing_cache(platform.gpu_name, platform.tensorrt_version),
        )
        started = time.monotonic()
        manifest = build_engine(runnable, engine, model=name, source_sha256=sha256 or "", options=options)
        result: dict[str, Any] = {
            "build_s": round(time.monotonic() - started, 1),
            "build_mode": manifest.build_mode,
            "optimization_level": TRT_OPTIMIZATION_LEVEL,
        }
        result["rewrites"] = list(manifest.rewrites)
        import onnx

        from engines.resize_modes import cubic_resizes

        if cubic_resizes(onnx.load(str(runnable), load_external_data=False)):
            refused = any("cubic" in r for r in manifest.rewrites)
            result["cubic_resize"] = "refused by the parser: built with linear" if refused else "parsed"
        feeds = feeds_for(name, 2)
        want = OnnxModel(runnable).run(feeds)
        with TensorRTModel(engine, source_sha256=sha256 or "", platform=platform) as model:
            got = model.run(feeds)
            result["max_abs_vs_onnxruntime"] = max_abs(got, want)
            result["p50_ms_batch2"] = p50_ms(lambda: model.run(feeds))
            batch8 = feeds_for(name, 8)
            result["p50_ms_batch8"] = p50_ms(lambda: model.run(batch8))
        return result

    def _swapcast(
        self, name: str, arguments: list[str], cap: float, env: dict[str, str] | None = None
    ) -> dict[str, Any]:
        if self.args.dry:
            return {"status": "skipped", "reason": "dry mode"}
        if not has("av"):
            return {"status": "skipped", "reason": "PyAV is not installed (the benchmark clips need it)"}
        timeout = max(30.0, min(self.left() - 10, cap))
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "out.json"
            command = [sys.executable, "-m", "app.cli", name, *arguments, "--output", str(out)]
            environment = {**os.environ, **(env or {})}
            if self.args.model_dir:
                environment["SWAPCAST_MODEL_DIR"] = str(self.args.model_dir)
            try:
                done = subprocess.run(
                    command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=environment
                )
            except subprocess.TimeoutExpired:
                return {"status": "failed", "reason": f"{name} ran past {timeout:.0f} s"}
            if done.returncode != 0 or not out.is_file():
                return {"status": "failed", "reason": (done.stderr.strip().splitlines() or ["no output"])[-1]}
            return {"result": json.loads(out.read_text())}

    def bench_engines(self) -> dict[str, Any]:
        return self._swapcast("bench-engines", ["--runs", "5"], cap=100.0)

    def bench_batch(self) -> dict[str, Any]:
        return self._swapcast(
            "bench-batch",
            ["--networks", "reference_swapper_narrow", "--sessions", "1,4", "--seconds", "2"],
            cap=45.0,
            env={"SWAPCAST_BATCHING_ENABLED": "1"},
        )

    def run(self) -> int:
        self.section("versions", self.versions, needs=0)
        self.section("pytest_gpu", self.pytest_gpu, needs=60)
        self.section("torch", self.torch, needs=20)
        self.section("capture_concurrency", self.capture_concurrency, needs=20)
        self.section("tensorrt", self.tensorrt, needs=60)
        self.section("bench_engines", self.bench_engines, needs=40)
        self.section("bench_batch", self.bench_batch, needs=30)
        statuses = {name: s["status"] for name, s in self.report["sections"].items()}
        self.report["summary"] = statuses
        self.save()
        print(f"gpu-check: report written to {self.args.output}")
        return 1 if "failed" in statuses.values() else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-check", description="Check swapcast's GPU path; one JSON report.")
    parser.add_argument("--dry", action="store_true", help="CPU-only parts (what CI runs); GPU parts are skipped")
    parser.add_argument("--output", type=Path, default=Path("gpu-check.json"))
    parser.add_argument("--budget", type=float, default=450.0, help="seconds for the whole check (default 450)")
    parser.add_argument("--model-dir", type=Path, default=None, help="model folder (default $SWAPCAST_MODEL_DIR)")
    parser.add_argument("--models", default=",".join(MODELS), help="comma list of models")
    args = parser.parse_args(argv)
    args.models = tuple(m.strip() for m in args.models.split(",") if m.strip())
    return Check(args).run()


if __name__ == "__main__":
    sys.exit(main())
