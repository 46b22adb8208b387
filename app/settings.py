"""Settings from the environment (prefix SWAPCAST_), validated once at start-up. Every SWAPCAST_ variable is
read here (or in app.server.settings), nowhere else."""

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.names import BackendName, FaceLostPolicy, LocalBackend, OcclusionMode, Precision, SwapEngineChoice


def default_model_dir() -> Path:
    """Model files live under the user's cache directory unless SWAPCAST_MODEL_DIR says otherwise."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "swapcast" / "models"


class ModelStoreSettings(BaseSettings):
    """Where the model files are (`SWAPCAST_MODEL_DIR`); `app.model_store.open_model_store` builds the store."""

    model_config = SettingsConfigDict(env_prefix="SWAPCAST_", extra="ignore")

    model_dir: Path = Field(default_factory=default_model_dir, description="Where model files live.")


class PipelineSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SWAPCAST_", extra="ignore")

    # The swap engine (SWAPCAST_ENGINE; the field keeps that name); "auto" is resolved against the model
    # directory when the pipeline is built (app.model_store.resolve_swap_engine).
    engine: SwapEngineChoice = Field(
        "classic",
        description=(
            "Swap engine: auto (inswapper with its weights, else mesh, else classic), mesh, "
            "classic, inswapper or passthrough. Files default to classic, serve to auto."
        ),
    )
    landmark_model: str = Field("face_mesh_468", description="Face landmark model of the mesh engine.")
    mouth_mask: float = Field(
        0.0, ge=0.0, le=1.0, description="Keep the target's own mouth: 0 off, 1 lips and inside (any engine)."
    )
    # Hands in front of a face stay in front (app.pipeline.occlusion). auto by default: on wherever the hand model
    # is in the model store (it costs a few ms per face), without stopping a machine that lacks it from serving.
    occlusion: OcclusionMode = Field(
        "auto",
        description=(
            "Hands in front of a face stay visible: hands (needs the hand model, imported if missing), off, or "
            "auto (hands when the hand model, or failing it the other hand model, is in the model store, else off)."
        ),
    )
    # lite by default: it meets the occlusion targets at about half the full model's cost, which does not fit
    # 6 ms per face on a CPU core (docs/guides/occlusion.md has the figures).
    hand_model: Literal["hand_landmark", "hand_landmark_lite"] = Field(
        "hand_landmark_lite",
        description="Hand model of the occlusion stage: hand_landmark_lite (half the cost) or hand_landmark (full).",
    )
    # 0.15 by default: on the packaged pairs it moves the share of outputs closer to the source from 93% to 96% and
    # keeps the landmark error at 0.060 (0.3: 96% but 0.067); docs/guides/files.md has the figures.
    mesh_shape: float = Field(
        0.15, ge=0.0, le=1.0, description="Mesh engine: pull the inner face toward the source's proportions, 0 to 1."
    )
    swapper_model: str = Field("inswapper_128", description="Swap model of the inswapper engine.")
    recognizer_model: str = Field(
        "arcface_w600k_r50",
        description=(
            "ArcFace recognizer giving the inswapper engine its source embedding (and identity maps their embedder)."
        ),
    )
    detector_model: str = Field("retinaface_mnet025", description="Face detector.")
    enhancer_model: str | None = Field(
        None, description="Face enhancer run after the swap, e.g. realesr_animevideov3_x2; unset: none."
    )
    enhance_blend: float = Field(
        1.0, ge=0.0, le=1.0, description="How much of the enhanced face is blended in, 0 to 1."
    )
    detect_size: int = Field(
        640, ge=128, le=2048, description="Detector input (long side, px) for files and identity photos."
    )
    # The detector's input (longer side) for live video, sessions and ingest streams: a camera's face is large,
    # and 320 found every face of the server benchmark's clip at under half the time of 640 (docs/operations/
    # benchmarks.md). Files and identity photos keep `detect_size`.
    live_detect_size: int = Field(
        320, ge=128, le=2048, description="Detector input (long side, px) for live video: sessions and ingest streams."
    )
    detect_threshold: float = Field(0.75, gt=0.0, lt=1.0, description="Detector score a face needs.")
    detect_interval: int = Field(1, ge=1, le=60, description="Files: detect every K frames, track in between.")
    # Live sessions detect in the background, off the frame's path, every K-th frame (and whenever a face is
    # missed, moves fast or changes look); frames in between are tracked (app.pipeline.live).
    live_detect_interval: int = Field(
        3,
        ge=1,
        le=60,
        description=(
            "Live video: scheduled detection every K frames (and whenever a face is missed, moves fast or changes)."
        ),
    )
    # On by default: scheduled detections of still or drifting faces run off the frame's path; frames with a
    # new, missed or fast face wait for theirs (late results carried forward overshot a face that stopped).
    live_detect_background: bool = Field(
        True, description=("Live video: scheduled detections of still or drifting faces run off the frame's path.")
    )
    # A swapped face the detector misses is swapped where the tracker predicts it for `hold_frames`, then
    # covered where it was last seen until found again (SWAPCAST_ON_FACE_LOST; app.pipeline.track).
    on_face_lost: FaceLostPolicy = Field(
        "hold",
        description=(
            "A swapped face the detector misses: hold (swap it where the tracker predicts, then "
            "cover), cover (pixelate) or pass."
        ),
    )
    hold_frames: int = Field(
        4, ge=0, le=60, description="Frames a lost face is swapped where the tracker predicts it before it is covered."
    )
    refine_landmarks: bool = Field(
        True,
        description=(
            "A second detector pass per face for steadier alignment, about two small runs per "
            "face (off for live video unless set)."
        ),
    )
    faces: Literal["all", "largest"] = Field("all", description="Which faces are swapped: all or largest.")
    # Identity maps: the cosine similarity a face needs to a person's reference to be that person; None: the
    # embedder's own (app.identity.embedder: dlib 0.92, ArcFace 0.4).
    match_threshold: float | None = Field(
        None,
        ge=0.3,  # below 0.3 even ArcFace takes different people for one: strangers would be swapped
        le=1.0,
        description=(
            "Identity maps: the cosine similarity a face needs to be a person, 0.3 to 1; unset: the "
            "embedder's own (dlib 0.92, ArcFace 0.4)."
        ),
    )
    color_strength: float = Field(
        1.0, ge=0.0, le=1.0, description="How far the pasted face's colour is matched to the target, 0 to 1."
    )
    mask: Literal["auto", "box", "ellipse"] = Field(
        "auto", description="Paste-back mask: auto (ellipse for classic, box otherwise), box or ellipse."
    )
    threads: int | None = Field(
        None, ge=1, description="Threads per model run; unset: all cores (serve: 1, as sessions run in parallel)."
    )
    backend: BackendName = Field("auto", description="Where models run: auto, onnxruntime, tensorrt, torch or triton.")
    # fp16 and int8 load the variants made by `swapcast engines fp16|int8|build-trt NAME` when present.
    precision: Precision = Field(
        "fp32",
        description=("Model precision: fp32, fp16 or int8 (the variants `swapcast engines` makes, when present)."),
    )
    triton_url: str = Field("127.0.0.1:8001", description="gRPC address of the Triton server for backend triton.")
    # Tensors through system shared memory: auto = when triton_url is loopback (the server on this host).
    triton_shm: Literal["auto", "on", "off"] = Field(
        "auto",
        description=("Tensors to Triton through system shared memory: auto (when the URL is loopback), on or off."),
    )

    @property
    def local_backend(self) -> LocalBackend:
        """The backend of the models that run in this process: with Triton, what a local run would load."""
        return "auto" if self.backend == "triton" else self.backend


class BatchingSettings(BaseSettings):
    """Knobs of the shared dynamic batchers (live serving), one batcher per model stage; the pipeline
    factory builds them. Defaults come from `swapcast bench-batch`."""

    model_config = SettingsConfigDict(env_prefix="SWAPCAST_BATCH_", extra="ignore")

    detect_max_batch: int = Field(8, ge=1, le=256, description="Largest batch of the detector's batcher.")
    swap_max_batch: int = Field(8, ge=1, le=256, description="Largest batch of the swap model's batcher.")
    enhance_max_batch: int = Field(4, ge=1, le=256, description="Largest batch of the enhancer's batcher.")
    max_delay_ms: float = Field(
        4.0, ge=0.0, le=100.0, description="How long a batcher waits for more items before it runs a batch."
    )
    max_queue: int = Field(64, ge=1, description="Items waiting per batcher.")
    policy: Literal["reject_newest", "drop_stalest"] = Field(
        "drop_stalest", description="When a batcher's queue is full: reject_newest or drop_stalest."
    )
    deadline_ms: float | None = Field(
        250.0, gt=0.0, description="Items older than this are dropped instead of computed; unset: no deadline."
    )


EncoderBackend = Literal["auto", "nvenc", "x264"]
X264Preset = Literal["ultrafast", "superfast", "veryfast", "faster", "fast", "medium"]


def _default_bitrates() -> dict[int, tuple[int, int]]:
    # Frame height -> (min, max) kbit/s. aiortc's own range is 0.5-3 Mbit/s whatever the size; at 720p a
    # streamer's face and hands blur below ~4 Mbit/s (`swapcast bench-encoder` shows PSNR per bitrate).
    return {480: (800, 3000), 720: (1500, 6000), 1080: (3000, 10000)}


class EncoderSettings(BaseSettings):
    """H.264 encoding of live output (WebRTC sessions, WHEP viewers and RTSP; app.media.encoder's
    `EncoderPolicy`), SWAPCAST_ENCODER_*. Defaults come from `swapcast bench-encoder` and `swapcast bench-server`
    on 2 cores (docs/operations/benchmarks.md)."""

    model_config = SettingsConfigDict(env_prefix="SWAPCAST_ENCODER_", extra="ignore")

    # auto: NVENC where FFmpeg can open it (an NVIDIA GPU with its driver), else libx264.
    backend: EncoderBackend = Field(
        "auto", description=("Live H.264 encoder: auto (NVENC where FFmpeg can open it, else libx264), nvenc or x264.")
    )
    x264_preset: X264Preset = Field("superfast", description="libx264 preset of each session's own encode.")
    # The shared encodes (WHEP viewers, RTSP output): one encode feeds many clients and runs beside every
    # session's own on 2 cores; ultrafast keeps it in real time there (tests/server/test_whep.py's latency).
    shared_x264_preset: X264Preset = Field(
        "ultrafast", description="libx264 preset of the shared encodes (WHEP viewers, RTSP output)."
    )
    x264_tune: Literal["zerolatency"] | None = Field(
        "zerolatency", description="libx264 tune; zerolatency adds no look-ahead or B-frames."
    )
    nvenc_preset: Literal["p1", "p2", "p3", "p4", "p5", "p6", "p7"] = Field(
        "p2", description="NVENC preset, p1 (fastest) to p7."
    )
    keyframe_interval_s: float = Field(2.0, gt=0.0, le=60.0, description="Seconds between keyframes.")
    # Frame height -> (min, max) kbit/s; a frame uses the band of the smallest height at least its own (the
    # largest band above that). A stream starts at its band's minimum; the receiver's estimate (REMB) moves the
    # rate up to the maximum, and down to `estimate_floor` of the minimum (a capped or congested link).
    bitrate_kbps: dict[int, tuple[int, int]] = Field(
        default_factory=_default_bitrates,
        description=(
            "Bitrate band (min, max kbit/s) per frame height, as a JSON object: a stream starts at the minimum "
            "and the receiver's estimate moves the rate up to the maximum (down: see estimate_floor)."
        ),
    )
    estimate_floor: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description=(
            "How far below its band's minimum the receiver's estimate may take a stream's rate, as a share of "
            "the minimum (1: never below it)."
        ),
    )
    # GCC's loss-based part on the client's receiver reports (app.media.loss_control): without it a session's
    # return follows the receiver's estimate alone, which overshot a 1.5 Mbit/s cap for 8 s at 720p.
    loss_control: bool = Field(
        True,
        description=(
            "Lower a session's return rate on heavy loss in the client's receiver reports and raise it while "
            "little is lost, under the receiver's estimate; retransmissions count against it (false: the "
            "estimate alone)."
        ),
    )
    keyframe_min_interval_s: float = Field(
        1.0,
        ge=0.0,
        le=10.0,
        description=(
            "Keyframes asked of an encode (a receiver's PLI/FIR, a new RTSP client, a viewer or push joining) "
            "leave it at most once per this many seconds, whoever asks; a request within it is answered when it "
            "ends."
        ),
    )
    # app.media.sender_recovery: without it a plain aiortc client froze up to 5 s at 1% loss each way.
    return_recovery: bool = Field(
        True,
        description=(
            "A session's return and a WHEP viewer's video resend every packet the receiver asks for from a "
            "1024-packet history and, while the receiver reports loss, make it ask again for packets still "
            "missing every 0.1 s; a receiver that cannot ask for packets gets a keyframe every 0.5 s while it "
            "reports loss (false: aiortc's own retransmissions alone)."
        ),
    )
    threads: int = Field(1, ge=0, le=16, description="Threads per encoder; 0: FFmpeg's choice.")

    @field_validator("bitrate_kbps")
    @classmethod
    def _bands(cls, value: dict[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
        if not value:
            raise ValueError("at least one bitrate band is needed")
        for height, (low, high) in value.items():
            if height <= 0 or low <= 0 or high < low:
                raise ValueError(f"band {height}: (min, max) kbit/s must be positive with min <= max")
        return value
