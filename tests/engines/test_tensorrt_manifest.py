"""TensorRT engines without a GPU: the manifest and every reason to refuse an engine (checked before anything
is deserialised), optimisation profiles, the calibrator's batching and cache, and `build-trt` failing with
one line where TensorRT is missing. GPU tests build and run a real engine and are skipped without one."""

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import app.cli
from app.runtime.tensorrt import TensorRTModel
from engines.errors import ModelError
from engines.model_files import ModelFiles, gpu_slug, record_path
from engines.precision.int8 import CalibrationSet
from engines.store import ModelStore, sha256_file
from engines.tensorrt.build import graph_inputs, profile_shapes
from engines.tensorrt.calibrator import CalibrationBatches, CalibrationCache
from engines.tensorrt.manifest import (
    TRT_MISSING,
    EngineManifest,
    EngineMismatch,
    Platform,
    ProfileShape,
    read_manifest,
    verify_engine,
    write_manifest,
)

HERE = Platform("NVIDIA H200", "9.0", "10.13.3.9")
SOURCE_SHA = "5" * 64
HAS_TRT = importlib.util.find_spec("tensorrt") is not None


def has_gpu() -> bool:
    if not HAS_TRT:
        return False
    from app.runtime.backend import gpu_platform

    return gpu_platform() is not None


gpu = pytest.mark.gpu


def make_engine(tmp_path: Path, **changes: object) -> Path:
    """An engine file (opaque bytes: nothing here may read them as an engine) and its manifest."""
    engine = tmp_path / "retinaface_mnet025.nvidia-h200.fp16.engine"
    tmp_path.mkdir(parents=True, exist_ok=True)
    engine.write_bytes(b"serialized engine bytes \x00\x01")
    fields: dict[str, object] = {
        "model": "retinaface_mnet025",
        "precision": "fp16",
        "source_file": "retinaface_mnet025.onnx",
        "source_sha256": SOURCE_SHA,
        "engine_sha256": sha256_file(engine),
        "tensorrt_version": HERE.tensorrt_version,
        "gpu_name": HERE.gpu_name,
        "compute_capability": HERE.compute_capability,
        "build_mode": "builder-flags",
        "inputs": ("input",),
        "outputs": ("loc", "conf", "landmarks"),
        "profiles": {"input": ProfileShape((1, 3, 32, 32), (8, 3, 640, 640), (32, 3, 640, 640))},
    }
    fields.update(changes)
    write_manifest(engine, EngineManifest(**fields))  # type: ignore[arg-type]
    return engine


def test_manifest_round_trips(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, calibration="c" * 64)
    manifest = read_manifest(engine)
    assert manifest == EngineManifest.from_json(manifest.to_json())
    assert manifest.profiles["input"].max == (32, 3, 640, 640) and manifest.max_batch == 32
    assert record_path(engine).name == "retinaface_mnet025.nvidia-h200.fp16.json"
    assert verify_engine(engine, HERE, SOURCE_SHA) == manifest


@pytest.mark.parametrize(
    ("platform", "sha", "reason"),
    [
        (Platform("NVIDIA GeForce RTX 3060", "9.0", HERE.tensorrt_version), SOURCE_SHA, "built for GPU 'NVIDIA H200'"),
        (Platform(HERE.gpu_name, "8.6", HERE.tensorrt_version), SOURCE_SHA, "compute capability 9.0, this GPU has 8.6"),
        (
            Platform(HERE.gpu_name, "9.0", "10.8.0.43"),
            SOURCE_SHA,
            "built with TensorRT 10.13.3.9, this is TensorRT 10.8",
        ),
        (HERE, "6" * 64, "the model now has sha256 666666666666"),
    ],
)
def test_each_mismatch_is_refused_with_its_reason(tmp_path: Path, platform: Platform, sha: str, reason: str) -> None:
    engine = make_engine(tmp_path)
    with pytest.raises(EngineMismatch, match="refusing engine") as caught:
        verify_engine(engine, platform, sha)
    assert reason in str(caught.value) and "\n" not in str(caught.value)


def test_all_reasons_are_named_at_once(tmp_path: Path) -> None:
    engine = make_engine(tmp_path)
    with pytest.raises(EngineMismatch) as caught:
        verify_engine(engine, Platform("Tesla T4", "7.5", "8.6.1"), "0" * 64)
    assert str(caught.value).count(";") >= 4


