"""FP16 and INT8 variants of the detector, the narrow reference swapper and Real-ESRGAN animevideov3 x2:
they build on a CPU, run in ONNX Runtime, and stay within measured tolerances of FP32 on real face images.

Tolerances (measured with ONNX Runtime 1.32 on an AVX2 CPU without VNNI, where 8-bit weights saturate: see
engines.precision.int8; the tests leave a margin):
  detector FP16: same faces on t1 (6) and the astronaut (1), landmarks within 1 px (measured 0.04 px);
  detector INT8 (MinMax, per-channel, 32 calibration frames, 7-bit weights): same faces, landmarks within
    6 px on t1 (1280x886, faces about 100 px wide; measured 5.1 px) and 4 px on the astronaut (1.3 px);
  Real-ESRGAN FP16: PSNR >= 35 dB vs FP32 (measured 79 dB); INT8: >= 33 dB (measured 39 dB);
  reference swapper FP16: PSNR >= 50 dB, max abs <= 0.02 (measured 68 dB, 0.0034); INT8: PSNR >= 22 dB,
    max abs <= 0.7 (measured 25.2 dB, 0.37): the untrained network amplifies quantization noise
    from its first convolutions (each alone costs 4-6 dB), so this is a floor, not a target;
  FP16 with FP16 arithmetic (onnx2torch on the CPU; ONNX Runtime's CPU provider computes FP16 graphs in
    FP32): swapper PSNR >= 50 dB (measured 61 dB), detector landmarks within 1 px on the astronaut.
"""

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from app.calibration import calibration_frames, calibration_set, face_crops
from app.pipeline.detect import DetectorConfig, RetinaFaceDetector
from app.pipeline.types import Face, Image
from app.runtime.onnx import OnnxModel
from app.runtime.torch_backend import TorchModel
from app.variants import source_for
from engines.errors import ModelError
from engines.model_files import ModelFiles
from engines.precision.fp16 import convert_fp16, overflow_nodes
from engines.precision.int8 import CalibrationSet, quantize_int8
from engines.precision.quality import compare_outputs, measure, psnr
from engines.precision.variants import VariantRecord, check_variant, write_record
from engines.store import ModelStore, sha256_file

MODELS = ("retinaface_mnet025", "reference_swapper_narrow", "realesr_animevideov3_x2")
CALIBRATION_SAMPLES = {"retinaface_mnet025": 32, "reference_swapper_narrow": 16, "realesr_animevideov3_x2": 16}


@pytest.fixture(scope="session")
def sources(store: ModelStore) -> dict[str, Path]:
    # Fixed-batch graphs (the swapper) are made from their batch-dynamic rewrite, as the CLI does.
    return {name: source_for(store, name).runnable for name in MODELS}


@pytest.fixture(scope="session")
def calibration(store: ModelStore, sources: dict[str, Path]) -> dict[str, CalibrationSet]:
    return {name: calibration_set(store, name, path, CALIBRATION_SAMPLES[name]) for name, path in sources.items()}


@pytest.fixture(scope="session")
def fp16(sources: dict[str, Path], calibration: dict[str, CalibrationSet]) -> dict[str, Path]:
    out = {}
    for name, path in sources.items():
        sample = {k: v for k, v in calibration[name].samples[0].items()}
        out[name] = convert_fp16(path, ModelFiles(path).variant("fp16"), range_feeds=sample).path
    return out


@pytest.fixture(scope="session")
def int8(sources: dict[str, Path], calibration: dict[str, CalibrationSet]) -> dict[str, Path]:
    return {
        name: quantize_int8(path, ModelFiles(path).variant("int8"), calibration[name]).path
        for name, path in sources.items()
    }


@pytest.fixture(scope="session")
def held_out(store: ModelStore) -> Iterator[np.ndarray]:
    """RGB [0,1] NCHW face crops from motion-clip frames the calibration never saw."""
    detector = RetinaFaceDetector(OnnxModel(store.ensure("retinaface_mnet025"), threads=2), DetectorConfig())
    crops = face_crops(detector, 6, 128, calibration_frames(12, seed=1000, photos_first=False))
    yield np.stack([(c[..., ::-1].astype(np.float32) / 255.0).transpose(2, 0, 1) for c, _, _ in crops])


def unit_latents(count: int) -> np.ndarray:
    latents = np.random.default_rng(7).standard_normal((count, 512)).astype(np.float32)
    return latents / np.linalg.norm(latents, axis=1, keepdims=True)


