"""Torch mirrors of the networks swapcast imports or builds, for pruning, distillation and export.

Each network is rebuilt from its ONNX file (`from_onnx`) with every width read from the weights, so the
same classes hold the original models and their pruned or distilled variants. `spec_of`/`net_from_spec`
turn a network's shape into a JSON-able dict and back (checkpoints store it next to the weights).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
from torch import nn

from engines.errors import ModelError
from engines.torchnets.rrdbnet import RRDBNet, RRDBSpec
from engines.torchnets.srvgg import SRVGG, SRVGGSpec
from engines.torchnets.swapper import Swapper, SwapperSpec

TorchNet = RRDBNet | SRVGG | Swapper

__all__ = ["SRVGG", "RRDBNet", "RRDBSpec", "SRVGGSpec", "Swapper", "SwapperSpec", "TorchNet", "load_onnx_net"]


def spec_of(net: nn.Module) -> dict[str, Any]:
    if isinstance(net, RRDBNet | SRVGG | Swapper):
        return net.spec.to_dict()
    raise TypeError(f"{type(net).__name__} is not one of swapcast's torch networks")


def net_from_spec(spec: dict[str, Any]) -> TorchNet:
    arch = spec.get("arch")
    if arch == "rrdbnet":
        return RRDBNet(RRDBSpec.from_dict(spec))
    if arch == "srvgg":
        return SRVGG(SRVGGSpec.from_dict(spec))
    if arch == "swapper":
        return Swapper(SwapperSpec.from_dict(spec))
    raise ModelError(f"unknown network architecture {arch!r} in a checkpoint")


def load_onnx_net(path: Path | str) -> TorchNet:
    """The torch network of an ONNX file, recognised by its operators: RRDBNet (Concat), SRVGG
    (DepthToSpace) or the reference swapper (InstanceNormalization)."""
    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception as exc:  # protobuf raises several unrelated types on a corrupt file
        raise ModelError(f"cannot read {path}: not a readable ONNX model ({exc})") from None
    ops = {node.op_type for node in graph.node}
    if "InstanceNormalization" in ops:
        return Swapper.from_onnx(path)
    if "DepthToSpace" in ops:
        return SRVGG.from_onnx(path)
    if "Concat" in ops:
        return RRDBNet.from_onnx(path)
    raise ModelError(f"{Path(path).name} is none of the networks swapcast can load in torch (RRDBNet, SRVGG, swapper)")
