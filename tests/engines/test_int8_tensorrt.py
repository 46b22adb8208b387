"""The INT8 QDQ graph made for TensorRT, checked without a GPU: node types TensorRT's ONNX parser accepts
(DequantizeLinear on INT8 only, zero points 0, no INT32 bias DQ), FP16 scales and layers beside the
quantized ones, and the accuracy that costs, measured on held-out face crops.

Measured here (ONNX Runtime 1.32 CPU, 16 calibration crops, 4 held out; the tests leave a margin):
Real-ESRGAN animevideov3 x2 PSNR vs FP32: ONNX Runtime form 39.7 dB, TensorRT form 38.5 dB (symmetric
activations cost 1.3 dB), with the rest in FP16 38.4 dB; narrow reference swapper 25.7 / 24.7 / 24.7 dB.
"""

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

import app.cli
from app.calibration import calibration_set
from engines.model_files import ModelFiles, record_path
from engines.precision.int8 import CalibrationSet, quantize_int8, tensorrt_qdq_problems
from engines.precision.quality import psnr, run_onnx
from engines.store import ModelStore

ENHANCER = "realesr_animevideov3_x2"
pytestmark = pytest.mark.slow  # three quantizations: about 25 s of CPU


@pytest.fixture(scope="module")
def enhancer_data(store: ModelStore) -> tuple[Path, CalibrationSet, dict[str, np.ndarray]]:
    path = store.ensure(ENHANCER)
    data = calibration_set(store, ENHANCER, path, 12)
    held = {"input": np.concatenate([s["input"] for s in data.samples[8:]])}
    return path, data.head(8), held


@pytest.fixture(scope="module")
def forms(
    enhancer_data: tuple[Path, CalibrationSet, dict[str, np.ndarray]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    path, calibration, _ = enhancer_data
    out = tmp_path_factory.mktemp("qdq")
    return {
        "onnxruntime": quantize_int8(path, out / "ort.onnx", calibration).path,
        "tensorrt-fp32": quantize_int8(path, out / "trt.onnx", calibration, target="tensorrt").path,
        "tensorrt-fp16": quantize_int8(
            path, out / "trt16.onnx", calibration, target="tensorrt", float16_rest=True
        ).path,
    }


def initializer_arrays(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}


@pytest.mark.slow
def test_the_onnxruntime_form_has_what_tensorrt_refuses(forms: dict[str, Path]) -> None:
    problems = tensorrt_qdq_problems(onnx.load(str(forms["onnxruntime"])))
    assert any("takes INT32" in p for p in problems)  # QuantizeBias: INT32 bias DequantizeLinear
    assert any("non-zero zero point" in p for p in problems) and any("produces UINT8" in p for p in problems)


@pytest.mark.parametrize("form", ["tensorrt-fp32", "tensorrt-fp16"])
def test_the_tensorrt_form_parses_node_by_node(forms: dict[str, Path], form: str) -> None:
    model = onnx.load(str(forms[form]))
    assert tensorrt_qdq_problems(model) == []
    values = initializer_arrays(model)
    producers = {out: node for node in model.graph.node for out in node.output}
    dequantize = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
    assert dequantize and all(values[n.input[0]].dtype == np.int8 for n in dequantize if n.input[0] in values)
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            zero = values[node.input[2]]
            assert zero.dtype == np.int8 and not zero.any()
        if node.op_type == "Conv":  # every convolution: INT8 weight and activation, bias FP32 (not quantized)
            weight, activation = producers[node.input[1]], producers[node.input[0]]
            assert weight.op_type == activation.op_type == "DequantizeLinear"
            assert node.input[2] in values and values[node.input[2]].dtype.kind == "f"
    io_types = [v.type.tensor_type.elem_type for v in [*model.graph.input, *model.graph.output]]
    assert io_types == [TensorProto.FLOAT, TensorProto.FLOAT]


def test_float16_rest_runs_the_unquantized_layers_in_fp16(forms: dict[str, Path]) -> None:
    model = onnx.load(str(forms["tensorrt-fp16"]))
    values = initializer_arrays(model)
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 19
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            assert values[node.input[1]].dtype == np.float16  # DQ feeds FP16 layers without a Cast
        if node.op_type in ("Conv", "PRelu"):
            assert all(
                values[name].dtype == np.float16
                for name in node.input
                if name in values and values[name].dtype.kind == "f"
            )


@pytest.mark.slow
def test_accuracy_of_each_form_on_held_out_crops(
    enhancer_data: tuple[Path, CalibrationSet, dict[str, np.ndarray]], forms: dict[str, Path]
) -> None:
    path, _, held = enhancer_data
    _, (reference,) = run_onnx(path, held)
    scores = {}
    for form, file in forms.items():
        _, (out,) = run_onnx(file, held, optimize=form != "tensorrt-fp16")
        scores[form] = psnr(reference, out)
    assert scores["onnxruntime"] >= 36 and scores["tensorrt-fp32"] >= 35
    assert scores["tensorrt-fp16"] >= scores["tensorrt-fp32"] - 0.5  # FP16 beside INT8 costs little


@pytest.fixture
def cli(store: ModelStore, monkeypatch: pytest.MonkeyPatch) -> Callable[[list[str]], int]:
    monkeypatch.setenv("SWAPCAST_MODEL_DIR", str(store.root))
    return app.cli.main


@pytest.mark.slow
def test_engines_int8_target_tensorrt_writes_the_tensorrt_form(
    cli: Callable[[list[str]], int], store: ModelStore, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(["engines", "int8", ENHANCER, "--target", "tensorrt", "--samples", "4"]) == 0
    made = ModelFiles(store.ensure(ENHANCER)).tensorrt_qdq
    assert str(made) in capsys.readouterr().out
    assert tensorrt_qdq_problems(onnx.load(str(made))) == []
    import json

    options = json.loads(record_path(made).read_text())["options"]
    assert options["target"] == "tensorrt" and options["float16_rest"] and options["symmetric_activations"]
    assert cli(["engines", "int8", ENHANCER, "--fp32-rest"]) == 2
    assert capsys.readouterr().err.strip() == "swapcast: error: --fp32-rest is for --target tensorrt"


# -- on a GPU ------------------------------------------------------------------------------------------


def has_tensorrt_gpu() -> bool:
    import importlib.util

    if importlib.util.find_spec("tensorrt") is None:
        return False
    from app.runtime.backend import gpu_platform

    return gpu_platform() is not None


@pytest.mark.gpu
@pytest.mark.skipif(not has_tensorrt_gpu(), reason="needs TensorRT and an NVIDIA GPU")
def test_int8_engine_builds_runs_and_stays_close_to_fp32(
    enhancer_data: tuple[Path, CalibrationSet, dict[str, np.ndarray]], tmp_path: Path
) -> None:
    from app.runtime.tensorrt import TensorRTModel
    from engines.tensorrt.build import BuildOptions, build_engine

    path, calibration, held = enhancer_data
    engine = tmp_path / f"{ENHANCER}.gpu.int8.engine"
    options = BuildOptions(
        precision="int8", max_batch=4, dims={"height": (32, 128, 128), "width": (32, 128, 128)}, calibration=calibration
    )
    manifest = build_engine(path, engine, model=ENHANCER, source_sha256="0" * 64, options=options)
    with TensorRTModel(engine, source_sha256="0" * 64) as model:
        (got,) = model.run(held)
    _, (reference,) = run_onnx(path, held)
    assert psnr(reference, got) >= 30, manifest.rewrites
