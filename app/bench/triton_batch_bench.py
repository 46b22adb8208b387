"""`swapcast bench-batch --backend triton`: live sessions spread over several media processes that share one
Triton server for the swap model, beside the same processes each with their own in-process batcher, in one run.

Each media process is a real, separate interpreter (multiprocessing, spawn) that detects on whole frames
itself, as the serving process does; what differs between the two modes is where the swap model runs:
- `in_process`: one shared dynamic batcher per stage inside each process (swapcast's own batcher), the
  swapper on this process's ONNX Runtime;
- `triton`: the swapper on Triton (`app.runtime.triton.TritonModel`, system shared memory when the server is
  on this host), called with each frame's faces; Triton's dynamic batcher groups the calls of all sessions of
  all processes. Its mean batch size and queue wait come from Triton's statistics API.
Sessions are dealt round-robin over the processes; every process starts each cell at the same moment.

A transport section times single face-crop calls to the swapper in this process: in-process, over Triton's
gRPC, and over Triton with system shared memory (what the media tier saves by sharing the host).
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from app.bench.batch_bench import SessionResult, astronaut_scene, run_sessions, summarize
from app.errors import ModelError, UserError
from app.pipeline.batching import BatchedStage, BatchSettings
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.paste import PasteConfig
from app.pipeline.pipeline import FramePipeline, PipelineConfig, Stages
from app.pipeline.swap import InswapperEngine
from app.pipeline.timing import percentiles_ms
from app.runtime.onnx import OnnxModel
from app.runtime.triton_shm import SharedMemoryMode
from engines.store import ModelStore

MODES = ("in_process", "triton")
CELL_TIMEOUT_S = 300.0  # start-up (imports, model loads, warm-up) and one cell, on a busy 2-core machine


@dataclass(frozen=True)
class TritonBenchConfig:
    url: str
    model_dir: Path
    network: str = "reference_swapper_narrow"
    sessions: tuple[int, ...] = (1, 2, 4, 8)
    seconds: float = 4.0
    fps: int = 30
    media_processes: int = 2
    max_batch: int = 8
    max_delay_ms: float = 4.0
    shared_memory: SharedMemoryMode = "auto"
    transport_calls: int = 60
    threads: int = field(default_factory=lambda: max(1, (os.cpu_count() or 1) // 2))  # per media process


def _share(sessions: int, processes: int, index: int) -> int:
    """Sessions dealt round-robin: process `index`'s share of `sessions`."""
    return sessions // processes + (1 if index < sessions % processes else 0)


def _pipeline(mode: str, config: TritonBenchConfig, store: ModelStore) -> tuple[FramePipeline, Any, list[Any]]:
    """The media process's pipeline for `mode`, its prepared source, and its frames."""
    still, face, frames, detector, recognizer = astronaut_scene(store, config.threads)
    if mode == "triton":
        from app.runtime.triton import TritonModel

        swapper: Any = TritonModel(config.url, store.ensure(config.network), shared_memory=config.shared_memory)
    else:
        swapper = OnnxModel(store.ensure(config.network), threads=config.threads)
    engine = InswapperEngine(swapper, recognizer)
    source = engine.prepare(still, face)
    settings = BatchSettings(max_batch=config.max_batch, max_delay_ms=config.max_delay_ms, deadline_ms=None)
    registry = CollectorRegistry()
    live_detector = RetinaFaceDetector(detector.model, replace(detector.config, canvas="fixed"))
    # Detection on whole frames stays in the media process in both modes; with Triton the swap is not
    # batched here: each frame's faces go to Triton, whose batcher groups every process's calls.
    swap: Any = BatchedStage(engine, settings, registry, name="swap") if mode == "in_process" else engine
    stages = Stages(detect=BatchedStage(live_detector, settings, registry), swap=swap)
    pipeline = FramePipeline(detector, engine, config=PipelineConfig(paste=PasteConfig(mask="box")), stages=stages)
    return pipeline, source, frames


def _warm_up(pipeline: FramePipeline, source: Any, frame: Any, attempts: int = 5) -> None:
    """One frame through the pipeline. Triton refuses items queued past the deadline its repository was
    exported with (250 ms by default), which a cold server loading on busy cores can exceed: retried."""
    for attempt in range(attempts):
        try:
            pipeline.process([frame], source)
            return
        except ModelError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.5)


