"""The frame pipeline: detect (or track) → align → swap → enhance → paste-back, batch-first.

Every model stage runs once per call over all the faces of all the frames given; only paste-back works
frame by frame. The same object serves the file CLI, the server and the benchmarks: the server's stages
are wrapped in shared batchers (`app.pipeline.batching`), the others call the models directly.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import cv2
import numpy as np

from app.pipeline.align import align_faces
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.face_choice import FaceChoice, choose_face
from app.pipeline.paste import PasteBack, PasteConfig, PasteItem
from app.pipeline.stage import DEFAULT_SESSION, Stage
from app.pipeline.swap import PreparedSource, SwapEngine, SwapItem
from app.pipeline.timing import StageTimer
from app.pipeline.track import FaceTracker, TrackerConfig
from app.pipeline.types import AlignedFace, Face, FrameResult, Image

FaceSelection = Literal["all", "largest"]


@dataclass(frozen=True)
class PipelineConfig:
    faces: FaceSelection = "all"
    tracker: TrackerConfig = field(default_factory=TrackerConfig)
    paste: PasteConfig = field(default_factory=PasteConfig)


@dataclass(frozen=True)
class Stages:
    """The model stages frames go through, in order. Each is any `Stage`, possibly wrapped (a shared
    batcher): a new stage is one more entry here and one line in the factory."""

    detect: Stage[Image, list[Face]]
    swap: Stage[SwapItem, Image]
    crops: Sequence[Stage[Image, Image]] = ()  # on each swapped crop, in order (enhancers)

    def all(self) -> list[Stage[Any, Any]]:
        return [self.detect, self.swap, *self.crops]


def select_faces(faces: list[Face], selection: FaceSelection) -> list[Face]:
    if selection == "largest" and faces:
        return [max(faces, key=lambda f: f.area)]
    return faces


def matrix_scale(matrix: np.ndarray) -> float:
    """How many crop pixels one frame pixel becomes under a similarity matrix."""
    return float(np.sqrt(abs(np.linalg.det(matrix[:, :2]))))


class FramePipeline:
    """`detector` and `engine` serve still photos (identities: `prepare_source`); frames go through
    `stages`, by default the same detector and engine called directly, then `crops` (e.g. an enhancer).
    The pipeline owns all of them: `close` closes each stage (a batcher before the stage it wraps), then
    the still-photo detector and the engine (closing twice is harmless)."""

    def __init__(
        self,
        detector: RetinaFaceDetector,
        engine: SwapEngine,
        crops: Sequence[Stage[Image, Image]] = (),
        config: PipelineConfig | None = None,
        stages: Stages | None = None,
    ) -> None:
        if stages is not None and crops:
            raise ValueError("give the crop stages inside `stages`, not beside them")
        self.detector = detector
        self.engine = engine
        self.config = config or PipelineConfig()
        self.paster = PasteBack(self.config.paste)
        self.stages = stages or Stages(detector, engine, tuple(crops))

    def close(self) -> None:
        """Stop the stages' batchers and release every model (idempotent)."""
        for stage in self.stages.all():
            stage.close()
        self.detector.close()
        self.engine.close()

    def new_stream(self) -> FaceTracker:
        """Per-stream state for video: tracking and detection interval."""
        return FaceTracker(self.config.tracker)

    def prepare_source(self, image: Image, choice: FaceChoice = "largest") -> PreparedSource:
        """Prepare an identity from a source photo: the face `choice` picks (app.pipeline.face_choice)."""
        (faces,) = self.detector.process([image])
        return self.engine.prepare(image, choose_face(faces, choice))

    def locate(
        self, frames: list[Image], tracker: FaceTracker | None, timer: StageTimer, session: str = DEFAULT_SESSION
    ) -> list[list[Face]]:
        due = list(range(len(frames))) if tracker is None else [i for i in range(len(frames)) if tracker.due_at(i)]
        detected: dict[int, list[Face]] = {}
        if due:
            with timer.stage("detect"):
                found = self.stages.detect.process([frames[i] for i in due], session=session)
            detected = dict(zip(due, found, strict=True))
        if tracker is None:
            return [detected[i] for i in range(len(frames))]
        with timer.stage("track"):
            return [tracker.update(detected.get(i)) for i in range(len(frames))]

    def process(
        self,
        frames: list[Image],
        source: PreparedSource,
        tracker: FaceTracker | None = None,
        timer: StageTimer | None = None,
        session: str = DEFAULT_SESSION,
    ) -> list[FrameResult]:
        """Swap `source` into every selected face of `frames`. `session` names the caller for the
        batchers' fairness when several streams share the models."""
        timer = timer or StageTimer()
        located = self.locate(frames, tracker, timer, session)
        chosen = [select_faces(faces, self.config.faces) for faces in located]
        with timer.stage("align"):
            aligned = align_faces(frames, chosen, self.engine.align)
        with timer.stage("swap"):
            swapped = self.stages.swap.process([SwapItem(a.crop, source) for a in aligned], session=session)
        for stage in self.stages.crops:
            if swapped:
                with timer.stage(stage.name):
                    swapped = stage.process(swapped, session=session)
        with timer.stage("paste"):
            items: list[list[PasteItem]] = [[] for _ in frames]
            for face, crop in zip(aligned, swapped, strict=True):
                items[face.frame_index].append(self._paste_item(face, crop))
            images = self.paster.process(list(zip(frames, items, strict=True)))
        return [FrameResult(image, faces) for image, faces in zip(images, chosen, strict=True)]

    def _paste_item(self, face: AlignedFace, crop: Image) -> PasteItem:
        """Size the (possibly super-resolved) crop to the face's size in the frame: detail beyond the
        frame's own resolution would only alias when warped down."""
        base = face.crop.shape[0]
        size = crop.shape[0]
        wanted = int(np.clip(round(base / matrix_scale(face.matrix)), base, size))
        if wanted < size:
            crop = np.asarray(cv2.resize(crop, (wanted, wanted), interpolation=cv2.INTER_AREA), np.uint8)
        return PasteItem(crop, face.matrix * (crop.shape[0] / base), face.crop)

    def swap_image(self, image: Image, source: PreparedSource) -> FrameResult:
        return self.process([image], source)[0]
