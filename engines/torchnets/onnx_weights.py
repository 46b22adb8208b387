"""Read the weights of an ONNX graph in the order its nodes use them, for the torch mirrors to load.

The torch networks in this package are rebuilt from an ONNX file by walking its nodes in graph order:
the n-th Conv node of the file is the n-th convolution of the torch module (in its forward order), and
so on for PRelu slopes, Gemm matrices and scalar constants. Shapes are checked on the way, so a file of
another architecture fails with a one-line ModelError instead of loading garbage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from engines.errors import ModelError


@dataclass(frozen=True)
class ConvWeights:
    """One Conv node: its weight [out, in/groups, kh, kw], optional bias, and attributes."""

    name: str
    weight: np.ndarray
    bias: np.ndarray | None
    stride: int
    pad: int
    group: int

    @property
    def out_channels(self) -> int:
        return int(self.weight.shape[0])

    @property
    def in_channels(self) -> int:
        return int(self.weight.shape[1]) * self.group

    @property
    def kernel(self) -> int:
        return int(self.weight.shape[2])


class OnnxWeights:
    """Initializers of a loaded ONNX model, looked up through the nodes that read them."""

    def __init__(self, model: onnx.ModelProto, source: str) -> None:
        self.model = model
        self.source = source
        self.arrays: dict[str, np.ndarray] = {
            init.name: numpy_helper.to_array(init) for init in model.graph.initializer
        }

    @classmethod
    def load(cls, path: Path | str) -> OnnxWeights:
        path = Path(path)
        if not path.is_file():
            raise ModelError(f"cannot load weights from {path}: no such file")
        try:
            model = onnx.load(str(path))
        except Exception as exc:  # protobuf raises several unrelated types on a corrupt file
            raise ModelError(f"cannot load weights from {path}: not a readable ONNX model ({exc})") from None
        return cls(model, path.name)

    @property
    def nodes(self) -> list[onnx.NodeProto]:
        return list(self.model.graph.node)

    def op_types(self) -> list[str]:
        return [node.op_type for node in self.model.graph.node]

    def nodes_of(self, op_type: str) -> list[onnx.NodeProto]:
        return [node for node in self.model.graph.node if node.op_type == op_type]

    def array(self, name: str) -> np.ndarray:
        if name not in self.arrays:
            raise ModelError(f"{self.source}: tensor {name!r} is not an initializer; the graph is not supported")
        return self.arrays[name]

    def convs(self) -> list[ConvWeights]:
        """Every Conv node in graph order."""
        found = []
        for node in self.nodes_of("Conv"):
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            strides = list(attrs.get("strides", [1, 1]))
            pads = list(attrs.get("pads", [0, 0, 0, 0]))
            if len(set(strides)) != 1 or len(set(pads)) != 1:
                raise ModelError(f"{self.source}: Conv {node.name!r} has uneven strides or pads; not supported")
            if list(attrs.get("dilations", [1, 1])) != [1, 1]:
                raise ModelError(f"{self.source}: Conv {node.name!r} is dilated; not supported")
            bias = self.array(node.input[2]) if len(node.input) > 2 and node.input[2] else None
            found.append(
                ConvWeights(
                    name=node.name,
                    weight=self.array(node.input[1]).astype(np.float32),
                    bias=None if bias is None else bias.astype(np.float32),
                    stride=int(strides[0]),
                    pad=int(pads[0]),
                    group=int(attrs.get("group", 1)),
                )
            )
        return found

    def second_inputs(self, op_type: str) -> list[np.ndarray]:
        """The initializer read as second input by every `op_type` node, in graph order (PRelu slopes,
        Mul coefficients, Gemm weights)."""
        return [self.array(node.input[1]) for node in self.nodes_of(op_type) if node.input[1] in self.arrays]

    def last_initializer(self) -> np.ndarray:
        inits = self.model.graph.initializer
        if not inits:
            raise ModelError(f"{self.source} has no initializers")
        return numpy_helper.to_array(inits[-1]).astype(np.float32)


def copy_into(target: torch.Tensor, value: np.ndarray, what: str) -> None:
    """Copy `value` into a parameter or buffer of the same number of elements (shapes may differ only by
    size-1 axes, as PReLU slopes [C,1,1] against torch's [C])."""
    array = np.asarray(value, np.float32)
    if array.size != target.numel() or array.squeeze().shape != tuple(target.squeeze().shape):
        raise ModelError(f"{what}: the file holds shape {tuple(array.shape)}, the network needs {tuple(target.shape)}")
    with torch.no_grad():
        target.copy_(torch.from_numpy(array.reshape(tuple(target.shape)).copy()))


def load_conv(conv: torch.nn.Conv2d, weights: ConvWeights, what: str) -> None:
    copy_into(conv.weight, weights.weight, f"{what} weight")
    if conv.bias is not None:
        if weights.bias is None:
            raise ModelError(f"{what}: the file's convolution has no bias, the network needs one")
        copy_into(conv.bias, weights.bias, f"{what} bias")
    elif weights.bias is not None and np.any(weights.bias):
        raise ModelError(f"{what}: the file's convolution has a bias the network does not take")


def expect_count(items: Sequence[object], count: int, what: str, source: str) -> None:
    if len(items) != count:
        raise ModelError(f"{source}: expected {count} {what}, found {len(items)}; the architecture does not match")


def scalar_constants(weights: OnnxWeights, op_type: str) -> list[float]:
    """Single-element initializers read by `op_type` nodes as their second input, in graph order."""
    values = []
    for node in weights.nodes_of(op_type):
        for name in node.input[1:]:
            if name in weights.arrays and weights.arrays[name].size == 1:
                values.append(float(weights.arrays[name].reshape(())))
    return values
