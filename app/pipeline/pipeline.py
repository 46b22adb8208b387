"""The frame pipeline: detect (or track) → align → swap → enhance → paste-back, batch-first.

Every model stage runs once per call over all the faces of all the frames given; only paste-back works
frame by frame. The same object serves the file CLI, the server and the benchmarks.
"""

from dataclasses import dataclass, field
from typing import Literal

import cv2
import numpy as np

from app.pipeline.align import align_faces
from app.pipeline.calls import DirectCalls, ModelCalls
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.enhance import RealEsrganEnhancer
from app.pipeline.face_choice import FaceChoice, choose_face
from app.pipeline.paste import PasteBack, PasteConfig, PasteItem
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


def select_faces(faces: list[Face], selection: FaceSelection) -> list[Face]:
    if selection == "largest" and faces:
        return [max(faces, key=lambda f: f.area)]
    return faces


def matrix_scale(matrix: np.ndarray) -> float:
    """How many crop pixels one frame pixel becomes under a similarity matrix."""
    return float(np.sqrt(abs(np.linalg.det(matrix[:, :2]))))


class FramePipeline:
    def __init__(
        self,
        detector: RetinaFaceDetector,
        engine: SwapEngine,
        enhancer: RealEsrganEnhancer | None = None,
        config: PipelineConfig | None = None,
        calls: ModelCalls | None = None,
    ) -> None:
        self.detector = detector
        self.engine = engine
        self.enhancer = enhancer
        self.config = config or PipelineConfig()
        self.paster = PasteBack(self.config.paste)
        self.calls: ModelCalls = calls or DirectCalls(detector, engine, enhancer)

    def close(self) -> None:
        self.calls.close()

    def new_stream(self) -> FaceTracker:
        """Per-stream state for video: tracking and detection interval."""
        return FaceTracker(self.config.tracker)

    def prepare_source(self, image: Image, choice: FaceChoice = "largest") -> PreparedSource:
        """Prepare an identity from a source photo: the face `choice` picks (app.pipeline.face_choice)."""
        (faces,) = self.detector.process([image])
        return self.engine.prepare(image, choose_face(faces, choice))

    def locate(
        self, frames: list[Image], tracker: FaceTracker | None, timer: StageTimer, session: str = "default"
    ) -> list[list[Face]]:
        due = list(range(len(frames))) if tracker is None else [i for i in range(len(frames)) if tracker.due_at(i)]
        detected: dict[int, list[Face]] = {}
        if due:
            with timer.stage("detect"):
                found = self.calls.detect([frames[i] for i in due], session)
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
        session: str = "default",
    ) -> list[FrameResult]:
        """Swap `source` into every selected face of `frames`. `session` names the caller for the
        batchers' fairness when several streams share the models."""
        timer = timer or StageTimer()
        located = self.locate(frames, tracker, timer, session)
        chosen = [select_faces(faces, self.config.faces) for faces in located]
        with timer.stage("align"):
            aligned = align_faces(frames, chosen, self.engine.align)
        with timer.stage("swap"):
            swapped = self.calls.swap([SwapItem(a.crop, source) for a in aligned], session)
        if self.enhancer is not None and swapped:
            with timer.stage("enhance"):
                swapped = self.calls.enhance(swapped, session)
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
