"""The Triton backend against a real `tritonserver` serving the repository `swapcast triton export` writes
(python backend, ONNX Runtime on the same ONNX files): outputs match the in-process models within 1e-5,
concurrent callers are batched by Triton's dynamic batcher, a pipeline through Triton gives the frames the
in-process pipeline gives, tensors through system shared memory match too, and a server that is down or lacks
the model is a clear ModelError."""

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from app.cli import main
from app.errors import ModelError
from app.pipeline.factory import build_pipeline
from app.pipeline.types import Image
from app.runtime.onnx import OnnxModel
from app.runtime.triton import TritonModel
from app.settings import PipelineSettings
from engines.store import ModelStore
from tests.deploy.triton_server import TritonServer, triton_venv

MODELS = ("retinaface_mnet025", "reference_recognizer", "reference_swapper_narrow")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def triton(store: ModelStore, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    triton_venv()
    for name in MODELS:
        store.ensure(name)
    repository = tmp_path_factory.mktemp("triton") / "repository"
    with pytest.MonkeyPatch.context() as patch:
        # Live serving refuses items queued past the 250 ms frame deadline; on 2 busy CPU cores shared with
        # the test's own callers that would make these tests depend on load, so they allow 5 s.
        patch.setenv("SWAPCAST_BATCH_DEADLINE_MS", "5000")
        code = main(["triton", "export", "--out", str(repository), "--platform", "python", "--models", *MODELS])
    assert code == 0
    server = TritonServer(repository, repository.parent).wait_ready()
    yield server
    server.stop()


def _crops(images: list[Image], size: int) -> np.ndarray:
    """Real photo regions as the recognizer's NCHW float input."""
    crops = [cv2.resize(image[: image.shape[0] // 2, : image.shape[1] // 2], (size, size)) for image in images]
    return (np.stack(crops).astype(np.float32).transpose(0, 3, 1, 2) - 127.5) / 127.5


def test_outputs_match_the_in_process_models(
    triton: TritonServer, store: ModelStore, t1: Image, astronaut: Image
) -> None:
    recognizer = TritonModel(triton.url, store.path("reference_recognizer"))
    local = OnnxModel(store.path("reference_recognizer"), threads=1)
    assert recognizer.input_names == local.input_names and recognizer.output_names == local.output_names
    crops = _crops([t1, astronaut, t1[::-1].copy()], 112)
    feeds = {local.input_names[0]: crops}
    for remote_out, local_out in zip(recognizer.run(feeds), local.run(feeds), strict=True):
        assert remote_out.shape == local_out.shape
        assert np.abs(remote_out - local_out).max() <= 1e-5

    detector = TritonModel(triton.url, store.path("retinaface_mnet025"))
    frame = cv2.resize(astronaut, (320, 240)).astype(np.float32).transpose(2, 0, 1)[None] - 104.0
    local_detector = OnnxModel(store.path("retinaface_mnet025"), threads=1)
    for remote_out, local_out in zip(detector.run({"input": frame}), local_detector.run({"input": frame}), strict=True):
        assert np.abs(remote_out - local_out).max() <= 1e-5
    recognizer.close()
    detector.close()


def test_concurrent_callers_are_batched_by_triton(triton: TritonServer, store: ModelStore, t1: Image) -> None:
    model = TritonModel(triton.url, store.path("reference_recognizer"))
    crop = _crops([t1], 112)
    expected = OnnxModel(store.path("reference_recognizer"), threads=1).run({model.input_names[0]: crop})[0]
    errors: list[BaseException] = []

    def caller() -> None:
        try:
            for _ in range(6):
                (out,) = model.run({model.input_names[0]: crop})
                assert np.abs(out - expected).max() <= 1e-5
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=caller) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    client = grpcclient.InferenceServerClient(triton.url)
    stats = client.get_inference_statistics("reference_recognizer", as_json=True)["model_stats"][0]
    client.close()
    model.close()
    assert int(stats["inference_count"]) >= 48
    # Fewer model executions than items: Triton grouped concurrent calls into batches.
    assert int(stats["execution_count"]) < int(stats["inference_count"])


def test_a_pipeline_through_triton_gives_the_in_process_frames(
    triton: TritonServer, store: ModelStore, t1: Image, astronaut: Image
) -> None:
    common = {"engine": "inswapper", "swapper_model": "reference_swapper_narrow",
              "recognizer_model": "reference_recognizer", "threads": 1}  # fmt: skip
    remote = build_pipeline(PipelineSettings(**common, backend="triton", triton_url=triton.url), store)
    local = build_pipeline(PipelineSettings(**common, backend="onnxruntime"), store)
    assert isinstance(remote.engine.swapper, TritonModel)  # type: ignore[attr-defined]
    assert not isinstance(remote.detector.model, TritonModel)  # whole frames stay in the media process
    source_remote = remote.prepare_source(astronaut)
    source_local = local.prepare_source(astronaut)
    [remote_frame] = remote.process([t1], source_remote)
    [local_frame] = local.process([t1], source_local)
    assert remote_frame.faces and len(remote_frame.faces) == len(local_frame.faces)
    diff = np.abs(remote_frame.image.astype(np.int16) - local_frame.image.astype(np.int16))
    assert diff.max() <= 1, diff.max()  # float outputs within 1e-5 round to the same pixels (at most 1 off)
    assert not np.array_equal(remote_frame.image, t1)  # and the face was swapped


def test_clear_errors_when_the_server_is_down_or_the_model_missing(triton: TritonServer, store: ModelStore) -> None:
    with pytest.raises(ModelError, match="not loaded on Triton"):
        TritonModel(triton.url, Path("/models/no_such_model.onnx"))
    with pytest.raises(ModelError, match="is not reachable"):
        TritonModel("127.0.0.1:1", store.path("reference_recognizer"), timeout_s=2.0)


def test_shared_memory_outputs_match_the_in_process_models(
    triton: TritonServer, store: ModelStore, t1: Image, astronaut: Image
) -> None:
    client = grpcclient.InferenceServerClient(triton.url)
    before = set(client.get_system_shared_memory_status(as_json=True).get("regions", {}))
    local = OnnxModel(store.path("reference_recognizer"), threads=1)
    shared = TritonModel(triton.url, store.path("reference_recognizer"), shared_memory="on")
    plain = TritonModel(triton.url, store.path("reference_recognizer"), shared_memory="off")
    auto = TritonModel(triton.url, store.path("reference_recognizer"))
    assert shared.uses_shared_memory and not plain.uses_shared_memory
    assert auto.uses_shared_memory  # auto: the URL is loopback
    auto.close()
    name = local.input_names[0]
    try:
        # Batches of different sizes: the leased region grows and is reused.
        for crops in (_crops([t1], 112), _crops([t1, astronaut, t1[::-1].copy()], 112), _crops([astronaut], 112)):
            expected = local.run({name: crops})
            for remote_out, local_out in zip(shared.run({name: crops}), expected, strict=True):
                assert remote_out.shape == local_out.shape
                assert np.abs(remote_out - local_out).max() <= 1e-5
        registered = set(client.get_system_shared_memory_status(as_json=True).get("regions", {}))
        assert registered - before, "no shared-memory region was registered"
        # The swapper has two inputs (target crop and source latent), both through shared memory.
        swapper = TritonModel(triton.url, store.path("reference_swapper_narrow"), shared_memory="on")
        local_swapper = OnnxModel(store.path("reference_swapper_narrow"), threads=1)
        rng = np.random.default_rng(0)
        feeds = {
            spec.name: rng.random([2, *spec.shape[1:]], dtype=np.float32) for spec in local_swapper.session.get_inputs()
        }
        for remote_out, local_out in zip(swapper.run(feeds), local_swapper.run(feeds), strict=True):
            assert np.abs(remote_out - local_out).max() <= 1e-5
        swapper.close()
    finally:
        shared.close()
        plain.close()
        after = set(client.get_system_shared_memory_status(as_json=True).get("regions", {}))
        client.close()
    assert after == before, "closed models leave no region registered"


def test_bench_batch_over_triton_from_two_media_processes(
    triton: TritonServer, store: ModelStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    args = ["bench-batch", "--backend", "triton", "--triton-url", triton.url, "--sessions", "1,3"]
    assert main([*args, "--seconds", "0.6", "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == result
    assert result["benchmark"] == "batch-triton" and result["media_processes"] == 2
    assert [row["sessions"] for row in result["rows"]] == [1, 3]
    for row in result["rows"]:
        for mode in ("in_process", "triton"):
            cell = row[mode]
            assert cell["errors"] == 0 and cell["frames_processed"] > 0 and cell["faces_per_s"] > 0
            assert cell["latency_ms"]["p99"] >= cell["latency_ms"]["p50"] > 0
        # Triton's own statistics: the swaps were items on the server, grouped into batches of one or more.
        assert row["triton"]["triton_items"] > 0
        assert row["triton"]["triton_mean_batch"] >= 1.0
    latency = result["transport"]["latency_ms"]
    assert set(latency) == {"in_process", "triton_grpc", "triton_shared_memory"}
    assert all(stats["n"] == 60 and stats["p50"] > 0 for stats in latency.values())
