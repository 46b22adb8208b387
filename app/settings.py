"""Settings from the environment (prefix SWAPCAST_), validated once at start-up. Every SWAPCAST_ variable is
read here (or in app.server.settings), nowhere else."""

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
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
    # The detector's input (longer side) for live video, sessions and ingest streams: a camera's face is large,
    # and 320 found every face of the server benchmark's clip at under half the time of 640 (README,
    # Benchmarks). Files and identity photos keep `detect_size`.
    live_detect_size: int = Field(320, ge=128, le=2048)
    detect_threshold: float = Field(0.75, gt=0.0, lt=1.0)
    detect_interval: int = Field(1, ge=1, le=60)
    # Live sessions detect in the background, off the frame's path, every K-th frame (and whenever a face is
    # missed, moves fast or changes look); frames in between are tracked (app.pipeline.live).
    live_detect_interval: int = Field(3, ge=1, le=60)
    # On by default: scheduled detections of still or drifting faces run off the frame's path; frames with a
    # new, missed or fast face wait for theirs (late results carried forward overshot a face that stopped).
    live_detect_background: bool = True
    # A swapped face the detector misses is swapped where the tracker predicts it for `hold_frames`, then
    # covered where it was last seen until found again (SWAPCAST_ON_FACE_LOST; app.pipeline.track).
    on_face_lost: FaceLostPolicy = "hold"
    hold_frames: int = Field(4, ge=0, le=60)
    refine_landmarks: bool = True  # second detector pass per face: steadier alignment, ~2 small runs per face
    faces: Literal["all", "largest"] = "all"
    # Identity maps: the cosine similarity a face needs to a person's reference to be that person; None: the
    # embedder's own (app.identity.embedder: dlib 0.92, ArcFace 0.4).
    match_threshold: float | None = Field(None, ge=0.3, le=1.0)  # cosine similarity; below 0.3 strangers match
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


EncoderBackend = Literal["auto", "nvenc", "x264"]
X264Preset = Literal["ultrafast", "superfast", "veryfast", "faster", "fast", "medium"]


def _default_bitrates() -> dict[int, tuple[int, int]]:
    # Frame height -> (min, max) kbit/s. aiortc's own range is 0.5-3 Mbit/s whatever the size; at 720p a
    # streamer's face and hands blur below ~4 Mbit/s (`swapcast bench-encoder` shows PSNR per bitrate).
    return {480: (800, 3000), 720: (1500, 6000), 1080: (3000, 10000)}


class EncoderSettings(BaseSettings):
    """H.264 encoding of live output (WebRTC sessions, WHEP viewers and RTSP; app.media.encoder's
    `EncoderPolicy`), SWAPCAST_ENCODER_*.
    Defaults come from `swapcast bench-encoder` and `swapcast bench-server` on 2 cores (see README)."""

    model_config = SettingsConfigDict(env_prefix="SWAPCAST_ENCODER_", extra="ignore")

    # auto: NVENC where FFmpeg can open it (an NVIDIA GPU with its driver), else libx264.
    backend: EncoderBackend = "auto"
    x264_preset: X264Preset = "superfast"
    # The shared encodes (WHEP viewers, RTSP output): one encode feeds many clients and runs beside every
    # session's own on 2 cores; ultrafast keeps it in real time there (tests/server/test_whep.py's latency).
    shared_x264_preset: X264Preset = "ultrafast"
    x264_tune: Literal["zerolatency"] | None = "zerolatency"  # no frame look-ahead, no B-frames: no added delay
    nvenc_preset: Literal["p1", "p2", "p3", "p4", "p5", "p6", "p7"] = "p2"
    keyframe_interval_s: float = Field(2.0, gt=0.0, le=60.0)
    # Frame height -> (min, max) kbit/s; a frame uses the band of the smallest height at least its own (the
    # largest band above that). The receiver's estimate (REMB) moves the rate inside its band.
    bitrate_kbps: dict[int, tuple[int, int]] = Field(default_factory=_default_bitrates)
    threads: int = Field(1, ge=0, le=16)  # per encoder; 0 = FFmpeg's choice (all cores)

    @field_validator("bitrate_kbps")
    @classmethod
    def _bands(cls, value: dict[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
        if not value:
            raise ValueError("at least one bitrate band is needed")
        for height, (low, high) in value.items():
            if height <= 0 or low <= 0 or high < low:
                raise ValueError(f"band {height}: (min, max) kbit/s must be positive with min <= max")
        return value