def media_process(index: int, mode: str, config: TritonBenchConfig, barrier: Any, results: Any) -> None:
    """One media process: builds its pipeline, then runs its share of every cell when the barrier opens."""
    pipeline = None
    try:
        pipeline, source, frames = _pipeline(mode, config, ModelStore(config.model_dir))
        _warm_up(pipeline, source, frames[0])
        for cell, sessions in enumerate(config.sessions):
            results.put(("ready", index, None))
            barrier.wait(CELL_TIMEOUT_S)
            share = _share(sessions, config.media_processes, index)  # 0: this process idles through the cell
            outcome = run_sessions(pipeline, source, frames, share, config.seconds, config.fps)
            results.put(("done", index, (cell, *outcome)))
    except threading.BrokenBarrierError:
        return  # another process failed and said why
    except BaseException as exc:  # reported to the parent, which stops the run with this message
        results.put(("error", index, f"{type(exc).__name__}: {exc}"))
        barrier.abort()
    finally:
        if pipeline is not None:
            pipeline.close()  # batchers and models: the Triton model frees its shared-memory regions


class TritonStatistics:
    """Triton's own counters for one model: items, executions (batches) and queue time."""

    def __init__(self, url: str, model: str) -> None:
        import tritonclient.grpc as grpcclient

        self._client = grpcclient.InferenceServerClient(url)
        self.model = model

    def read(self) -> dict[str, int]:
        stats = self._client.get_inference_statistics(self.model, as_json=True)["model_stats"][0]
        queue_stats = stats.get("inference_stats", {}).get("queue", {})
        return {
            "items": int(stats.get("inference_count", 0)),
            "executions": int(stats.get("execution_count", 0)),
            "queue_count": int(queue_stats.get("count", 0)),
            "queue_ns": int(queue_stats.get("ns", 0)),
        }

    @staticmethod
    def between(before: dict[str, int], after: dict[str, int]) -> dict[str, Any]:
        items = after["items"] - before["items"]
        executions = after["executions"] - before["executions"]
        queued = after["queue_count"] - before["queue_count"]
        return {
            "triton_items": items,
            "triton_executions": executions,
            "triton_mean_batch": round(items / executions, 2) if executions else None,
            "triton_mean_queue_ms": round((after["queue_ns"] - before["queue_ns"]) / queued / 1e6, 3)
            if queued
            else None,
        }

    def close(self) -> None:
        self._client.close()


class Inbox:
    """Messages from the media processes, taken by kind: a process may report it is ready for the next cell
    while another still finishes this one. A process that failed or died stops the run at once."""

    def __init__(self, results: Any, processes: list[Any], mode: str) -> None:
        self._results = results
        self._processes = processes
        self._mode = mode
        self._early: list[tuple[str, int, Any]] = []

    def take(self, kind: str) -> list[Any]:
        """The payload of one `kind` message from every process, in process order."""
        taken: dict[int, Any] = {}
        for message in [m for m in self._early if m[0] == kind]:
            self._early.remove(message)
            taken[message[1]] = message[2]
        deadline = time.monotonic() + CELL_TIMEOUT_S
        while len(taken) < len(self._processes):
            try:
                got, index, payload = self._results.get(timeout=0.5)
            except queue.Empty:
                self._check_alive(set(taken), deadline)
                continue
            if got == "error":
                raise ModelError(f"bench-batch: {self._mode} media process {index} failed: {payload}")
            if got == kind:
                taken[index] = payload
            else:
                self._early.append((got, index, payload))
        return [taken[index] for index in sorted(taken)]

    def _check_alive(self, reported: set[int], deadline: float) -> None:
        for index, process in enumerate(self._processes):
            if index not in reported and process.exitcode is not None:
                raise ModelError(f"bench-batch: {self._mode} media process {index} exited with code {process.exitcode}")
        if time.monotonic() > deadline:
            raise ModelError(f"bench-batch: a {self._mode} media process did not report in time")


