"""A stand-in classifier the tests build, with open_nsfw's inputs and outputs, that flags one marked picture: a
frame mostly covered in pure magenta. The decision path is tested with it, so no explicit material is needed."""

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from app.pipeline.types import Image

MAGENTA = (255, 0, 255)  # BGR


def build_marker_model(path: Path) -> Path:
    """[N,224,224,3] prepared as for open_nsfw (BGR minus the means) -> [N,2] softmax whose column 1 is near 1 when
    blue + red - green averages above what only magenta reaches (a photo or a white frame stays near 0)."""
    weights = np.array([[0.0, 0.1], [0.0, -0.1], [0.0, 0.1]], np.float32)
    bias = np.array([0.0, -30.0], np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["input_0"], ["colour"], axes=[1, 2], keepdims=0),
            helper.make_node("MatMul", ["colour", "weights"], ["logits_raw"]),
            helper.make_node("Add", ["logits_raw", "bias"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
        ],
        "magenta_marker",
        [helper.make_tensor_value_info("input_0", TensorProto.FLOAT, ["batch", 224, 224, 3])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 2])],
        [numpy_helper.from_array(weights, "weights"), numpy_helper.from_array(bias, "bias")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def marked(image: Image, share: float = 0.9) -> Image:
    """`image` with a centred magenta patch over `share` of each side."""
    out = image.copy()
    height, width = out.shape[:2]
    dy, dx = int(height * (1 - share) / 2), int(width * (1 - share) / 2)
    out[dy : height - dy, dx : width - dx] = MAGENTA
    return out
