"""The frame pipeline: detect (or track) → align → swap → enhance → paste-back, batch-first.

Every model stage runs once per call over all the faces of all the frames given; only paste-back works
frame by frame. The same object serves the file CLI, the server and the benchmarks: the server's stages
are wrapped in shared batchers (`app.pipeline.batching`), the others call the models directly.
"""

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import cv2
import numpy as np

from app.errors import ModelError
from app.pipeline.align import align_faces
from app.pipeline.cover import pixelate
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.face_choice import FaceChoice, choose_face
from app.pipeline.identity_map import PENDING, FaceSources, MappedFaces
from app.pipeline.landmarks import Mesh, five_points
from app.pipeline.live import LiveTracking
from app.pipeline.mesh_track import MeshTracking, TracksLandmarks, eye_distance, mesh_in, unfound_as_lost
from app.pipeline.mouth import KeepsMouth
from app.pipeline.occlusion import HandFinder, HandTracking, Points, hand_mask
from app.pipeline.paste import PasteBack, PasteConfig, PasteItem
from app.pipeline.smoothing import LandmarkSmoother, SmoothingConfig
from app.pipeline.stage import DEFAULT_SESSION, Stage
from app.pipeline.swap import PreparedSource, SwapEngine, SwapItem
from app.pipeline.timing import StageTimer
from app.pipeline.track import FaceTracker, TrackerConfig
from app.pipeline.types import AlignedFace, Face, FrameResult, Image

log = logging.getLogger(__name__)

FaceSelection = Literal["all", "largest"]
# Background detection threads per pipeline: the server's detect stage batches them across sessions.
LIVE_DETECT_WORKERS = 4


