"""`swapcast triton export`: a Triton model repository from the local models, configs valid against Triton's
own model-config protobuf, shapes and names read from the models, batching from swapcast's settings."""

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from app.cli import main
from engines.errors import ModelError
from engines.store import ModelStore
from engines.triton.config import BatchingSpec, ServingSpec, parse_config
from engines.triton.repository import ModelSource, export_repository

REPO_CONFIGS = Path(__file__).resolve().parents[2] / "deploy" / "triton"


def test_export_writes_a_repository_triton_can_parse(store: ModelStore, tmp_path: Path, capsys) -> None:
    store.ensure("retinaface_mnet025")
    store.ensure("reference_recognizer")
    out = tmp_path / "repo"
    code = main(["triton", "export", "--out", str(out), "--models", "retinaface_mnet025", "reference_recognizer"])
    assert code == 0
    assert "retinaface_mnet025" in capsys.readouterr().out

    detector = parse_config((out / "retinaface_mnet025" / "config.pbtxt").read_text())
    assert detector.platform == "onnxruntime_onnx"
    assert detector.max_batch_size == 8  # SWAPCAST_BATCH_DETECT_MAX_BATCH default
    assert [i.name for i in detector.input] == ["input"]
    assert list(detector.input[0].dims) == [3, -1, -1]
    assert [o.name for o in detector.output] == ["loc", "conf", "landmarks"]
    batching = detector.dynamic_batching
    assert list(batching.preferred_batch_size) == [2, 4, 8]
    assert batching.max_queue_delay_microseconds == 4000
    assert batching.default_queue_policy.default_timeout_microseconds == 250_000
    assert batching.default_queue_policy.max_queue_size == 64
    assert (out / "retinaface_mnet025" / "1" / "model.onnx").read_bytes() == store.path(
        "retinaface_mnet025"
    ).read_bytes()

    recognizer = parse_config((out / "reference_recognizer" / "config.pbtxt").read_text())
    model = onnx.load(str(store.path("reference_recognizer")), load_external_data=False)
    assert recognizer.input[0].name == model.graph.input[0].name
    assert list(recognizer.input[0].dims) == [3, 112, 112]
    assert recognizer.output[0].name == model.graph.output[0].name
    assert list(recognizer.output[0].dims) == [512]


def test_batching_follows_swapcast_settings(store: ModelStore, tmp_path: Path, monkeypatch) -> None:
    store.ensure("retinaface_mnet025")
    monkeypatch.setenv("SWAPCAST_BATCH_DETECT_MAX_BATCH", "6")
    monkeypatch.setenv("SWAPCAST_BATCH_DEADLINE_MS", "120")
    monkeypatch.setenv("SWAPCAST_BATCH_MAX_DELAY_MS", "2.5")
    out = tmp_path / "repo"
    assert main(["triton", "export", "--out", str(out), "--models", "retinaface_mnet025", "--platform", "python"]) == 0
    config = parse_config((out / "retinaface_mnet025" / "config.pbtxt").read_text())
    assert config.backend == "python"
    assert config.max_batch_size == 6
    assert list(config.dynamic_batching.preferred_batch_size) == [2, 4, 6]
    assert config.dynamic_batching.max_queue_delay_microseconds == 2500
    assert config.dynamic_batching.default_queue_policy.default_timeout_microseconds == 120_000
    assert (out / "retinaface_mnet025" / "1" / "model.py").is_file()


def _fixed_batch_model(path: Path) -> Path:
    """A real (tiny) network with its batch fixed at 1: a 1x1 convolution."""
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 1, 1)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"])],
        "fixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_fixed_batch_models_are_rewritten_to_batch(tmp_path: Path) -> None:
    src = _fixed_batch_model(tmp_path / "fixed.onnx")
    spec = BatchingSpec(max_batch=4, max_queue_delay_ms=1.0, deadline_ms=100.0, max_queue=8)
    [exported] = export_repository(
        [ModelSource("fixed", src, spec)], tmp_path / "repo", ServingSpec("onnxruntime", "cpu", 2)
    )
    config = parse_config((exported.directory / "config.pbtxt").read_text())
    assert config.max_batch_size == 4
    assert list(config.input[0].dims) == [3, 16, 16]
    assert config.instance_group[0].count == 2
    served = onnx.load(str(exported.directory / "1" / "model.onnx"))
    assert served.graph.input[0].type.tensor_type.shape.dim[0].dim_param


def test_unbatched_model_keeps_full_shapes(tmp_path: Path) -> None:
    src = _fixed_batch_model(tmp_path / "fixed.onnx")
    spec = BatchingSpec(max_batch=1, max_queue_delay_ms=1.0, deadline_ms=None, max_queue=8)
    [exported] = export_repository([ModelSource("one", src, spec)], tmp_path / "repo", ServingSpec("python", "cpu", 1))
    config = parse_config((exported.directory / "config.pbtxt").read_text())
    assert config.max_batch_size == 0
    assert list(config.input[0].dims) == [1, 3, 16, 16]
    assert not config.HasField("dynamic_batching")


def test_a_failed_export_leaves_nothing(tmp_path: Path) -> None:
    good = _fixed_batch_model(tmp_path / "good.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not an onnx model")
    spec = BatchingSpec(max_batch=2, max_queue_delay_ms=1.0, deadline_ms=100.0, max_queue=8)
    out = tmp_path / "repo"
    with pytest.raises(ModelError, match="cannot read ONNX model"):
        export_repository(
            [ModelSource("good", good, spec), ModelSource("bad", bad, spec)], out, ServingSpec("python", "cpu", 1)
        )
    assert list(out.iterdir()) == []


def test_tensorrt_without_a_plan_says_how_to_build_it(tmp_path: Path) -> None:
    src = _fixed_batch_model(tmp_path / "fixed.onnx")
    spec = BatchingSpec(max_batch=2, max_queue_delay_ms=1.0, deadline_ms=100.0, max_queue=8)
    with pytest.raises(ModelError, match="swapcast engines build-trt fixed"):
        export_repository([ModelSource("fixed", src, spec)], tmp_path / "repo", ServingSpec("tensorrt", "gpu", 1))


def test_cli_errors_are_one_line(tmp_path: Path, capsys) -> None:
    foreign = tmp_path / "repo" / "retinaface_mnet025"
    foreign.mkdir(parents=True)
    (foreign / "notes.txt").write_text("someone else's")
    assert main(["triton", "export", "--out", str(tmp_path / "repo"), "--models", "no_such_model"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("swapcast: error: ") and err.count("\n") == 1
    assert main(["triton", "export", "--out", str(tmp_path / "repo"), "--models", "retinaface_mnet025"]) == 2
    assert "not a Triton model directory" in capsys.readouterr().err
    assert (foreign / "notes.txt").read_text() == "someone else's"


def test_committed_configs_are_what_the_command_writes(store: ModelStore, tmp_path: Path, monkeypatch) -> None:
    for name in ("SWAPCAST_BATCH_DETECT_MAX_BATCH", "SWAPCAST_BATCH_ENHANCE_MAX_BATCH", "SWAPCAST_BATCH_DEADLINE_MS"):
        monkeypatch.delenv(name, raising=False)
    names = sorted(path.parent.name for path in REPO_CONFIGS.glob("*/config.pbtxt"))
    assert names, "deploy/triton holds no model configs"
    for name in names:
        store.ensure(name)
    out = tmp_path / "repo"
    assert main(["triton", "export", "--out", str(out), "--models", *names]) == 0
    for name in names:
        assert (out / name / "config.pbtxt").read_text() == (REPO_CONFIGS / name / "config.pbtxt").read_text()