def test_missing_corrupt_or_replaced_files_are_refused(tmp_path: Path) -> None:
    engine = make_engine(tmp_path)
    engine.write_bytes(b"another engine")
    with pytest.raises(EngineMismatch, match="does not match the sha256 in its manifest"):
        verify_engine(engine, HERE, SOURCE_SHA)

    record_path(engine).write_text("{ not json")
    with pytest.raises(EngineMismatch, match="manifest .* is corrupt"):
        verify_engine(engine, HERE, SOURCE_SHA)
    record_path(engine).write_text(json.dumps({"format": 1, "model": "x"}))
    with pytest.raises(EngineMismatch, match="is corrupt"):
        verify_engine(engine, HERE, SOURCE_SHA)

    record_path(engine).unlink()
    with pytest.raises(EngineMismatch, match="has no manifest"):
        verify_engine(engine, HERE, SOURCE_SHA)
    with pytest.raises(EngineMismatch, match="no TensorRT engine at"):
        verify_engine(tmp_path / "absent.engine", HERE, SOURCE_SHA)


def test_the_runner_refuses_before_deserialising(tmp_path: Path) -> None:
    """Construction checks the manifest and never touches TensorRT; deserialising waits for activation."""
    engine = make_engine(tmp_path)
    with pytest.raises(EngineMismatch, match="this GPU is 'NVIDIA A100"):
        TensorRTModel(engine, source_sha256=SOURCE_SHA, platform=Platform("NVIDIA A100-SXM4-80GB", "9.0", "10.13.3.9"))
    engine.write_bytes(b"bytes that would crash a deserialiser")
    with pytest.raises(EngineMismatch, match="damaged or replaced"):
        TensorRTModel(engine, source_sha256=SOURCE_SHA, platform=HERE)

    ok = make_engine(tmp_path / "ok")
    model = TensorRTModel(ok, source_sha256=SOURCE_SHA, platform=HERE)  # matches: accepted, nothing loaded yet
    assert model.input_names == ["input"] and model.output_names == ["loc", "conf", "landmarks"]
    assert model.max_batch == 32 and not model.fixed_batch and model.input_shape == ["batch", 3, None, None]
    if not HAS_TRT:
        with pytest.raises(ModelError, match="TensorRT is not installed"):
            model.activate()


def test_engine_names_carry_gpu_and_precision(tmp_path: Path) -> None:
    assert gpu_slug("NVIDIA GeForce RTX 3060 Ti") == "nvidia-geforce-rtx-3060-ti"
    path = ModelFiles(tmp_path / "w600k_r50.onnx").engine("NVIDIA H200", "int8")
    assert path == tmp_path / "w600k_r50.nvidia-h200.int8.engine"


# -- optimisation profiles -----------------------------------------------------------------------------


def test_profiles_span_batch_one_to_max_and_the_given_sizes(store: ModelStore) -> None:
    detector = graph_inputs(__import__("onnx").load(str(store.ensure("retinaface_mnet025"))))
    assert detector == {"input": ["batch_size", 3, "height", "width"]}
    dims = {"height": (32, 640, 640), "width": (32, 480, 640)}
    profile = profile_shapes(detector, max_batch=16, dims=dims)["input"]
    assert profile == ProfileShape((1, 3, 32, 32), (8, 3, 640, 480), (16, 3, 640, 640))
    assert profile.accepts((4, 3, 480, 640)) and not profile.accepts((17, 3, 480, 640))

    swapper = graph_inputs(__import__("onnx").load(str(store.ensure("reference_swapper_narrow"))))
    fixed = profile_shapes(swapper, max_batch=32)  # batch fixed at 1 in the file: 1..1
    assert fixed["target"] == ProfileShape((1, 3, 128, 128), (1, 3, 128, 128), (1, 3, 128, 128))
    dynamic = profile_shapes({"target": ["batch", 3, 128, 128], "source": ["batch", 512]}, max_batch=4)
    assert dynamic["source"] == ProfileShape((1, 512), (4, 512), (4, 512))

    with pytest.raises(ValueError, match="axis 2 .'height'. is free"):
        profile_shapes(detector, max_batch=8)
    with pytest.raises(ValueError, match="fixed batch of 2"):
        profile_shapes({"x": [2, 3]}, max_batch=8)
    with pytest.raises(ValueError, match="min <= opt <= max"):
        ProfileShape((1, 64), (1, 32), (1, 64))


# -- calibrator ----------------------------------------------------------------------------------------


