"""The TensorRT build and run code, driven end to end on a CPU through stand-ins for `tensorrt` and the
CUDA runtime bindings (tests/engines/fake_gpu.py): both build modes (TensorRT 10 builder flags, TensorRT 11
strongly typed), the calibrator's batches, cache and errors, the timing cache, the cubic-Resize fallback,
and the runner's stream. What only a GPU can show (kernels, numerics) is in the gpu-marked tests."""

import logging
import stat
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from app.runtime.tensorrt import TensorRTModel
from engines.errors import ModelError
from engines.model_files import ModelFiles
from engines.precision.int8 import CalibrationSet
from engines.store import ModelStore
from engines.tensorrt.build import BuildOptions, build_engine
from engines.tensorrt.calibrator import CalibrationBatches, CalibrationFeed
from engines.tensorrt.manifest import native_handle, probe_platform, read_manifest
from engines.tensorrt.versions import GpuStack, stack_problems
from tests.engines.fake_gpu import Record, make_cudart, make_tensorrt

ENHANCER = "realesr_animevideov3_x2"
DIMS = {"height": (16, 32, 64), "width": (16, 32, 64)}


def install(monkeypatch: pytest.MonkeyPatch, major: int, *, refuse_cubic: bool = False) -> Record:
    record = Record()
    monkeypatch.setitem(sys.modules, "tensorrt", make_tensorrt(major, record, refuse_cubic=refuse_cubic))
    monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", make_cudart(record))
    return record


def crops(count: int, seed: int = 0) -> CalibrationSet:
    rng = np.random.default_rng(seed)
    return CalibrationSet(
        ENHANCER, tuple({"input": rng.random((1, 3, 32, 32), dtype=np.float32)} for _ in range(count))
    )


def build(store: ModelStore, tmp_path: Path, precision: str = "fp16", **options: object) -> tuple[Path, object]:
    """Build as `swapcast engines build-trt` does, into `tmp_path`, with the files named by ModelFiles."""
    source = store.ensure(ENHANCER)
    files = ModelFiles(tmp_path / source.name)
    engine = files.engine("Fake GPU", precision)
    calibration = options.get("calibration")
    if isinstance(calibration, CalibrationSet):
        version = sys.modules["tensorrt"].__version__
        options["calibration_cache"] = files.calibration_cache("Fake GPU", precision, calibration.digest(), version)
    opts = BuildOptions(precision=precision, max_batch=4, dims=DIMS, **options)  # type: ignore[arg-type]
    manifest = build_engine(source, engine, model=ENHANCER, source_sha256="a" * 64, options=opts)
    return engine, manifest


@pytest.mark.parametrize(("major", "mode"), [(10, "builder-flags"), (11, "strongly-typed")])
def test_fp16_builds_in_the_mode_of_each_tensorrt_major(
    store: ModelStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, major: int, mode: str
) -> None:
    record = install(monkeypatch, major)
    engine, _ = build(store, tmp_path)
    manifest = read_manifest(engine)
    assert manifest.build_mode == mode and manifest.tensorrt_version.startswith(f"{major}.")
    if major == 10:  # the FP32 graph with the FP16 flag
        assert record.parsed == [f"{ENHANCER}.onnx"] and record.builder_flags == ["FP16"]
        assert record.network_flags == [0]
    else:  # strongly typed: the FP16 graph decides
        assert record.parsed == [f"{ENHANCER}.fp16.onnx"] and record.builder_flags == []
        assert record.network_flags == [1 << 1]
    assert stat.S_IMODE(engine.stat().st_mode) == 0o644  # readable by a server running as another user


