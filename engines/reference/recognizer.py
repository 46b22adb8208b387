"""A face recognizer with ArcFace w600k_r50's contract and UNTRAINED random weights.

It stands in for buffalo_l's w600k_r50.onnx where only the plumbing matters (alignment, batching, the
embedding-to-latent path): same input and output names, shapes and dtypes, but a small network whose
embeddings carry no identity.

Contract (as w600k_r50.onnx):
  input.1  float32 [N, 3, 112, 112]  RGB crop aligned to the arcface template, normalised (x - 127.5) / 127.5
  683      float32 [N, 512]          embedding, not normalised (callers L2-normalise it)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from engines.onnx_batch import save_model_atomic
from engines.reference.swapper import LEAKY_GAIN, NetBuilder

INPUT_NAME = "input.1"
OUTPUT_NAME = "683"
EMBEDDING_DIM = 512
INPUT_SIZE = 112
# Stride-2 3x3 convolutions: 112 -> 56 -> 28 -> 14 -> 7, then global pooling and a linear head.
WIDTHS = (32, 64, 128, 256)
PRELU_SLOPE = 0.25


def recognizer_model(seed: int = 0) -> onnx.ModelProto:
    """The reference recognizer as an in-memory ONNX model; weights are untrained."""
    b = NetBuilder(seed)
    x = INPUT_NAME
    c_in = 3
    for c_out in WIDTHS:
        x = b.conv(x, c_in, c_out, 3, stride=2, pad=1, gain=LEAKY_GAIN)
        slope = b.const(b.fresh("prelu.slope"), np.full((c_out, 1, 1), PRELU_SLOPE, np.float32))
        x = b.op1("PRelu", [x, slope])
        c_in = c_out
    x = b.op1("Flatten", [b.op1("GlobalAveragePool", [x])], axis=1)
    weight = b.random("fc.weight", (EMBEDDING_DIM, c_in), 1.0 / np.sqrt(c_in))
    bias = b.const("fc.bias", np.zeros(EMBEDDING_DIM, np.float32))
    b.nodes.append(helper.make_node("Gemm", [x, weight, bias], [OUTPUT_NAME], name="fc", transB=1))

    inputs = [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["N", 3, INPUT_SIZE, INPUT_SIZE])]
    outputs = [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["N", EMBEDDING_DIM])]
    return b.model(inputs, outputs, graph_name="reference_w600k_r50", kind="recognizer", extra_metadata={})


def build_reference_recognizer(path: Path, seed: int = 0) -> Path:
    """Write the UNTRAINED reference recognizer (w600k_r50's contract) to `path`; returns `path`."""
    return save_model_atomic(recognizer_model(seed), Path(path))