def detect(path: Path, image: Image) -> list[Face]:
    detector = RetinaFaceDetector(OnnxModel(path, threads=2), DetectorConfig(refine_landmarks=False))
    return detector.process([image])[0]


def landmark_error(want: list[Face], got: list[Face]) -> float:
    """Largest landmark distance (px, per coordinate) from each reference face to the nearest face found."""
    return max(min(float(np.abs(g.landmarks - w.landmarks).max()) for g in got) for w in want)


# -- FP16 ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_fp16_keeps_fp32_inputs_and_outputs_and_halves_the_weights(
    name: str, sources: dict[str, Path], fp16: dict[str, Path]
) -> None:
    model = onnx.load(str(fp16[name]))
    for value in [*model.graph.input, *model.graph.output]:
        assert value.type.tensor_type.elem_type == TensorProto.FLOAT, value.name
    half = [init for init in model.graph.initializer if init.data_type == TensorProto.FLOAT16]
    assert len(half) > 10
    assert fp16[name].stat().st_size < 0.6 * sources[name].stat().st_size


def test_fp16_detector_finds_the_same_faces_within_a_pixel(
    sources: dict[str, Path], fp16: dict[str, Path], t1: Image, astronaut: Image
) -> None:
    for image, count in ((t1, 6), (astronaut, 1)):
        want = detect(sources["retinaface_mnet025"], image)
        got = detect(fp16["retinaface_mnet025"], image)
        assert len(want) == len(got) == count
        assert landmark_error(want, got) <= 1.0


@pytest.mark.slow
def test_fp16_enhancer_psnr_at_least_35_db(
    sources: dict[str, Path], fp16: dict[str, Path], held_out: np.ndarray
) -> None:
    report = measure(sources["realesr_animevideov3_x2"], fp16["realesr_animevideov3_x2"], {"input": held_out})
    assert report.min_psnr is not None and report.min_psnr >= 35.0, report.describe()


def test_fp16_swapper_within_tolerance(sources: dict[str, Path], fp16: dict[str, Path], held_out: np.ndarray) -> None:
    feeds = {"target": held_out, "source": unit_latents(len(held_out))}
    report = measure(sources["reference_swapper_narrow"], fp16["reference_swapper_narrow"], feeds)
    assert report.min_psnr is not None and report.min_psnr >= 50.0, report.describe()
    assert report.max_abs <= 0.02, report.describe()


@pytest.mark.slow
def test_fp16_arithmetic_swapper_and_detector_within_tolerance(
    sources: dict[str, Path], fp16: dict[str, Path], held_out: np.ndarray, astronaut: Image
) -> None:
    """The same FP16 graphs with FP16 arithmetic, as a GPU runs them: ONNX Runtime's CPU provider has no
    FP16 kernels for most ops on x86 and computes in FP32 between casts; onnx2torch runs each op in the
    dtype the graph gives it (slow on a CPU, hence one crop and one small detector canvas)."""
    feeds = {"target": held_out[:1], "source": unit_latents(1)}
    want = OnnxModel(sources["reference_swapper_narrow"], threads=2).run(feeds)
    got = TorchModel(fp16["reference_swapper_narrow"], device="cpu").run(feeds)
    report = compare_outputs(["output"], want, got)
    assert report.min_psnr is not None and report.min_psnr >= 50.0, report.describe()

    config = DetectorConfig(size=320, refine_landmarks=False)
    (reference,) = RetinaFaceDetector(OnnxModel(sources["retinaface_mnet025"], threads=2), config).process([astronaut])
    (half,) = RetinaFaceDetector(TorchModel(fp16["retinaface_mnet025"], device="cpu"), config).process([astronaut])  # type: ignore[arg-type]
    assert len(half) == len(reference) == 1
    assert landmark_error(reference, half) <= 1.0