def test_int8_on_tensorrt_11_parses_the_tensorrt_qdq_form(
    store: ModelStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = install(monkeypatch, 11)  # the stand-in parser refuses INT32 DequantizeLinear, as TensorRT's does
    engine, _ = build(store, tmp_path, "int8", calibration=crops(2))
    assert record.parsed == [f"{ENHANCER}.qdq.onnx"] and read_manifest(engine).calibration == crops(2).digest()


def test_int8_on_tensorrt_10_calibrates_within_the_profile_and_keys_its_cache(
    store: ModelStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = install(monkeypatch, 10)
    engine, _ = build(store, tmp_path, "int8", calibration=crops(6), calibration_batch=4)
    assert record.builder_flags == ["FP16", "INT8"] and record.batches_fed == 2  # 6 items: 4 + 4 (topped up)
    assert record.calibration_profile["input"][0] == 4
    cache = ModelFiles(tmp_path / f"{ENHANCER}.onnx").calibration_cache(
        "Fake GPU", "int8", crops(6).digest(), "10.13.3.9"
    )
    assert cache.name == f"{ENHANCER}.fake-gpu.int8.calib-{crops(6).digest()[:16]}.trt10.13.3.9.cache"
    assert cache.read_bytes() == b"TRT-fake-EntropyCalibration2" and record.cache_reads == [None]

    build(store, tmp_path, "int8", calibration=crops(6), calibration_batch=4)  # same data: the cache is used
    assert record.cache_reads[-1] == b"TRT-fake-EntropyCalibration2" and record.batches_fed == 2
    build(store, tmp_path, "int8", calibration=crops(6, seed=1), calibration_batch=4)  # other data: calibrates
    assert record.cache_reads[-1] is None and record.batches_fed == 4

    # A graph whose batch is fixed at 1 gets a 1..1 profile whatever --max-batch says: one item per batch.
    fixed = onnx.load(str(store.ensure(ENHANCER)))
    fixed.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    source = tmp_path / "single" / "fixed.onnx"
    source.parent.mkdir()
    onnx.save(fixed, str(source))
    record = install(monkeypatch, 10)
    options = BuildOptions(precision="int8", max_batch=32, dims=DIMS, calibration=crops(3), calibration_batch=8)
    build_engine(source, source.with_suffix(".engine"), model=ENHANCER, source_sha256="a" * 64, options=options)
    assert record.calibration_batch_size == [1] and record.batches_fed == 3
    assert record.calibration_profile["input"][0] == 1


def test_an_error_inside_calibration_fails_the_build(
    store: ModelStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = install(monkeypatch, 10)
    cudart = sys.modules["cuda.bindings.runtime"]
    copies = {"n": 0}
    real_copy = cudart.cudaMemcpy  # type: ignore[attr-defined]

    def failing_copy(*args: object) -> object:
        copies["n"] += 1
        if copies["n"] == 2:
            raise RuntimeError("device lost")
        return real_copy(*args)

    monkeypatch.setattr(cudart, "cudaMemcpy", failing_copy)
    with pytest.raises(ModelError, match="INT8 calibration failed after 2 of 3 batches: RuntimeError: device lost"):
        build(store, tmp_path, "int8", calibration=crops(6), calibration_batch=2)
    assert record.swallowed == []  # caught before TensorRT could swallow it
    assert not list(tmp_path.glob("*.engine"))


def test_the_feed_keeps_what_would_be_swallowed() -> None:
    batches = CalibrationBatches(crops(4), 2)
    feed = CalibrationFeed(batches, lambda name, array: 1 // 0)
    assert feed.get_batch(["input"]) is None and feed.get_batch(["input"]) is None
    with pytest.raises(ModelError, match="ZeroDivisionError"):
        feed.raise_error()
    feed.raise_error()  # raised once


def test_a_damaged_timing_cache_is_replaced(
    store: ModelStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    install(monkeypatch, 11)
    timing = tmp_path / "timing.cache"
    timing.write_bytes(b"\x00 not a timing cache")
    with caplog.at_level(logging.WARNING):
        build(store, tmp_path, timing_cache=timing)
    assert "timing cache" in caplog.text and "Deserialization" in caplog.text
    assert timing.read_bytes() == b"TC1 after a build" and stat.S_IMODE(timing.stat().st_mode) == 0o644


def test_cubic_resize_falls_back_to_linear_where_the_parser_refuses_it(
    store: ModelStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = install(monkeypatch, 10, refuse_cubic=True)
    engine, _ = build(store, tmp_path)
    assert record.parsed == [f"{ENHANCER}.onnx", f"{ENHANCER}.linear-resize.onnx"]
    assert read_manifest(engine).rewrites == ("Resize cubic->linear (1 nodes)",)

    install(monkeypatch, 10, refuse_cubic=False)
    engine, _ = build(store, tmp_path / "plain")
    assert read_manifest(engine).rewrites == ()


def test_the_runner_uses_a_non_blocking_stream_and_its_native_handle(
    store: ModelStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = install(monkeypatch, 11)
    engine, _ = build(store, tmp_path)
    x = np.random.default_rng(1).random((3, 3, 32, 24), dtype=np.float32)
    model = TensorRTModel(engine, source_sha256="a" * 64, platform=probe_platform())
    with model:
        (out,) = model.run({"input": x})
        (again,) = model.run({"input": x[:1]})
    np.testing.assert_array_equal(out, x * 2)
    np.testing.assert_array_equal(again, x[:1] * 2)
    assert record.stream_flags == [1]  # cudaStreamNonBlocking
    assert record.execute_handles == [0x5EED1, 0x5EED1]
    assert sys.modules["cuda.bindings.runtime"].memory == {}  # type: ignore[attr-defined]  # all freed on close


def test_native_handle_uses_the_bindings_helper() -> None:
    runtime = pytest.importorskip("cuda.bindings.runtime")
    assert native_handle(runtime.cudaStream_t(4242)) == 4242
    assert native_handle(7) == 7


@pytest.mark.parametrize(
    ("stack", "problem"),
    [
        (GpuStack("11.4.0.106", 13, "13.0.3", "13.0"), None),
        (GpuStack("10.13.3.9", 12, "12.9.1", "12.8"), None),
        (GpuStack("10.13.3.9", 12, "12.6.2", None), "holds the GIL"),
        (GpuStack("11.4.0.106", 13, "12.9.4", "13.0"), "CUDA majors differ (TensorRT CUDA 13, cuda-bindings CUDA 12"),
        (GpuStack("9.0.1", 12, "12.9.4", None), "neither 10 nor 11"),
        (GpuStack("11.4.0.106", 13, None, None), "without the CUDA bindings"),
    ],
)
def test_gpu_stack_combinations(stack: GpuStack, problem: str | None) -> None:
    problems = stack_problems(stack)
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p for p in problems), problems


def test_an_engine_run_waits_while_a_graph_is_captured(
    store: ModelStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from app.runtime.torch_graphs import gpu_work

    install(monkeypatch, 11)
    engine, _ = build(store, tmp_path)
    x = np.ones((1, 3, 32, 32), np.float32)
    with TensorRTModel(engine, source_sha256="a" * 64, platform=probe_platform()) as model:
        done = threading.Event()
        runner = threading.Thread(target=lambda: (model.run({"input": x}), done.set()))
        with gpu_work.exclusive():  # what a CUDA-graph capture holds
            runner.start()
            assert not done.wait(0.2)
        assert done.wait(5)
        runner.join()