def numbered_set(count: int, per_sample: int = 1) -> CalibrationSet:
    samples = []
    for i in range(count):
        rows = np.arange(i * per_sample, (i + 1) * per_sample, dtype=np.float32)
        samples.append({"image": np.repeat(rows[:, None, None], 4, axis=1), "latent": rows[:, None] * 10})
    return CalibrationSet("m", tuple(samples))


def drain(batches: CalibrationBatches) -> list[dict[str, np.ndarray]]:
    out = []
    while (batch := batches.next_batch()) is not None:
        out.append(batch)
    return out


def test_calibrator_feeds_every_item_once_then_ends() -> None:
    batches = CalibrationBatches(numbered_set(10), 4)
    fed = drain(batches)
    assert [len(b["image"]) for b in fed] == [4, 4, 2]  # the short last batch is fed as it is
    assert np.concatenate([b["image"][:, 0, 0] for b in fed]).tolist() == list(range(10))
    assert all(np.array_equal(b["latent"][:, 0], b["image"][:, 0, 0] * 10) for b in fed)  # inputs stay paired
    assert batches.next_batch() is None and batches.next_batch() is None  # ended, and stays ended
    assert batches.batches_given == batches.batch_count == 3
    batches.reset()
    assert len(drain(batches)) == 3


def test_a_short_last_batch_is_filled_for_fixed_calibration_shapes() -> None:
    batches = CalibrationBatches(numbered_set(5, per_sample=2), 4, ["image"], fill_last=True)  # 10 items
    fed = drain(batches)
    assert [b["image"][:, 0, 0].tolist() for b in fed] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]
    assert batches.filled == 2 and set(fed[0]) == {"image"}
    assert batches.item_shape("image") == (4, 1)


def test_calibrator_rejects_unknown_inputs_and_bad_sizes() -> None:
    with pytest.raises(ValueError, match="no input 'other'"):
        CalibrationBatches(numbered_set(2), 2, ["other"])
    with pytest.raises(ValueError, match="at least 1"):
        CalibrationBatches(numbered_set(2), 0)


def test_calibration_cache_reads_and_writes(tmp_path: Path) -> None:
    cache = CalibrationCache(tmp_path / "sub" / "model.calibration.cache")
    assert cache.read() is None
    cache.write(memoryview(b"TRT-1001-EntropyCalibration2\ninput: 3c010a14\n"))
    assert cache.read() == b"TRT-1001-EntropyCalibration2\ninput: 3c010a14\n"
    assert CalibrationCache(None).read() is None
    CalibrationCache(None).write(b"ignored")


# -- the CLI -------------------------------------------------------------------------------------------


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[[list[str]], int]:
    monkeypatch.setenv("SWAPCAST_MODEL_DIR", str(tmp_path / "models"))
    return app.cli.main


@pytest.mark.skipif(HAS_TRT, reason="TensorRT is installed here")
def test_build_trt_without_tensorrt_is_one_clear_line(
    cli: Callable[[list[str]], int], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert cli(["engines", "build-trt", "retinaface_mnet025", "--precision", "fp16"]) == 2
    err = capsys.readouterr().err
    assert err == f"swapcast: error: {TRT_MISSING}\n"
    assert TRT_MISSING == "TensorRT is not installed: pip install swapcast[gpu] on a machine with an NVIDIA GPU"
    assert not (tmp_path / "models").exists()  # refused before any work


# -- on a GPU ------------------------------------------------------------------------------------------


@gpu
@pytest.mark.skipif(not has_gpu(), reason="needs TensorRT and an NVIDIA GPU")
def test_fp16_engine_builds_runs_and_matches_onnxruntime(store: ModelStore, tmp_path: Path) -> None:
    from app.runtime.onnx import OnnxModel
    from engines.tensorrt.build import BuildOptions, build_engine

    source = store.ensure("realesr_animevideov3_x2")
    sha, _ = store.expected("realesr_animevideov3_x2")
    assert sha is not None
    engine = tmp_path / "realesr_animevideov3_x2.gpu.fp16.engine"
    options = BuildOptions(precision="fp16", max_batch=4, dims={"height": (32, 128, 256), "width": (32, 128, 256)})
    manifest = build_engine(source, engine, model="realesr_animevideov3_x2", source_sha256=sha, options=options)
    assert manifest.profiles["input"].max == (4, 3, 256, 256)
    x = np.random.default_rng(0).random((3, 3, 128, 96), dtype=np.float32)
    with TensorRTModel(engine, source_sha256=sha) as model:
        (got,) = model.run({"input": x})
    (want,) = OnnxModel(source).run({"input": x})
    assert got.shape == want.shape and float(np.abs(got - want).max()) < 0.02