@dataclass(frozen=True)
class PipelineConfig:
    faces: FaceSelection = "all"
    tracker: TrackerConfig = field(default_factory=TrackerConfig)
    paste: PasteConfig = field(default_factory=PasteConfig)
    # Live streams (new_live_stream) detect in the background every K-th frame (and whenever a face is
    # missed, moves fast or changes look); 1 detects every frame, still off the frame's path.
    live_detect_interval: int = 3
    live_detect_background: bool = True  # live frames do not wait for scheduled detections (app.pipeline.live)
    # Engines that take dense landmarks (mesh) follow them from each face's previous frame (app.pipeline.mesh_track)
    track_landmarks: bool = True
    # Tracked dense landmarks are One-Euro filtered per face (app.pipeline.smoothing); None: not smoothed
    smoothing: SmoothingConfig | None = field(default_factory=SmoothingConfig)


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
        hands: HandFinder | None = None,
    ) -> None:
        if stages is not None and crops:
            raise ValueError("give the crop stages inside `stages`, not beside them")
        self.detector = detector
        self.engine = engine
        self.config = config or PipelineConfig()
        self.paster = PasteBack(self.config.paste)
        self.stages = stages or Stages(detector, engine, tuple(crops))
        self.hands = hands  # occlusion: hands in front of faces are kept (None: off)
        # Live frames handed on with every face covered because a model could not run (its server away).
        self.covered_for_model_errors = 0
        self._detect_executor: ThreadPoolExecutor | None = None

    def close(self) -> None:
        """Stop the stages' batchers and release every model (idempotent)."""
        if self._detect_executor is not None:
            self._detect_executor.shutdown(wait=True, cancel_futures=True)
            self._detect_executor = None
        for stage in self.stages.all():
            stage.close()
        self.detector.close()
        self.engine.close()
        if self.hands is not None:
            self.hands.close()

    @property
    def mouth_default(self) -> bool | None:
        """Whether streams keep the target's mouth unless they say (the server's setting); None where the engine
        cannot keep it at all (app.pipeline.mouth)."""
        return self.engine.mouth_default if isinstance(self.engine, KeepsMouth) else None

    def new_stream(self) -> FaceTracker:
        """Per-stream state for video: tracking and detection interval."""
        return FaceTracker(self.config.tracker)

    def new_live_stream(self) -> LiveTracking:
        """Per-stream state for live video: tracking, with detection in the background (app.pipeline.live)."""
        if self._detect_executor is None:
            # Named like the server's other pools: its threads stay once started (not per session).
            self._detect_executor = ThreadPoolExecutor(LIVE_DETECT_WORKERS, thread_name_prefix="swapcast-detect")
        tracker = FaceTracker(
            replace(self.config.tracker, detect_interval=self.config.live_detect_interval)
            if self.config.live_detect_background
            else self.config.tracker
        )
        return LiveTracking(tracker, self.stages.detect, self._detect_executor)

    def process_live(
        self, frame: Image, source: FaceSources, live: LiveTracking, timer: StageTimer, session: str
    ) -> FrameResult:
        """One live frame: located without waiting for detection, then swapped like any other (inline
        detection at `tracker.detect_interval` when `live_detect_background` is off)."""
        if not self.config.live_detect_background:
            return self.process([frame], source, live.tracker, timer, session)[0]
        faces = live.locate(frame, timer, session)
        try:
            return self.process([frame], source, live.tracker, timer, session, located=[faces])[0]
        except ModelError as exc:
            # Never reveal: when a model cannot run (its server is away) every face found is covered and the
            # stream goes on, instead of showing the faces or stopping; swapping resumes once the model answers.
            self.covered_for_model_errors += 1
            count = self.covered_for_model_errors
            if count == 1 or count % 100 == 0:
                log.warning("%s: faces covered, the model could not run (%d frames so far): %s", session, count, exc)
            return FrameResult(pixelate(frame, faces), [])

    def prepare_source(self, image: Image, choice: FaceChoice = "largest") -> PreparedSource:
        """Prepare an identity from a source photo: the face `choice` picks (app.pipeline.face_choice)."""
        (faces,) = self.detector.process([image])
        return self.engine.prepare(image, choose_face(faces, choice))

    def locate(
        self, frames: list[Image], tracker: FaceTracker | None, timer: StageTimer, session: str = DEFAULT_SESSION
    ) -> list[list[Face]]:
        if tracker is None:
            due = list(range(len(frames)))
        else:
            due = [i for i in range(len(frames)) if tracker.needs_detection(frames[i], i)]
        detected: dict[int, list[Face]] = {}
        if due:
            with timer.stage("detect"):
                found = self.stages.detect.process([frames[i] for i in due], session=session)
            detected = dict(zip(due, found, strict=True))
        if tracker is None:
            return [detected[i] for i in range(len(frames))]
        with timer.stage("track"):
            located = [tracker.update(detected.get(i)) for i in range(len(frames))]
            tracker.note_looks(frames[-1])
            return located

    def process(
        self,
        frames: list[Image],
        source: FaceSources,
        tracker: FaceTracker | None = None,
        timer: StageTimer | None = None,
        session: str = DEFAULT_SESSION,
        located: list[list[Face]] | None = None,
    ) -> list[FrameResult]:
        """Swap `source` into every selected face of `frames` (with an identity map, each face's own identity;
        faces that match nobody are left as they are). `session` names the caller for the batchers' fairness
        when several streams share the models. `located`: the frames' faces when the caller tracked them
        already (live streams)."""
        timer = timer or StageTimer()
        if located is None:
            located = self.locate(frames, tracker, timer, session)
        chosen = [select_faces([f for f in faces if f.status != "lost"], self.config.faces) for faces in located]
        meshes: list[Mesh | None] | None = None
        landmark_tracking = self._landmark_tracking(tracker)
        if tracker is not None and landmark_tracking is not None:
            with timer.stage("landmarks"):
                chosen, found = landmark_tracking.follow(frames, chosen)
                landmark_tracking.forget_except({face.track_id for faces in located for face in faces})
            if landmark_tracking.collapsed:
                tracker.request_detection()
            if tracker.config.on_face_lost != "pass":
                located, chosen, found = unfound_as_lost(located, chosen, found)
            chosen, found = self._smoothed(tracker, chosen, found)
            meshes = [mesh for frame_meshes in found for mesh in frame_meshes]
        frames, chosen, face_sources, meshes = self._sources(source, frames, chosen, meshes, timer)
        with timer.stage("align"):
            aligned = align_faces(frames, chosen, self.engine.align)
        with timer.stage("swap"):
            tracked = meshes or [None] * len(aligned)  # in the crops' pixels where the landmarks were tracked
            keep_mouth = tracker.keep_mouth if tracker is not None else None
            if tracker is not None:
                tracker.colors.forget_except({face.track_id for faces in located for face in faces})
            swap_items = [
                SwapItem(
                    a.crop,
                    s,
                    None if mesh is None else mesh_in(mesh, a.matrix),
                    keep_mouth,
                    None if tracker is None else tracker.colors.get(a.face.track_id),
                )
                for a, s, mesh in zip(aligned, face_sources, tracked, strict=True)
            ]
            swapped = self.stages.swap.process(swap_items, session=session)
        for stage in self.stages.crops:
            if swapped:
                with timer.stage(stage.name):
                    swapped = stage.process(swapped, session=session)
        hands = self._hands(frames, aligned, tracker, timer)
        with timer.stage("paste"):
            items: list[list[PasteItem]] = [[] for _ in frames]
            if tracker is not None:  # lost faces first: what covers them is from before this batch
                frames = [
                    self._cover_lost(tracker, frame, faces, frame_items)
                    for frame, faces, frame_items in zip(frames, located, items, strict=True)
                ]
            for face, crop, hand in zip(aligned, swapped, hands, strict=True):
                item = self._paste_item(face, crop, hand)
                items[face.frame_index].append(item)
                if tracker is not None:
                    tracker.remember(face.face.track_id, item)
            images = self.paster.process(list(zip(frames, items, strict=True)))
        return [FrameResult(image, faces) for image, faces in zip(images, chosen, strict=True)]

    def _hands(
        self, frames: list[Image], aligned: list[AlignedFace], tracker: FaceTracker | None, timer: StageTimer
    ) -> list[Points | None]:
        """Each aligned face's hand in front of it (None: none, or occlusion off): with a tracker, looked for on
        its schedule and carried between looks (app.pipeline.occlusion.HandTracking); else looked for now."""
        if self.hands is None or not aligned or (tracker is not None and not tracker.occlusion):
            return [None] * len(aligned)
        with timer.stage("occlusion"):
            found: list[Points | None] = []
            for index, frame in enumerate(frames):
                faces = [a.face for a in aligned if a.frame_index == index]
                if not faces:
                    continue
                if tracker is None:
                    found.extend(self.hands.hands(frame, faces, [None] * len(faces)))
                    continue
                if tracker.hands is None:
                    tracker.hands = HandTracking(self.hands.config)
                found.extend(tracker.hands.hands(self.hands, frame, faces))
            return found

    def _smoothed(
        self, tracker: FaceTracker, chosen: list[list[Face]], found: list[list[Mesh | None]]
    ) -> tuple[list[list[Face]], list[list[Mesh | None]]]:
        """The tracked meshes One-Euro filtered per face, and each face's five points taken from its filtered mesh
        (both the crop's framing and the warp follow the smoothed points)."""
        if self.config.smoothing is None:
            return chosen, found
        if tracker.smoother is None:
            tracker.smoother = LandmarkSmoother(self.config.smoothing)
        smoother = tracker.smoother
        out_faces: list[list[Face]] = []
        out_meshes: list[list[Mesh | None]] = []
        for faces, meshes in zip(chosen, found, strict=True):
            frame_faces: list[Face] = []
            frame_meshes: list[Mesh | None] = []
            for face, mesh in zip(faces, meshes, strict=True):
                if mesh is not None:
                    mesh = smoother.smooth(face.track_id, mesh, eye_distance(face.landmarks))
                    face = replace(face, landmarks=five_points(mesh))
                frame_faces.append(face)
                frame_meshes.append(mesh)
            out_faces.append(frame_faces)
            out_meshes.append(frame_meshes)
        smoother.forget_except({face.track_id for faces in chosen for face in faces})
        return out_faces, out_meshes

    def _landmark_tracking(self, tracker: FaceTracker | None) -> MeshTracking | None:
        """The stream's landmark chains, when its engine takes tracked landmarks."""
        if tracker is None or not self.config.track_landmarks or not isinstance(self.engine, TracksLandmarks):
            return None
        if tracker.landmarks is None:
            tracker.landmarks = self.engine.new_landmark_tracking()
        return tracker.landmarks

    @staticmethod
    def _sources(
        source: FaceSources,
        frames: list[Image],
        chosen: list[list[Face]],
        meshes: list[Mesh | None] | None,
        timer: StageTimer,
    ) -> tuple[list[Image], list[list[Face]], list[PreparedSource], list[Mesh | None] | None]:
        """The frames, the faces to swap, what to swap onto each and its tracked landmarks, in `align_faces`' order:
        with an identity map, faces that match nobody are dropped here so they pass through untouched, and faces
        whose match is pending are covered."""
        if not isinstance(source, MappedFaces):
            return frames, chosen, [source] * sum(len(faces) for faces in chosen), meshes
        with timer.stage("identify"):
            per_face = source.sources(frames, chosen)
        flat_meshes: list[Mesh | None] = meshes or [None] * sum(len(faces) for faces in chosen)
        kept: list[list[Face]] = []
        kept_sources: list[PreparedSource] = []
        kept_meshes: list[Mesh | None] = []
        covered: list[list[Face]] = []
        position = 0
        for faces, sources in zip(chosen, per_face, strict=True):
            frame_kept: list[Face] = []
            frame_covered: list[Face] = []
            for face, face_source in zip(faces, sources, strict=True):
                if isinstance(face_source, PreparedSource):
                    frame_kept.append(face)
                    kept_sources.append(face_source)
                    kept_meshes.append(flat_meshes[position])
                elif face_source is PENDING:
                    frame_covered.append(face)
                position += 1
            kept.append(frame_kept)
            covered.append(frame_covered)
        frames = [pixelate(frame, cover) for frame, cover in zip(frames, covered, strict=True)]
        return frames, kept, kept_sources, (kept_meshes if meshes is not None else None)

    def _cover_lost(self, tracker: FaceTracker, frame: Image, faces: list[Face], items: list[PasteItem]) -> Image:
        """Hide each lost face that was being swapped: pixelate its last region and, with `hold`, freeze its
        last swapped look over it (appended to `items`)."""
        policy = tracker.config.on_face_lost
        if policy == "pass":
            return frame
        lost = [(face, tracker.last_pasted(face.track_id)) for face in faces if face.status == "lost"]
        lost_swapped = [(face, item) for face, item in lost if item is not None]
        if policy == "hold":
            items.extend(item for _, item in lost_swapped)
        return pixelate(frame, [face for face, _ in lost_swapped])

    def _paste_item(self, face: AlignedFace, crop: Image, hand: Points | None = None) -> PasteItem:
        """Size the (possibly super-resolved) crop to the face's size in the frame: detail beyond the
        frame's own resolution would only alias when warped down."""
        base = face.crop.shape[0]
        size = crop.shape[0]
        wanted = int(np.clip(round(base / matrix_scale(face.matrix)), base, size))
        if wanted < size:
            crop = np.asarray(cv2.resize(crop, (wanted, wanted), interpolation=cv2.INTER_AREA), np.uint8)
        matrix = face.matrix * (crop.shape[0] / base)
        keep = None
        if hand is not None and self.hands is not None:
            keep = hand_mask([hand], matrix, crop.shape[0], self.hands.config)
        return PasteItem(crop, matrix, face.crop, keep)

    def swap_image(self, image: Image, source: FaceSources) -> FrameResult:
        return self.process([image], source)[0]
