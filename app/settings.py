"""Settings from the environment (prefix SWAPCAST_), validated once at start-up."""

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

EngineName = Literal["inswapper", "classic", "passthrough"]
# How models run: "auto" picks a TensorRT engine built for this GPU, else PyTorch on CUDA, else ONNX Runtime.
BackendName = Literal["auto", "onnxruntime", "tensorrt", "torch"]
# fp16 and int8 load the variants made by `swapcast engines fp16|int8|build-trt NAME` when present.
PrecisionName = Literal["fp32", "fp16", "int8"]


class PipelineSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SWAPCAST_", extra="ignore")

    engine: EngineName = "classic"
    swapper_model: str = "inswapper_128"
    recognizer_model: str = "arcface_w600k_r50"
    detector_model: str = "retinaface_mnet025"
    enhancer_model: str | None = None  # e.g. realesr_animevideov3_x2; None = no enhancement
    enhance_blend: float = Field(1.0, ge=0.0, le=1.0)
    detect_size: int = Field(640, ge=128, le=2048)
    detect_threshold: float = Field(0.75, gt=0.0, lt=1.0)
    detect_interval: int = Field(1, ge=1, le=60)
    refine_landmarks: bool = True  # second detector pass per face: steadier alignment, ~2 small runs per face
    faces: Literal["all", "largest"] = "all"
    color_strength: float = Field(1.0, ge=0.0, le=1.0)
    mask: Literal["auto", "box", "ellipse"] = "auto"
    threads: int | None = Field(None, ge=1)
    backend: BackendName = "auto"
    precision: PrecisionName = "fp32"


class BatchingSettings(BaseSettings):
    """Knobs of the shared dynamic batchers (live serving), one batcher per model stage; the pipeline
    factory builds them. Defaults come from `swapcast bench-batch`."""

    model_config = SettingsConfigDict(env_prefix="SWAPCAST_BATCH_", extra="ignore")

    detect_max_batch: int = Field(8, ge=1, le=256)
    swap_max_batch: int = Field(8, ge=1, le=256)
    enhance_max_batch: int = Field(4, ge=1, le=256)
    max_delay_ms: float = Field(4.0, ge=0.0, le=100.0)
    max_queue: int = Field(64, ge=1)
    policy: Literal["reject_newest", "drop_stalest"] = "drop_stalest"
    deadline_ms: float | None = Field(250.0, gt=0.0)
