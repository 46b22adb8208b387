"""Backends: PyTorch (onnx2torch) matches ONNX Runtime, the variant and backend choice follows the settings
and what is on disk, the factory loads variants, and `swapcast engines` / `models list --variants` work."""

import importlib.util
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import app.cli
from app.calibration import calibration_set, letterbox
from app.pipeline.factory import build_pipeline
from app.pipeline.swap import InswapperEngine, last_initializer
from app.pipeline.types import Image
from app.runtime.backend import _say_fp16_is_slow_on_cpu, choose, load_backend
from app.runtime.onnx import OnnxModel
from app.runtime.torch_backend import TorchModel
from app.settings import PipelineSettings
from app.variants import make_fp16, source_for
from engines.errors import ModelError
from engines.model_files import ModelFiles, record_path
from engines.precision.variants import read_record
from engines.store import ModelStore, sha256_file
from engines.tensorrt.manifest import EngineManifest, Platform, ProfileShape, write_manifest

PARITY = 1e-4


@pytest.fixture(scope="module")
def own_store(tmp_path_factory: pytest.TempPathFactory) -> ModelStore:
    """A model directory of this module's own: variants written here are seen by nobody else."""
    return ModelStore(tmp_path_factory.mktemp("backend-models"))


@pytest.fixture(scope="module")
def crops(store: ModelStore) -> np.ndarray:
    data = calibration_set(store, "realesr_animevideov3_x2", store.ensure("realesr_animevideov3_x2"), 4)
    return np.concatenate([s["input"] for s in data.samples[:3]])


def unit_latents(count: int) -> np.ndarray:
    latents = np.random.default_rng(3).standard_normal((count, 512)).astype(np.float32)
    return latents / np.linalg.norm(latents, axis=1, keepdims=True)


# -- PyTorch backend parity -----------------------------------------------------------------------------


@pytest.mark.slow
def test_torch_matches_onnxruntime_on_the_narrow_swapper(store: ModelStore, crops: np.ndarray) -> None:
    feeds = {"target": crops[:2], "source": unit_latents(2)}
    fixed = store.ensure("reference_swapper_narrow")  # batch fixed at 1: run item by item
    dynamic = source_for(store, "reference_swapper_narrow").runnable
    for path, channels_last in ((fixed, False), (dynamic, False), (dynamic, True)):
        torch_model = TorchModel(path, device="cpu", channels_last=channels_last, threads=2)
        assert torch_model.fixed_batch == (path == fixed)
        (got,) = torch_model.run(feeds)
        (want,) = OnnxModel(path, threads=2).run(feeds)
        assert got.shape == want.shape == (2, 3, 128, 128)
        assert float(np.abs(got - want).max()) <= PARITY


@pytest.mark.slow
def test_torch_matches_onnxruntime_on_the_detector(store: ModelStore, t1: Image, astronaut: Image) -> None:
    path = store.ensure("retinaface_mnet025")
    blob = np.concatenate([letterbox(t1, 640), letterbox(astronaut, 640)])[:, :, :480, :]
    torch_model = TorchModel(path, device="cpu", threads=2)
    got = torch_model.run({"input": blob})
    want = OnnxModel(path, threads=2).run({"input": blob})
    assert torch_model.output_names == ["loc", "conf", "landmarks"]
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and float(np.abs(a - b).max()) <= PARITY


@pytest.mark.slow
def test_torch_matches_onnxruntime_on_realesrgan_x2(store: ModelStore, crops: np.ndarray) -> None:
    path = store.ensure("realesr_animevideov3_x2")
    (got,) = TorchModel(path, device="cpu", threads=2).run({"input": crops[:2, :, :96, :80]})
    (want,) = OnnxModel(path, threads=2).run({"input": crops[:2, :, :96, :80]})
    assert got.shape == want.shape == (2, 3, 192, 160)
    assert float(np.abs(got - want).max()) <= PARITY


def test_torch_fp16_on_a_cpu_runs_fp32(store: ModelStore) -> None:
    model = TorchModel(store.ensure("realesr_animevideov3_x2"), device="cpu", precision="fp16")
    assert model.precision == "fp32" and model.providers == ["torch:cpu:fp32"]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["onnxruntime", "torch"])
