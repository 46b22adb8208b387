"""Whether models on this machine run on a GPU: probed once per question, outside the settings (which only
hold what was configured)."""

from app.runtime.backend import gpu_platform, torch_cuda
from app.runtime.onnx import available_providers


def models_run_on_gpu() -> bool:
    """ONNX Runtime has a GPU provider, TensorRT sees a GPU, or PyTorch has CUDA."""
    on_gpu = available_providers()[0] != "CPUExecutionProvider"
    return on_gpu or gpu_platform() is not None or torch_cuda()


def batching_on(batching_enabled: bool | None) -> bool:
    """The SWAPCAST_BATCHING_ENABLED setting; unset, batching runs where models run on a GPU (see
    app.server.settings.ServerSettings.batching_enabled for the measurement behind it)."""
    return batching_enabled if batching_enabled is not None else models_run_on_gpu()