def run_mode(mode: str, config: TritonBenchConfig) -> list[dict[str, Any]]:
    """Every cell of one mode, over `media_processes` spawned processes; one summary per cell."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(config.media_processes + 1)
    results = context.Queue()
    processes = [
        context.Process(target=media_process, args=(index, mode, config, barrier, results), daemon=True)
        for index in range(config.media_processes)
    ]
    stats = TritonStatistics(config.url, config.network) if mode == "triton" else None
    inbox = Inbox(results, processes, mode)
    cells: list[dict[str, Any]] = []
    for process in processes:
        process.start()
    try:
        for cell, sessions in enumerate(config.sessions):
            inbox.take("ready")  # every process built and warmed up, or done with the previous cell
            before = stats.read() if stats else None
            barrier.wait(CELL_TIMEOUT_S)
            merged: list[SessionResult] = []
            elapsed = 0.0
            for got_cell, session_results, took in inbox.take("done"):
                assert got_cell == cell
                merged.extend(session_results)
                elapsed = max(elapsed, took)
            row = {"sessions": sessions, **summarize(merged, elapsed)}
            if stats is not None and before is not None:
                row.update(TritonStatistics.between(before, stats.read()))
            cells.append(row)
    finally:
        barrier.abort()
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.terminate()
        if stats is not None:
            stats.close()
    return cells


def measure_transport(config: TritonBenchConfig, store: ModelStore) -> dict[str, Any]:
    """Per-call latency of one face crop through the swapper: in-process, Triton over gRPC, Triton over
    system shared memory (loopback only). Same inputs, alternated call by call so load hits all alike."""
    from app.runtime.triton import TritonModel

    path = store.ensure(config.network)
    local = OnnxModel(path, threads=config.threads)
    rng = np.random.default_rng(0)
    feeds = {spec.name: rng.random([1, *spec.shape[1:]], dtype=np.float32) for spec in local.session.get_inputs()}
    runners: dict[str, Any] = {
        "in_process": local,
        "triton_grpc": TritonModel(config.url, path, shared_memory="off"),
    }
    shared = TritonModel(config.url, path, shared_memory="auto")
    if shared.uses_shared_memory:
        runners["triton_shared_memory"] = shared
    else:
        shared.close()
    timings: dict[str, list[float]] = {name: [] for name in runners}
    try:
        for runner in runners.values():
            runner.run(feeds)  # warm-up
        for _ in range(config.transport_calls):
            for name, runner in runners.items():
                start = time.perf_counter()
                runner.run(feeds)
                timings[name].append(time.perf_counter() - start)
    finally:
        for runner in runners.values():
            runner.close()
    input_bytes = sum(value.nbytes for value in feeds.values())
    return {
        "call": f"{config.network}, batch 1 ({input_bytes} bytes in)",
        "latency_ms": {name: percentiles_ms(values) for name, values in timings.items()},
    }


def run_triton_bench(config: TritonBenchConfig, store: ModelStore) -> dict[str, Any]:
    if config.media_processes < 1:
        raise UserError("bench-batch: --media-processes must be at least 1")
    from app.runtime.triton import TritonModel

    for name in ("retinaface_mnet025", "reference_recognizer", config.network):
        store.ensure(name)
    TritonModel(config.url, store.path(config.network)).close()  # a clear error now if Triton or the model is missing
    by_mode = {mode: run_mode(mode, config) for mode in MODES}
    rows = []
    for index, sessions in enumerate(config.sessions):
        local, remote = by_mode["in_process"][index], by_mode["triton"][index]
        p50_l, p50_r = local["latency_ms"].get("p50"), remote["latency_ms"].get("p50")
        rows.append(
            {
                "network": config.network,
                "sessions": sessions,
                "in_process": local,
                "triton": remote,
                "ratio_faces_per_s": round(remote["faces_per_s"] / local["faces_per_s"], 2)
                if local["faces_per_s"]
                else None,
                "ratio_p50_latency": round(p50_r / p50_l, 2) if p50_r and p50_l else None,
            }
        )
    return {
        "benchmark": "batch-triton",
        "triton_url": config.url,
        "media_processes": config.media_processes,
        "threads_per_process": config.threads,
        "fps_per_session": config.fps,
        "seconds_per_cell": config.seconds,
        "frame": "640x480, one real face (latency per frame is latency per face)",
        "batcher": {"max_batch": config.max_batch, "max_delay_ms": config.max_delay_ms},
        "shared_memory": config.shared_memory,
        "swap_weights": "untrained reference networks (cost and plumbing only)",
        "ratios": "triton / in_process (faces_per_s above 1 and latency below 1 favour Triton)",
        "rows": rows,
        "transport": measure_transport(config, store),
    }