def test_a_fixed_batch_graph_runs_a_batch_in_slices_says_so_once_and_closes(
    store: ModelStore, crops: np.ndarray, backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = store.ensure("reference_swapper_narrow")  # batch fixed at 1
    model = OnnxModel(path, threads=2) if backend == "onnxruntime" else TorchModel(path, device="cpu", threads=2)
    feeds = {"target": crops[:3], "source": unit_latents(3)}
    with caplog.at_level(logging.INFO, logger="app.runtime.model"):
        (batched,) = model.run(feeds)
        model.run(feeds)
    assert [r.getMessage() for r in caplog.records].count(
        f"{path.name} has a fixed batch of 1: running 3 items one by one"
    ) == 1
    alone = [model.run({k: v[i : i + 1] for k, v in feeds.items()})[0] for i in range(3)]
    assert np.array_equal(batched, np.concatenate(alone))
    model.close()
    model.close()  # idempotent
    with pytest.raises(ModelError, match="is closed"):
        model.run(feeds)


# -- choosing a backend and a variant ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def detector_fp16(own_store: ModelStore) -> Iterator[Path]:
    path, _ = make_fp16(own_store, "retinaface_mnet025")
    yield path


@pytest.mark.slow
def test_fp16_variant_is_loaded_when_the_precision_asks(own_store: ModelStore, detector_fp16: Path) -> None:
    source = own_store.ensure("retinaface_mnet025")
    sha, _ = own_store.expected("retinaface_mnet025")
    record = read_record(detector_fp16)
    assert record.source_sha256 == sha and record.sha256 == sha256_file(detector_fp16)
    assert record.quality["outputs"][0]["name"] == "loc"
    for backend in ("auto", "onnxruntime"):
        model = load_backend(source, backend, 2, "fp16", source_sha256=sha)  # type: ignore[arg-type]
        assert isinstance(model, OnnxModel) and model.path == detector_fp16
    assert load_backend(source, "auto", 2, "fp32", source_sha256=sha).path == source


def test_fp16_on_a_cpu_is_said_to_be_slower_once_per_model(
    own_store: ModelStore, detector_fp16: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = own_store.ensure("retinaface_mnet025")
    sha, _ = own_store.expected("retinaface_mnet025")
    _say_fp16_is_slow_on_cpu.cache_clear()  # an earlier test may have loaded the variant already
    with caplog.at_level(logging.WARNING, logger="app.runtime.backend"):
        loaded = [load_backend(source, "onnxruntime", 2, "fp16", source_sha256=sha) for _ in range(2)]
        load_backend(source, "onnxruntime", 2, "fp32", source_sha256=sha)
    if any(isinstance(m, OnnxModel) and m.providers[0] != "CPUExecutionProvider" for m in loaded):
        pytest.skip("ONNX Runtime runs on a GPU here")
    said = [r.getMessage() for r in caplog.records if "runs slower than fp32 on a CPU" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"{detector_fp16.name}: SWAPCAST_PRECISION=fp16")


def test_missing_or_stale_variants(
    own_store: ModelStore, detector_fp16: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = own_store.ensure("retinaface_mnet025")
    sha, _ = own_store.expected("retinaface_mnet025")
    with pytest.raises(ModelError, match="run `swapcast engines int8 MODEL`"):
        choose(source, "onnxruntime", "int8", source_sha256=sha, cuda=False)
    with caplog.at_level(logging.WARNING):
        fallback = choose(source, "auto", "int8", source_sha256=sha, cuda=False)
    assert fallback.path == source and fallback.precision == "fp32" and "no int8 variant" in caplog.text
    with pytest.raises(ModelError, match="made from another version"):
        choose(source, "onnxruntime", "fp16", source_sha256="0" * 64, cuda=False)
    with pytest.raises(ModelError, match="no INT8 path"):
        choose(source, "torch", "int8", cuda=False)
    torch_choice = choose(source, "torch", "fp16", cuda=False)
    assert torch_choice.backend == "torch" and torch_choice.precision == "fp32"


def test_auto_prefers_an_engine_built_for_this_gpu(tmp_path: Path) -> None:
    source = tmp_path / "m.onnx"
    source.write_bytes(b"onnx")
    here = Platform("NVIDIA H200", "9.0", "10.13.3.9")
    engine = ModelFiles(source).engine(here.gpu_name, "fp16")
    engine.write_bytes(b"engine")
    manifest = EngineManifest(
        model="m",
        precision="fp16",
        source_file="m.onnx",
        source_sha256="a" * 64,
        engine_sha256=sha256_file(engine),
        tensorrt_version=here.tensorrt_version,
        gpu_name=here.gpu_name,
        compute_capability=here.compute_capability,
        build_mode="builder-flags",
        inputs=("x",),
        outputs=("y",),
        profiles={"x": ProfileShape((1, 4), (8, 4), (32, 4))},
    )
    write_manifest(engine, manifest)
    picked = choose(source, "auto", "fp16", source_sha256="a" * 64, platform=here, cuda=True)
    assert picked.backend == "tensorrt" and picked.path == engine
    # Another GPU: auto falls through (to PyTorch on CUDA here), an explicit tensorrt says why.
    other = Platform("NVIDIA GeForce RTX 3060", "8.6", "10.13.3.9")
    assert choose(source, "auto", "fp16", source_sha256="a" * 64, platform=other, cuda=True).backend == "torch"
    with pytest.raises(ModelError, match="no engine m.nvidia-geforce-rtx-3060.fp16.engine"):
        choose(source, "tensorrt", "fp16", source_sha256="a" * 64, platform=other)
    with pytest.raises(ModelError, match="this is TensorRT 10.8"):
        choose(source, "tensorrt", "fp16", source_sha256="a" * 64, platform=Platform(here.gpu_name, "9.0", "10.8"))


def test_settings_read_backend_and_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWAPCAST_BACKEND", "torch")
    monkeypatch.setenv("SWAPCAST_PRECISION", "int8")
    settings = PipelineSettings()
    assert settings.backend == "torch" and settings.precision == "int8"
    monkeypatch.setenv("SWAPCAST_BACKEND", "cuda")
    with pytest.raises(ValueError, match="backend"):
        PipelineSettings()


@pytest.mark.slow
def test_factory_loads_variants_and_keeps_the_emap(own_store: ModelStore, detector_fp16: Path, t1: Image) -> None:
    swapper_fp16, _ = make_fp16(own_store, "reference_swapper_narrow")
    settings = PipelineSettings(
        engine="inswapper",
        swapper_model="reference_swapper_narrow",
        recognizer_model="reference_recognizer",
        precision="fp16",
        backend="auto",
        threads=2,
    )
    pipeline = build_pipeline(settings, own_store)
    assert pipeline.detector.model.path == detector_fp16
    engine = pipeline.engine
    assert isinstance(engine, InswapperEngine) and engine.swapper.path == swapper_fp16
    assert not engine.swapper.fixed_batch  # made from the batch-dynamic rewrite
    np.testing.assert_array_equal(engine.emap, last_initializer(own_store.ensure("reference_swapper_narrow")))
    source = pipeline.prepare_source(t1)
    (result,) = pipeline.process([t1], source)
    assert len(result.faces) == 6 and not np.array_equal(result.image, t1)


# -- the CLI -------------------------------------------------------------------------------------------------


@pytest.fixture
def cli(own_store: ModelStore, monkeypatch: pytest.MonkeyPatch) -> Callable[[list[str]], int]:
    monkeypatch.setenv("SWAPCAST_MODEL_DIR", str(own_store.root))
    return app.cli.main


@pytest.mark.slow
def test_engines_int8_and_models_list_variants(
    cli: Callable[[list[str]], int],
    own_store: ModelStore,
    detector_fp16: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert cli(["engines", "int8", "retinaface_mnet025", "--samples", "4"]) == 0
    int8 = ModelFiles(own_store.ensure("retinaface_mnet025")).variant("int8")
    assert str(int8) in capsys.readouterr().out
    options = json.loads(record_path(int8).read_text())["options"]
    assert options["method"] == "minmax" and options["per_channel"] and options["calibration_samples"] == 4

    def listed() -> dict[str, dict[str, object]]:
        assert cli(["models", "list", "--variants", "--json"]) == 0
        rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
        return {v["precision"]: v for v in rows["retinaface_mnet025"]["variants"]}

    variants = listed()
    assert set(variants) == {"fp32", "fp16", "int8"}
    assert variants["fp32"]["active"] and variants["int8"]["status"] == "ok"
    monkeypatch.setenv("SWAPCAST_PRECISION", "int8")
    variants = listed()
    assert variants["int8"]["active"] and not variants["fp32"]["active"]
    assert cli(["models", "list", "--variants"]) == 0
    assert "retinaface_mnet025.int8.onnx: ok  <- active" in capsys.readouterr().out


def test_engines_commands_fail_in_one_line(cli: Callable[[list[str]], int], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["engines", "fp16", "no_such_model"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "unknown model 'no_such_model'" in err[0]
    with pytest.raises(SystemExit) as exited:  # refused while the command line is parsed
        cli(["engines", "int8", "retinaface_mnet025", "--samples", "0"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "swapcast: error: argument --samples: must be at least 1, got 0 (see `swapcast engines int8 --help`)"
    )


# -- on a GPU ------------------------------------------------------------------------------------------------


def cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs an NVIDIA GPU")
def test_torch_cuda_graphs_and_half_precision_match_onnxruntime(store: ModelStore, crops: np.ndarray) -> None:
    path = store.ensure("realesr_animevideov3_x2")
    (want,) = OnnxModel(path).run({"input": crops})
    graphs = TorchModel(path, device="cuda", precision="fp16")
    assert graphs.cuda_graphs and graphs.channels_last
    first = graphs.run({"input": crops})[0]
    again = graphs.run({"input": crops})[0]  # replayed from the captured graph
    assert list(graphs.graph_outcomes.values()) == ["captured"]  # a graph was captured, not only allowed
    np.testing.assert_array_equal(first, again)
    assert float(np.abs(first - want).max()) < 0.02
    (fp32,) = TorchModel(path, device="cuda", cuda_graphs=False).run({"input": crops})
    assert float(np.abs(fp32 - want).max()) < 1e-3
