"""engines.model_files names every file made from a model exactly as the files already on disk are named,
and engines.onnx_io / onnx_batch read, check and batch-enable models the same way everywhere."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from engines.atomic import write_bytes_atomic
from engines.errors import ModelError
from engines.model_files import ModelFiles, gpu_slug, record_path
from engines.onnx_batch import rewrite_if_fixed_batch, save_model_atomic
from engines.onnx_io import check_loads, fed_inputs, file_is_fixed_batch, is_fixed_batch, load_onnx
from engines.store import ModelStore

INSWAPPER_SHA = "e4a3f08c753cb72d04e10aa0f7dbe3deebbf39567d4ead6dce08e98aa49e16af"


def test_names_are_the_ones_existing_model_folders_hold(tmp_path: Path) -> None:
    files = ModelFiles(tmp_path / "inswapper_128.onnx", INSWAPPER_SHA)
    names = {
        "dynamic": files.dynamic,
        "fp32": files.variant("fp32"),
        "fp16": files.variant("fp16"),
        "fp16 record": files.variant_record("fp16"),
        "int8": files.variant("int8"),
        "int8 record": files.variant_record("int8"),
        "engine": files.engine("NVIDIA H200", "fp16"),
        "manifest": files.engine_manifest("NVIDIA H200", "fp16"),
        "trt calibration": files.calibration_cache("NVIDIA H200", "int8", "0123456789abcdef" * 4, "10.9.0.34"),
        "calibration data": files.calibration_data,
        "timing": files.timing_cache("NVIDIA H200", "10.9.0.34"),
    }
    assert {what: path.relative_to(tmp_path).as_posix() for what, path in names.items()} == {
        "dynamic": "inswapper_128.e4a3f08c753c.dynamic.onnx",
        "fp32": "inswapper_128.onnx",
        "fp16": "inswapper_128.fp16.onnx",
        "fp16 record": "inswapper_128.fp16.json",
        "int8": "inswapper_128.int8.onnx",
        "int8 record": "inswapper_128.int8.json",
        "engine": "inswapper_128.nvidia-h200.fp16.engine",
        "manifest": "inswapper_128.nvidia-h200.fp16.json",
        # Keyed by the calibration data and TensorRT version on purpose: an older cache is never read.
        "trt calibration": "inswapper_128.nvidia-h200.int8.calib-0123456789abcdef.trt10.9.0.34.cache",
        "calibration data": "inswapper_128.calibration.npz",
        "timing": "timing.nvidia-h200.trt10.9.0.34.cache",
    }


def test_a_model_without_a_known_sha256_gets_a_local_rewrite(tmp_path: Path) -> None:
    assert ModelFiles(tmp_path / "m.onnx").dynamic.name == "m.local.dynamic.onnx"
    assert ModelFiles(tmp_path / "m.onnx", "ab" * 32).dynamic.name == "m.abababababab.dynamic.onnx"


def test_records_and_slugs() -> None:
    assert record_path(Path("/m/a.int8.onnx")) == Path("/m/a.int8.json")
    assert record_path(Path("/m/a.gpu.fp16.engine")) == Path("/m/a.gpu.fp16.json")
    assert gpu_slug("NVIDIA GeForce RTX 3060 Ti") == "nvidia-geforce-rtx-3060-ti"
    assert gpu_slug("???") == "gpu"


def test_engines_on_disk_are_found_by_model_and_precision(tmp_path: Path) -> None:
    for name in (
        "m[1].nvidia-h200.fp16.engine",
        "m[1].nvidia-l4.int8.engine",
        "m[1].fp16.onnx",
        "m[1].nvidia-h200.fp16.json",
        "m[12].nvidia-h200.fp16.engine",  # another model
        "m1.nvidia-h200.fp16.engine",  # what an unescaped glob of "m[1]" would match
    ):
        (tmp_path / name).write_bytes(b"")
    files = ModelFiles(tmp_path / "m[1].onnx")
    assert [p.name for p in files.engines()] == ["m[1].nvidia-h200.fp16.engine", "m[1].nvidia-l4.int8.engine"]
    assert [p.name for p in files.engines("int8")] == ["m[1].nvidia-l4.int8.engine"]
    assert files.engines("fp32") == []


def test_the_store_knows_each_models_files(tmp_path: Path) -> None:
    files = ModelStore(tmp_path).files("inswapper_128")
    assert files == ModelFiles(tmp_path / "inswapper_128.onnx", INSWAPPER_SHA)


# --- onnx_io and the rewrite step ------------------------------------------------------------------


def _model(batch: int | str) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _mixes_items() -> onnx.ModelProto:
    """Fixed batch of 1, but each item's result depends on the whole batch: no sound rewrite exists."""
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["x"], ["mean"], axes=[0], keepdims=1),
            helper.make_node("Mul", ["x", "x"], ["sq"]),
            helper.make_node("Sub", ["sq", "mean"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_load_onnx_says_what_it_was_loading_for(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"^cannot quantize .*absent.onnx: no such model file$"):
        load_onnx(tmp_path / "absent.onnx", f"quantize {tmp_path / 'absent.onnx'}")
    junk = write_bytes_atomic(tmp_path / "junk.onnx", b"\x08\xff not a protobuf")
    with pytest.raises(ModelError, match="cannot rewrite .*junk.onnx: not a readable ONNX model") as caught:
        load_onnx(junk, f"rewrite {junk}")
    assert "\n" not in str(caught.value)


def test_fixed_batch_is_read_from_the_first_fed_input(tmp_path: Path) -> None:
    assert is_fixed_batch(_model(1))
    assert not is_fixed_batch(_model("batch"))
    assert not is_fixed_batch(_model(2))
    with_initializer_input = _model(1)
    with_initializer_input.graph.input.insert(0, helper.make_tensor_value_info("w", TensorProto.FLOAT, [3]))
    with_initializer_input.graph.initializer.append(helper.make_tensor("w", TensorProto.FLOAT, [3], [0, 0, 0]))
    assert [v.name for v in fed_inputs(with_initializer_input)] == ["x"]
    assert is_fixed_batch(with_initializer_input)
    assert file_is_fixed_batch(save_model_atomic(_model(1), tmp_path / "m.onnx"))


def test_check_loads_names_the_model_onnx_runtime_refuses(tmp_path: Path) -> None:
    check_loads(save_model_atomic(_model(1), tmp_path / "good.onnx"), "good")
    broken = _model(1)
    broken.graph.node[0].op_type = "NoSuchOp"
    path = tmp_path / "broken.onnx"
    onnx.save_model(broken, str(path))
    with pytest.raises(ModelError, match=r"^ONNX Runtime cannot load the FP16 conversion of m.onnx: ") as caught:
        check_loads(path, "the FP16 conversion of m.onnx")
    assert "\n" not in str(caught.value)


def test_a_fixed_batch_model_runs_from_its_cached_rewrite(tmp_path: Path) -> None:
    files = ModelFiles(save_model_atomic(_model(1), tmp_path / "m.onnx"), "cd" * 32)
    runnable = rewrite_if_fixed_batch(files)
    assert runnable == files.dynamic == tmp_path / "m.cdcdcdcdcdcd.dynamic.onnx"
    assert not file_is_fixed_batch(runnable)
    made = runnable.stat().st_mtime_ns
    assert rewrite_if_fixed_batch(files) == runnable and runnable.stat().st_mtime_ns == made  # cached

    import onnxruntime as ort

    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    (y,) = ort.InferenceSession(str(runnable), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_a_free_batch_model_runs_as_it_is(tmp_path: Path) -> None:
    files = ModelFiles(save_model_atomic(_model("batch"), tmp_path / "m.onnx"))
    assert rewrite_if_fixed_batch(files) == files.model
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]


def test_a_model_that_cannot_be_rewritten_runs_item_by_item_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    files = ModelFiles(save_model_atomic(_mixes_items(), tmp_path / "m.onnx"))
    with caplog.at_level(logging.WARNING, logger="engines.onnx_batch"):
        assert rewrite_if_fixed_batch(files) == files.model
    assert "m.onnx keeps its fixed batch of 1" in caplog.text and "cannot be made batch-dynamic" in caplog.text
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]
