"""Settings from the environment (prefix SWAPCAST_), validated once at start-up. Every SWAPCAST_ variable is
read here (or in app.server.settings), nowhere else."""

import os
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.names import BackendName, FaceLostPolicy, LocalBackend, Precision, SwapEngineChoice


def default_model_dir() -> Path:
    """Model files live under the user's cache directory unless SWAPCAST_MODEL_DIR says otherwise."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "swapcast" / "models"


class ModelStoreSettings(BaseSettings):
    """Where the model files are (`SWAPCAST_MODEL_DIR`); `app.model_store.open_model_store` builds the store."""

    model_config = SettingsConfigDict(env_prefix="SWAPCAST_", extra="ignore")

    model_dir: Path = Field(default_factory=default_model_dir)


class PipelineSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SWAPCAST_", extra="ignore")

    # The swap engine (SWAPCAST_ENGINE; the field keeps that name); "auto" is resolved against the model
    # directory when the pipeline is built (app.model_store.resolve_swap_engine).
    engine: SwapEngineChoice = "classic"
    landmark_model: str = "face_mesh_468"
    mouth_mask: float = Field(0.0, ge=0.0, le=1.0)  # keep the target's own mouth: 0 off, 1 lips and inside
    mesh_shape: float = Field(0.0, ge=0.0, le=1.0)  # mesh engine: inner face toward the source's proportions
    swapper_model: str = "inswapper_128"
    recognizer_model: str = "arcface_w600k_r50"
    detector_model: str = "retinaface_mnet025"
    enhancer_model: str | None = None  # e.g. realesr_animevideov3_x2; None = no enhancement
    enhance_blend: float = Field(1.0, ge=0.0, le=1.0)
    detect_size: int = Field(640, ge=128, le=2048)
    detect_threshold: float = Field(0.75, gt=0.0, lt=1.0)
    detect_interval: int = Field(1, ge=1, le=60)
    # Live sessions detect in the background, off the frame's path, every K-th frame (and whenever a face is
    # missed, moves fast or changes look); frames in between are tracked (app.pipeline.live).
    live_detect_interval: int = Field(3, ge=1, le=60)
    # Off by default: on a loaded 2-core machine background results arrived late enough for tracked
    # positions to lag a moving face (measured with bench-server; see README). True: detection off the path.
    live_detect_background: bool = False
    # A swapped face the detector misses is swapped where the tracker predicts it for `hold_frames`, then
    # covered where it was last seen until found again (SWAPCAST_ON_FACE_LOST; app.pipeline.track).
    on_face_lost: FaceLostPolicy = "hold"
    hold_frames: int = Field(4, ge=0, le=60)
    refine_landmarks: bool = True  # second detector pass per face: steadier alignment, ~2 small runs per face
    faces: Literal["all", "largest"] = "all"
    # Identity maps: the cosine similarity a face needs to a person's reference to be that person; None: the
    # embedder's own (app.identity.embedder: dlib 0.92, ArcFace 0.4).
    match_threshold: float | None = Field(None, ge=-1.0, le=1.0)
    color_strength: float = Field(1.0, ge=0.0, le=1.0)
    mask: Literal["auto", "box", "ellipse"] = "auto"
    threads: int | None = Field(None, ge=1)  # per model run; None = all cores
    backend: BackendName = "auto"
    # fp16 and int8 load the variants made by `swapcast engines fp16|int8|build-trt NAME` when present.
    precision: Precision = "fp32"
    triton_url: str = "127.0.0.1:8001"  # gRPC address of the Triton server for backend "triton"
    # Tensors through system shared memory: auto = when triton_url is loopback (the server on this host).
    triton_shm: Literal["auto", "on", "off"] = "auto"

    @property
    def local_backend(self) -> LocalBackend:
        """The backend of the models that run in this process: with Triton, what a local run would load."""
        return "auto" if self.backend == "triton" else self.backend


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
