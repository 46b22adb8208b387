"""Convert an ncnn model (text ``.param`` + ``.bin``) into an ONNX model, using only onnx and numpy.

The converter covers the operators that image-to-image CNNs exported through ncnn use (Real-ESRGAN's
RRDBNet and SRVGGNetCompact among them). Every ncnn blob is treated as a CHW feature map; the ONNX graph
gains a leading batch axis, so its input is ``[N, C, H, W]`` with N, H and W left dynamic. Reading the
ncnn files themselves lives in `engines.importers.ncnn_format`.

The output file is written to a temporary name next to its destination and renamed into place only once
the whole model has been built and checked, and the same input files always give the same bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from engines.atomic import write_bytes_atomic
from engines.errors import ModelError
from engines.importers.ncnn_format import TAG_FLOAT16, NcnnGraph, NcnnLayer, WeightReader, parse_param

__all__ = ["SUPPORTED_OPS", "TAG_FLOAT16", "build_onnx_model", "convert_ncnn_to_onnx"]

OPSET = 17
IR_VERSION = 8

# ncnn activation_type values carried by Convolution and ConvolutionDepthWise.
_ACT_NONE, _ACT_RELU, _ACT_LEAKY, _ACT_CLIP, _ACT_SIGMOID, _ACT_MISH, _ACT_HARDSWISH = range(7)

# ncnn pad values that ask for TensorFlow-style "same" padding instead of explicit pixels.
_PAD_SAME_UPPER = -233
_PAD_SAME_LOWER = -234

SUPPORTED_OPS = (
    "BinaryOp",
    "Clip",
    "Concat",
    "Convolution",
    "ConvolutionDepthWise",
    "Eltwise",
    "Input",
    "Interp",
    "Noop",
    "PReLU",
    "PixelShuffle",
    "ReLU",
    "Sigmoid",
    "Split",
)


class _Builder:
    """Accumulates ONNX nodes and initializers with unique, deterministic names."""

    def __init__(self, reserved: Sequence[str]) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._used: set[str] = set(reserved)

    def fresh(self, base: str) -> str:
        name = base
        n = 1
        while name in self._used:
            name = f"{base}_{n}"
            n += 1
        self._used.add(name)
        return name

    def const(self, base: str, value: np.ndarray) -> str:
        name = self.fresh(base)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def scalar(self, base: str, value: float) -> str:
        return self.const(base, np.array(value, dtype=np.float32))

    def node(self, op: str, inputs: Sequence[str], outputs: Sequence[str], base: str, **attrs: Any) -> None:
        self.nodes.append(helper.make_node(op, list(inputs), list(outputs), name=self.fresh(base), **attrs))


class _Converter:
    def __init__(self, graph: NcnnGraph, weights: WeightReader, input_name: str, output_name: str) -> None:
        self.graph = graph
        self.weights = weights
        self.input_name = input_name
        self.output_name = output_name
        self.b = _Builder([input_name, output_name])
        self.tensor: dict[str, str] = {}  # ncnn blob name -> ONNX tensor name
        self.channels: dict[str, int | None] = {}
        self.input_blob = ""
        self.output_blob = ""

    # -- graph-level bookkeeping ------------------------------------------------------------------------
    def run(self) -> onnx.GraphProto:
        layers = self.graph.layers
        for layer in layers:
            if layer.type not in SUPPORTED_OPS:
                raise ModelError(
                    f"{layer.where()}: ncnn operator {layer.type!r} is not supported by the ONNX converter "
                    f"(supported: {', '.join(SUPPORTED_OPS)})"
                )
        inputs = [layer for layer in layers if layer.type == "Input"]
        if len(inputs) != 1 or len(inputs[0].tops) != 1:
            raise ModelError(f"the model has {len(inputs)} Input layers; only single-input models are supported")
        self.input_blob = inputs[0].tops[0]

        consumed = {blob for layer in layers for blob in layer.bottoms}
        produced = [top for layer in layers for top in layer.tops]
        missing = sorted(consumed.difference(produced))
        if missing:
            raise ModelError(f"blobs {missing} are used but never produced; the .param file is corrupt")
        outputs = [blob for blob in produced if blob not in consumed]
        if len(outputs) != 1:
            raise ModelError(
                f"the model has {len(outputs)} output blobs ({', '.join(outputs)}); "
                "only single-output models are supported"
            )
        self.output_blob = outputs[0]

        for layer in layers:
            for blob in layer.bottoms:
                if blob not in self.tensor:
                    raise ModelError(f"{layer.where()}: blob {blob!r} is used before it is produced")
            getattr(self, "_op_" + layer.type)(layer)
        self.weights.finish()

        return helper.make_graph(
            self.b.nodes,
            "ncnn_import",
            [_image_value(self.input_name, self._input_channels(), "height", "width")],
            [_image_value(self.output_name, self.channels.get(self.output_blob), "out_height", "out_width")],
            initializer=self.b.initializers,
        )

    def _input_channels(self) -> int | None:
        declared = self.channels.get(self.input_blob)
        if declared:
            return declared
        # Without a declared shape, take the channel count from the first convolution fed by the input.
        aliases = {self.input_blob}
        for layer in self.graph.layers:
            if layer.type == "Split" and layer.bottoms[0] in aliases:
                aliases.update(layer.tops)
            if layer.type in ("Convolution", "ConvolutionDepthWise") and layer.bottoms[0] in aliases:
                return _conv_shape(layer)[1] * layer.int_param(7, 1)
        return None

    def _out(self, layer: NcnnLayer, index: int = 0) -> str:
        blob = layer.tops[index]
        name = self.output_name if blob == self.output_blob else self.b.fresh(blob)
        self.tensor[blob] = name
        return name

    def _in(self, layer: NcnnLayer, index: int = 0) -> str:
        return self.tensor[layer.bottoms[index]]

    def _alias(self, layer: NcnnLayer) -> None:
        source = self._in(layer)
        for i, blob in enumerate(layer.tops):
            self.channels[blob] = self.channels.get(layer.bottoms[0])
            if blob == self.output_blob:
                self.b.node("Identity", [source], [self._out(layer, i)], layer.name)
            else:
                self.tensor[blob] = source

    def _expect(self, layer: NcnnLayer, bottoms: int | None, tops: int = 1) -> None:
        if (bottoms is not None and len(layer.bottoms) != bottoms) or len(layer.tops) != tops:
            raise ModelError(
                f"{layer.where()}: expected {bottoms} input and {tops} output blobs, "
                f"got {len(layer.bottoms)} and {len(layer.tops)}"
            )

    # -- operators --------------------------------------------------------------------------------------
    def _op_Input(self, layer: NcnnLayer) -> None:
        self._expect(layer, 0)
        blob = layer.tops[0]
        self.tensor[blob] = self.input_name
        c = layer.int_param(2, 0)
        self.channels[blob] = c if c > 0 else None
        if blob == self.output_blob:
            raise ModelError("the model's input is also its output; there is nothing to convert")

    def _op_Split(self, layer: NcnnLayer) -> None:
        if len(layer.bottoms) != 1:
            raise ModelError(f"{layer.where()}: Split takes one input blob")
        self._alias(layer)

    def _op_Noop(self, layer: NcnnLayer) -> None:
        self._expect(layer, 1)
        self._alias(layer)

    def _op_Convolution(self, layer: NcnnLayer) -> None:
        self._conv(layer, group=1)

    def _op_ConvolutionDepthWise(self, layer: NcnnLayer) -> None:
        self._conv(layer, group=layer.int_param(7, 1))

    def _conv(self, layer: NcnnLayer, group: int) -> None:
        self._expect(layer, 1)
        if layer.int_param(8, 0) != 0:
            raise ModelError(f"{layer.where()}: int8 quantized convolution is not supported")
        if layer.int_param(19, 0) != 0:
            raise ModelError(f"{layer.where()}: convolution with dynamic weights is not supported")
        if layer.float_param(18, 0.0) != 0.0:
            raise ModelError(f"{layer.where()}: convolution padding with a non-zero value is not supported")
        num_output, cin_per_group, kh, kw = _conv_shape(layer)
        if group < 1 or num_output % group:
            raise ModelError(f"{layer.where()}: group {group} does not divide num_output {num_output}")
        # weight_data_size = num_output * (num_input / group) * kh * kw, in ONNX's [M, C/group, kH, kW] order.
        shape = (num_output, cin_per_group, kh, kw)
        weight = self.weights.tagged(int(np.prod(shape)), f"{layer.where()} weights").reshape(shape)
        inputs = [self._in(layer), self.b.const(f"{layer.name}.weight", weight)]
        if layer.int_param(5, 0):
            bias = self.weights.raw(num_output, f"{layer.where()} bias")
            inputs.append(self.b.const(f"{layer.name}.bias", bias))

        dilation_w = layer.int_param(2, 1)
        stride_w = layer.int_param(3, 1)
        pad_left = layer.int_param(4, 0)
        pad_right = layer.int_param(15, pad_left)
        pad_top = layer.int_param(14, pad_left)
        pad_bottom = layer.int_param(16, pad_top)
        attrs: dict[str, object] = {
            "kernel_shape": [kh, kw],
            "dilations": [layer.int_param(12, dilation_w), dilation_w],
            "strides": [layer.int_param(13, stride_w), stride_w],
            "group": group,
        }
        pads = (pad_top, pad_left, pad_bottom, pad_right)
        if pad_left in (_PAD_SAME_UPPER, _PAD_SAME_LOWER):
            attrs["auto_pad"] = "SAME_UPPER" if pad_left == _PAD_SAME_UPPER else "SAME_LOWER"
        elif min(pads) < 0:
            raise ModelError(f"{layer.where()}: padding {pads} is not supported")
        else:
            attrs["pads"] = [pad_top, pad_left, pad_bottom, pad_right]

        activation = layer.int_param(9, _ACT_NONE)
        final = self._out(layer)
        conv_out = final if activation == _ACT_NONE else self.b.fresh(f"{layer.name}.conv")
        self.b.node("Conv", inputs, [conv_out], layer.name, **attrs)
        self._activation(layer, activation, layer.array_param(10), conv_out, final)
        self.channels[layer.tops[0]] = num_output

    def _activation(self, layer: NcnnLayer, kind: int, args: tuple[float, ...], x: str, y: str) -> None:
        base = f"{layer.name}.act"
        if kind == _ACT_NONE:
            return
        if kind == _ACT_RELU:
            self.b.node("Relu", [x], [y], base)
        elif kind == _ACT_LEAKY:
            self.b.node("LeakyRelu", [x], [y], base, alpha=_arg(layer, args, 0))
        elif kind == _ACT_CLIP:
            lo = self.b.scalar(f"{base}.min", _arg(layer, args, 0))
            hi = self.b.scalar(f"{base}.max", _arg(layer, args, 1))
            self.b.node("Clip", [x, lo, hi], [y], base)
        elif kind == _ACT_SIGMOID:
            self.b.node("Sigmoid", [x], [y], base)
        elif kind == _ACT_MISH:
            soft = self.b.fresh(f"{base}.softplus")
            tanh = self.b.fresh(f"{base}.tanh")
            self.b.node("Softplus", [x], [soft], f"{base}.softplus")
            self.b.node("Tanh", [soft], [tanh], f"{base}.tanh")
            self.b.node("Mul", [x, tanh], [y], base)
        elif kind == _ACT_HARDSWISH:
            gate = self.b.fresh(f"{base}.gate")
            alpha, beta = _arg(layer, args, 0), _arg(layer, args, 1)
            self.b.node("HardSigmoid", [x], [gate], f"{base}.gate", alpha=alpha, beta=beta)
            self.b.node("Mul", [x, gate], [y], base)
        else:
            raise ModelError(f"{layer.where()}: activation type {kind} is not supported")

    def _op_ReLU(self, layer: NcnnLayer) -> None:
        self._expect(layer, 1)
        slope = layer.float_param(0, 0.0)
        out = self._out(layer)
        if slope == 0.0:
            self.b.node("Relu", [self._in(layer)], [out], layer.name)
        else:
            self.b.node("LeakyRelu", [self._in(layer)], [out], layer.name, alpha=slope)
        self.channels[layer.tops[0]] = self.channels.get(layer.bottoms[0])

    def _op_Sigmoid(self, layer: NcnnLayer) -> None:
        self._expect(layer, 1)
        self.b.node("Sigmoid", [self._in(layer)], [self._out(layer)], layer.name)
        self.channels[layer.tops[0]] = self.channels.get(layer.bottoms[0])

    def _op_Clip(self, layer: NcnnLayer) -> None:
        self._expect(layer, 1)
        lo = self.b.scalar(f"{layer.name}.min", layer.float_param(0, float(-np.finfo(np.float32).max)))
        hi = self.b.scalar(f"{layer.name}.max", layer.float_param(1, float(np.finfo(np.float32).max)))
        self.b.node("Clip", [self._in(layer), lo, hi], [self._out(layer)], layer.name)
        self.channels[layer.tops[0]] = self.channels.get(layer.bottoms[0])

    def _op_PReLU(self, layer: NcnnLayer) -> None:
        self._expect(layer, 1)
        count = layer.int_param(0, 0)
        if count < 1:
            raise ModelError(f"{layer.where()}: PReLU needs at least one slope")
        slope = self.weights.raw(count, f"{layer.where()} slopes")
        slope = slope.reshape(1) if count == 1 else slope.reshape(count, 1, 1)
        name = self.b.const(f"{layer.name}.slope", slope)
        self.b.node("PRelu", [self._in(layer), name], [self._out(layer)], layer.name)
        self.channels[layer.tops[0]] = self.channels.get(layer.bottoms[0])

    def _op_Concat(self, layer: NcnnLayer) -> None:
        self._expect(layer, None)
        if not layer.bottoms:
            raise ModelError(f"{layer.where()}: Concat needs at least one input blob")
        axis = layer.int_param(0, 0)
        onnx_axis = axis + 1 if axis >= 0 else axis
        inputs = [self._in(layer, i) for i in range(len(layer.bottoms))]
        self.b.node("Concat", inputs, [self._out(layer)], layer.name, axis=onnx_axis)
        counts = [self.channels.get(blob) for blob in layer.bottoms]
        if axis == 0:
            known = [c for c in counts if c is not None]
            self.channels[layer.tops[0]] = sum(known) if len(known) == len(counts) else None
        else:
            self.channels[layer.tops[0]] = counts[0]

    def _op_Eltwise(self, layer: NcnnLayer) -> None:
        self._expect(layer, None)
        if len(layer.bottoms) < 2:
            raise ModelError(f"{layer.where()}: Eltwise needs at least two input blobs")
        op_type = layer.int_param(0, 0)
        coeffs = layer.array_param(1)
        inputs = [self._in(layer, i) for i in range(len(layer.bottoms))]
        out = self._out(layer)
        if op_type == 1:
            if coeffs and len(coeffs) != len(inputs):
                raise ModelError(
                    f"{layer.where()}: {len(coeffs)} coefficients for {len(inputs)} inputs; the file is corrupt"
                )
            terms = []
            for i, (name, coeff) in enumerate(zip(inputs, coeffs or (1.0,) * len(inputs), strict=True)):
                if coeff == 1.0:
                    terms.append(name)
                    continue
                scaled = self.b.fresh(f"{layer.name}.term{i}")
                self.b.node("Mul", [name, self.b.scalar(f"{layer.name}.coeff{i}", coeff)], [scaled], layer.name)
                terms.append(scaled)
            self.b.node("Sum", terms, [out], layer.name)
        elif op_type == 0:
            self._chain("Mul", layer, inputs, out)
        elif op_type == 2:
            self.b.node("Max", inputs, [out], layer.name)
        else:
            raise ModelError(f"{layer.where()}: Eltwise operation {op_type} is not supported")
        self.channels[layer.tops[0]] = self.channels.get(layer.bottoms[0])

    def _chain(self, op: str, layer: NcnnLayer, inputs: list[str], out: str) -> None:
        acc = inputs[0]
        for i, name in enumerate(inputs[1:], start=1):
            target = out if i == len(inputs) - 1 else self.b.fresh(f"{layer.name}.partial{i}")
            self.b.node(op, [acc, name], [target], layer.name)
            acc = target

    _BINARY = {0: "Add", 1: "Sub", 2: "Mul", 3: "Div", 4: "Max", 5: "Min", 6: "Pow"}
    _REVERSED = {7: "Sub", 8: "Div", 9: "Pow"}

    def _op_BinaryOp(self, layer: NcnnLayer) -> None:
        op_type = layer.int_param(0, 0)
        op = self._BINARY.get(op_type) or self._REVERSED.get(op_type)
        if op is None:
            raise ModelError(f"{layer.where()}: BinaryOp operation {op_type} is not supported")
        if layer.int_param(1, 0):
            self._expect(layer, 1)
            a, b = self._in(layer), self.b.scalar(f"{layer.name}.b", layer.float_param(2, 0.0))
        else:
            self._expect(layer, 2)
            a, b = self._in(layer, 0), self._in(layer, 1)
        if op_type in self._REVERSED:
            a, b = b, a
        self.b.node(op, [a, b], [self._out(layer)], layer.name)
        self.channels[layer.tops[0]] = self.channels.get(layer.bottoms[0])

    def _op_PixelShuffle(self, layer: NcnnLayer) -> None:
        self._expect(layer, 1)
        factor = layer.int_param(0, 1)
        mode = layer.int_param(1, 0)
        if factor < 1 or mode not in (0, 1):
            raise ModelError(f"{layer.where()}: PixelShuffle factor {factor} mode {mode} is not supported")
        # ncnn mode 0 takes channel c*r*r + i*r + j (PyTorch order, ONNX CRD); mode 1 takes (i*r + j)*C + c.
        self.b.node(
            "DepthToSpace",
            [self._in(layer)],
            [self._out(layer)],
            layer.name,
            blocksize=factor,
            mode="CRD" if mode == 0 else "DCR",
        )
        c = self.channels.get(layer.bottoms[0])
        self.channels[layer.tops[0]] = c // (factor * factor) if c else None

    def _op_Interp(self, layer: NcnnLayer) -> None:
        self._expect(layer, 1)
        if layer.int_param(5, 0):
            raise ModelError(f"{layer.where()}: Interp with a dynamic target size is not supported")
        resize_type = layer.int_param(0, 0)
        align = layer.int_param(6, 0) != 0
        if resize_type == 1:
            attrs: dict[str, object] = {
                "mode": "nearest",
                "coordinate_transformation_mode": "asymmetric",
                "nearest_mode": "floor",
            }
        elif resize_type in (2, 3):
            attrs = {
                "mode": "linear" if resize_type == 2 else "cubic",
                "coordinate_transformation_mode": "align_corners" if align else "half_pixel",
            }
            if resize_type == 3:
                attrs["cubic_coeff_a"] = -0.75
                attrs["exclude_outside"] = 0
        else:
            raise ModelError(f"{layer.where()}: Interp resize type {resize_type} is not supported")

        x = self._in(layer)
        out_h, out_w = layer.int_param(3, 0), layer.int_param(4, 0)
        if out_h > 0 and out_w > 0:
            batch_channels = self.b.fresh(f"{layer.name}.nc")
            sizes = self.b.fresh(f"{layer.name}.sizes")
            self.b.node("Shape", [x], [batch_channels], f"{layer.name}.nc", start=0, end=2)
            hw = self.b.const(f"{layer.name}.hw", np.array([out_h, out_w], dtype=np.int64))
            self.b.node("Concat", [batch_channels, hw], [sizes], f"{layer.name}.sizes", axis=0)
            self.b.node("Resize", [x, "", "", sizes], [self._out(layer)], layer.name, **attrs)
        else:
            scale_h, scale_w = layer.float_param(1, 1.0), layer.float_param(2, 1.0)
            if scale_h <= 0 or scale_w <= 0:
                raise ModelError(f"{layer.where()}: Interp scale {scale_h}x{scale_w} is not positive")
            scales = self.b.const(f"{layer.name}.scales", np.array([1, 1, scale_h, scale_w], dtype=np.float32))
            self.b.node("Resize", [x, "", scales], [self._out(layer)], layer.name, **attrs)
        self.channels[layer.tops[0]] = self.channels.get(layer.bottoms[0])


def _conv_shape(layer: NcnnLayer) -> tuple[int, int, int, int]:
    """(num_output, input channels per group, kernel_h, kernel_w) of a convolution layer."""
    num_output = layer.int_param(0, 0)
    kw = layer.int_param(1, 0)
    kh = layer.int_param(11, kw)
    size = layer.int_param(6, 0)
    if num_output < 1 or kw < 1 or kh < 1 or size < 1 or size % (num_output * kh * kw):
        raise ModelError(f"{layer.where()}: weight size {size} does not fit {num_output} outputs of a {kh}x{kw} kernel")
    return num_output, size // (num_output * kh * kw), kh, kw


def _arg(layer: NcnnLayer, args: tuple[float, ...], index: int) -> float:
    if index >= len(args):
        raise ModelError(f"{layer.where()}: activation needs {index + 1} parameters, got {len(args)}")
    return args[index]


def _image_value(name: str, channels: int | None, h: str, w: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", channels, h, w])


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def build_onnx_model(
    param_text: str,
    bin_data: bytes,
    *,
    input_name: str = "input",
    output_name: str = "output",
    doc: str = "",
    param_name: str = "model.param",
    bin_name: str = "model.bin",
) -> onnx.ModelProto:
    """Build the ONNX model for ncnn ``.param`` text and ``.bin`` bytes; nothing is written to disk.

    ``param_name`` and ``bin_name`` only label error messages.
    """
    if not input_name or not output_name or input_name == output_name:
        raise ModelError("the ONNX input and output names must be non-empty and different")
    graph = parse_param(param_text, param_name)
    converter = _Converter(graph, WeightReader(bin_data, bin_name), input_name, output_name)
    model = helper.make_model(
        converter.run(),
        producer_name="swapcast.ncnn_import",
        producer_version="1",
        doc_string=doc,
        opset_imports=[helper.make_opsetid("", OPSET)],
    )
    model.ir_version = IR_VERSION
    helper.set_model_props(
        model,
        {
            "ncnn_param_sha256": _sha256(param_text.encode("utf-8")),
            "ncnn_bin_sha256": _sha256(bin_data),
        },
    )
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"the model converted from {param_name} failed ONNX validation: {first}") from exc
    return model


def convert_ncnn_to_onnx(
    param_path: Path,
    bin_path: Path,
    out_path: Path,
    *,
    input_name: str = "input",
    output_name: str = "output",
    doc: str = "",
) -> Path:
    """Convert an ncnn model into an ONNX file at ``out_path`` and return that path.

    The file appears only when conversion succeeds; the same inputs always produce the same bytes.
    """
    param_path, bin_path, out_path = Path(param_path), Path(bin_path), Path(out_path)
    try:
        param_text = param_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelError(f"ncnn param file {param_path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError(f"cannot read ncnn param file {param_path} ({exc}); is it the text .param?") from None
    try:
        bin_data = bin_path.read_bytes()
    except FileNotFoundError:
        raise ModelError(f"ncnn weight file {bin_path} does not exist") from None
    except OSError as exc:
        raise ModelError(f"cannot read ncnn weight file {bin_path} ({exc})") from None

    model = build_onnx_model(
        param_text,
        bin_data,
        input_name=input_name,
        output_name=output_name,
        doc=doc,
        param_name=param_path.name,
        bin_name=bin_path.name,
    )
    payload = model.SerializeToString(deterministic=True)
    write_bytes_atomic(out_path, payload)
    return out_path