def _overflowing_model() -> onnx.ModelProto:
    """x * 8000 -> InstanceNormalization -> output: for x above 8.2 the scaled tensor leaves FP16's range."""
    scale = numpy_helper.from_array(np.array(8000.0, np.float32), "scale")
    gamma = numpy_helper.from_array(np.ones(2, np.float32), "gamma")
    beta = numpy_helper.from_array(np.zeros(2, np.float32), "beta")
    nodes = [
        helper.make_node("Mul", ["x", "scale"], ["big"], name="amplify"),
        helper.make_node("InstanceNormalization", ["big", "gamma", "beta"], ["y"], name="norm", epsilon=1e-5),
    ]
    graph = helper.make_graph(
        nodes,
        "overflow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2, 8, 8])],
        [scale, gamma, beta],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_measured_ranges_keep_overflowing_nodes_in_fp32(tmp_path: Path) -> None:
    src = tmp_path / "overflow.onnx"
    onnx.save_model(_overflowing_model(), str(src))
    x = np.random.default_rng(0).uniform(1.0, 16.0, (1, 2, 8, 8)).astype(np.float32)
    assert set(overflow_nodes(onnx.load(str(src)), {"x": x})) == {"amplify", "norm"}

    naive = convert_fp16(src, tmp_path / "naive.onnx")
    guarded = convert_fp16(src, tmp_path / "guarded.onnx", range_feeds={"x": x})
    assert naive.blocked_nodes == () and set(guarded.blocked_nodes) == {"amplify", "norm"}
    # ONNX Runtime's CPU provider has no FP16 kernels for these ops: it casts back to FP32 and drops the
    # casts, which hides the overflow. onnx2torch runs each op in the dtype the graph gives it.
    (want,) = TorchModel(src, device="cpu").run({"x": x})
    (naive_out,) = TorchModel(naive.path, device="cpu").run({"x": x})
    (guarded_out,) = TorchModel(guarded.path, device="cpu").run({"x": x})
    assert not np.isfinite(naive_out).all()  # x * 8000 passes 65504: inf, then NaN after normalisation
    assert np.abs(guarded_out - want).max() <= 2e-3  # only the FP16 rounding of x at the input cast


def test_psnr_and_comparison_basics() -> None:
    a = np.zeros((1, 3, 4, 4), np.float32)
    assert psnr(a, a) == float("inf")
    assert psnr(a, a + 0.1) == pytest.approx(20.0)
    report = compare_outputs(["img", "vec"], [a, np.ones((1, 5))], [a + 0.1, np.ones((1, 5))])
    assert report.outputs[0].psnr == pytest.approx(20.0) and report.outputs[1].psnr is None
    with pytest.raises(ValueError, match="shape"):
        compare_outputs(["img"], [a], [a[:, :1]])


# -- INT8 ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_int8_models_are_qdq_and_smaller(sources: dict[str, Path], int8: dict[str, Path]) -> None:
    for name in MODELS:
        ops = {node.op_type for node in onnx.load(str(int8[name])).graph.node}
        assert {"QuantizeLinear", "DequantizeLinear"} <= ops, name
        assert int8[name].stat().st_size < 0.5 * sources[name].stat().st_size


def test_int8_weights_for_onnx_runtime_fit_in_seven_bits(int8: dict[str, Path]) -> None:
    # 8-bit weights overflow ONNX Runtime's 16-bit pair sums on CPUs without VNNI (engines.precision.int8).
    for name in MODELS:
        weights = [
            numpy_helper.to_array(t)
            for t in onnx.load(str(int8[name])).graph.initializer
            if t.data_type == TensorProto.INT8 and t.dims
        ]
        assert weights, name
        assert max(int(np.abs(w.astype(np.int16)).max()) for w in weights) <= 64, name


def test_int8_detector_finds_the_same_faces_within_the_measured_tolerance(
    sources: dict[str, Path], int8: dict[str, Path], t1: Image, astronaut: Image
) -> None:
    for image, count, tolerance in ((t1, 6, 6.0), (astronaut, 1, 4.0)):
        want = detect(sources["retinaface_mnet025"], image)
        got = detect(int8["retinaface_mnet025"], image)
        assert len(want) == len(got) == count
        assert landmark_error(want, got) <= tolerance


@pytest.mark.slow
def test_int8_enhancer_psnr(sources: dict[str, Path], int8: dict[str, Path], held_out: np.ndarray) -> None:
    report = measure(sources["realesr_animevideov3_x2"], int8["realesr_animevideov3_x2"], {"input": held_out})
    assert report.min_psnr is not None and report.min_psnr >= 33.0, report.describe()


def test_int8_swapper_within_the_measured_tolerance(
    sources: dict[str, Path], int8: dict[str, Path], held_out: np.ndarray
) -> None:
    feeds = {"target": held_out, "source": unit_latents(len(held_out))}
    report = measure(sources["reference_swapper_narrow"], int8["reference_swapper_narrow"], feeds)
    assert report.min_psnr is not None and report.min_psnr >= 22.0, report.describe()
    assert report.max_abs <= 0.7, report.describe()


def _relu_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Sigmoid", ["r"], ["y"], name="sig")],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1024])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _scale_of(path: Path, tensor: str) -> float:
    for init in onnx.load(str(path)).graph.initializer:
        if init.name == f"{tensor}_scale":
            return float(numpy_helper.to_array(init))
    raise AssertionError(f"no scale for {tensor}")


def test_entropy_clips_rare_outliers_that_minmax_keeps(tmp_path: Path) -> None:
    src = tmp_path / "relu.onnx"
    onnx.save_model(_relu_model(), str(src))
    rng = np.random.default_rng(0)
    samples = []
    for _ in range(8):
        x = np.abs(rng.standard_normal((1, 1024))).astype(np.float32)
        x[0, 0] = 60.0  # one outlier per sample
        samples.append({"x": x})
    calibration = CalibrationSet("relu", tuple(samples))
    minmax = quantize_int8(src, tmp_path / "minmax.onnx", calibration, method="minmax")
    entropy = quantize_int8(src, tmp_path / "entropy.onnx", calibration, method="entropy")
    # MinMax spans the outlier; Entropy settles on the bulk of the distribution.
    assert _scale_of(minmax.path, "r") == pytest.approx(60.0 / 255, rel=0.02)
    assert _scale_of(entropy.path, "r") < 0.5 * _scale_of(minmax.path, "r")


def test_int8_refuses_calibration_data_for_other_inputs(tmp_path: Path) -> None:
    src = tmp_path / "relu.onnx"
    onnx.save_model(_relu_model(), str(src))
    other = CalibrationSet("relu", ({"input": np.zeros((1, 1024), np.float32)},))
    with pytest.raises(ModelError, match="takes"):
        quantize_int8(src, tmp_path / "out.onnx", other)
    assert not (tmp_path / "out.onnx").exists()


# -- calibration data and records ---------------------------------------------------------------------


def test_calibration_set_round_trips_through_npz(tmp_path: Path) -> None:
    integers = np.arange(-104, 48, dtype=np.float32).reshape(1, 2, 4, 19)  # exact in FP16: stored as FP16
    fractions = (np.arange(24, dtype=np.float32).reshape(1, 24) / 255.0).astype(np.float32)
    original = CalibrationSet("m", ({"a": integers, "b": fractions}, {"a": integers + 1, "b": fractions}), "made here")
    path = original.save(tmp_path / "set.npz")
    loaded = CalibrationSet.load(path)
    assert loaded.model == "m" and loaded.source == "made here" and len(loaded) == 2
    assert loaded.digest() == original.digest()
    for got, want in zip(loaded.samples, original.samples, strict=True):
        for name in ("a", "b"):
            assert got[name].dtype == np.float32 and np.array_equal(got[name], want[name])
    with np.load(path) as raw:
        assert raw["s0_0"].dtype == np.float16 and raw["s0_1"].dtype == np.float32


def test_damaged_calibration_file_is_a_model_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.npz"
    path.write_bytes(b"not a zip")
    with pytest.raises(ModelError, match="damaged"):
        CalibrationSet.load(path)
    with pytest.raises(ModelError, match="no calibration data"):
        CalibrationSet.load(tmp_path / "missing.npz")


def test_calibration_data_for_each_role(calibration: dict[str, CalibrationSet]) -> None:
    detector = calibration["retinaface_mnet025"]
    assert len(detector) == 32 and detector.samples[0]["input"].shape == (1, 3, 640, 640)
    swapper = calibration["reference_swapper_narrow"]
    target, latent = swapper.samples[0]["target"], swapper.samples[0]["source"]
    assert target.shape == (1, 3, 128, 128) and target.min() >= 0.0 and target.max() <= 1.0
    assert latent.shape == (1, 512) and np.linalg.norm(latent) == pytest.approx(1.0, abs=1e-5)
    assert "random unit latents" in swapper.source
    enhancer = calibration["realesr_animevideov3_x2"]
    assert enhancer.samples[0]["input"].shape == (1, 3, 128, 128)


def test_variant_record_ties_the_variant_to_its_source(tmp_path: Path, sources: dict[str, Path]) -> None:
    variant = tmp_path / "m.fp16.onnx"
    variant.write_bytes(sources["retinaface_mnet025"].read_bytes()[:1000])
    record = VariantRecord("m", "fp16", variant.name, sha256_file(variant), "m.onnx", "a" * 64, "test")
    write_record(variant, record)
    assert check_variant(variant, "a" * 64) == record
    with pytest.raises(ModelError, match="another version"):
        check_variant(variant, "b" * 64)
    variant.write_bytes(b"changed")
    with pytest.raises(ModelError, match="damaged"):
        check_variant(variant, "a" * 64)
    variant.with_suffix(".json").write_text("{not json")
    with pytest.raises(ModelError, match="unreadable"):
        check_variant(variant, "a" * 64)
