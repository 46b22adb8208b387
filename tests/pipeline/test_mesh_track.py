"""Dense landmarks followed from frame to frame: on a real face moved by a known motion they follow it as
closely as landmarks found on the box tracker's predictions, a lost face asks for a detection, and the
pipeline swaps from the tracked landmarks without a second landmark pass."""

import numpy as np
import pytest

from app.bench.face_lost import count_revealed, face_lost_clip
from app.bench.landmark_tracking import compare
from app.media.clips import MotionClip, load_sample, make_motion_clip
from app.names import FaceLostPolicy
from app.pipeline.detect import DetectorConfig, RetinaFaceDetector
from app.pipeline.landmarks import FaceMeshLandmarker, five_points
from app.pipeline.mesh import MeshEngine
from app.pipeline.mesh_track import MeshTrackConfig, MeshTracking
from app.pipeline.paste import PasteConfig
from app.pipeline.pipeline import FramePipeline, PipelineConfig
from app.pipeline.timing import StageTimer
from app.pipeline.track import FaceTracker, TrackerConfig
from app.pipeline.types import Face, Image
from app.runtime.onnx import OnnxModel
from engines.store import ModelStore


class CountingLandmarker(FaceMeshLandmarker):
    """The real landmark model, counting the crops it is given."""

    crops = 0

    def process(self, crops: list[Image], *, session: str = "") -> list[np.ndarray | None]:  # type: ignore[override]
        self.crops += len(crops)
        return super().process(crops)


@pytest.fixture(scope="module")
def landmarker(store: ModelStore) -> CountingLandmarker:
    return CountingLandmarker(OnnxModel(store.ensure("face_mesh_468"), threads=2))


@pytest.fixture(scope="module")
def small_detector(store: ModelStore) -> RetinaFaceDetector:
    # A 320 canvas for a 320×240 clip: the same detector, four times cheaper than the default 640.
    model = OnnxModel(store.ensure("retinaface_mnet025"), threads=2)
    return RetinaFaceDetector(model, DetectorConfig(size=320, refine_landmarks=True))


@pytest.fixture(scope="module")
def moving_face(small_detector: RetinaFaceDetector, astronaut: Image) -> tuple[MotionClip, list[list[Face]]]:
    (faces,) = small_detector.process([astronaut])
    clip = make_motion_clip(
        astronaut, size=(320, 240), frames=30, pan_px=15, zoom=0.1, rotate_deg=3.0, noise_sigma=8.0, seed=3,
        focus=tuple(faces[0].landmarks.mean(axis=0)),
    )  # fmt: skip
    return clip, small_detector.process(clip.frames)


def test_tracked_landmarks_follow_the_motion_like_fresh_ones(
    landmarker: CountingLandmarker, moving_face: tuple[MotionClip, list[list[Face]]]
) -> None:
    clip, detections = moving_face
    figures = compare(landmarker, clip, detections, detect_interval=3)
    tracked, predicted, fresh = figures["tracked"], figures["predicted"], figures["fresh"]
    assert tracked["frames_with_landmarks"] == len(clip) and tracked["detected_frames"] == 10, figures
    # Measured: error 0.015 tracked, 0.012 predicted, 0.009 fresh; jitter 0.012, 0.013, 0.008 (eye distances).
    assert tracked["error_mean"] <= 0.03 and tracked["error_p95"] <= 0.045, figures
    assert tracked["jitter_mean"] <= 1.3 * predicted["jitter_mean"], figures
    assert tracked["jitter_mean"] <= 2.5 * fresh["jitter_mean"], figures
    # The model frames the face a little differently from the detector: a steady offset, well under the
    # 0.07 landmark error the engine is held to.
    assert tracked["offset_to_fresh"] <= 0.06, figures


def test_a_face_the_model_loses_asks_for_a_detection(
    landmarker: CountingLandmarker, moving_face: tuple[MotionClip, list[list[Face]]]
) -> None:
    clip, detections = moving_face
    tracker = FaceTracker(TrackerConfig(detect_interval=30))
    tracking = MeshTracking(landmarker)
    faces = tracker.update(detections[0])
    _, (meshes,) = tracking.follow([clip.frames[0]], [faces])
    assert meshes[0] is not None and not tracking.collapsed
    faces = tracker.update(None)
    assert not tracker.due()
    blank = np.full_like(clip.frames[1], 90)  # the face is gone (a hand, a cut) while its track lives on
    (moved,), (meshes,) = tracking.follow([blank], [faces])
    assert meshes == [None] and tracking.collapsed
    assert np.array_equal(moved[0].landmarks, faces[0].landmarks)  # the tracker's points serve that frame
    tracker.request_detection()
    assert tracker.due()
    tracker.update(detections[2])
    assert not tracker.due()  # the detection came: back to the schedule


def test_a_new_chain_settles_on_its_own_framing_at_once(
    landmarker: CountingLandmarker, moving_face: tuple[MotionClip, list[list[Face]]]
) -> None:
    """Framed by the detector's points, the model places a face a little off its own framing; a chain that did not
    settle on its first frame slid onto its own framing over the next frames (the swapped face sliding with it)."""
    clip, detections = moving_face
    frame, faces = clip.frames[0], FaceTracker().update(detections[0])

    def first_meshes(settle_passes: int, frames: int) -> list[np.ndarray]:
        tracking = MeshTracking(landmarker, MeshTrackConfig(settle_passes=settle_passes))
        found = [tracking.follow([frame], [faces])[1][0][0] for _ in range(frames)]
        assert all(mesh is not None for mesh in found)
        return [np.asarray(mesh)[:, :2] for mesh in found]

    unsettled = first_meshes(0, 6)
    (settled,) = first_meshes(MeshTrackConfig().settle_passes, 1)
    where_it_goes = unsettled[-1]  # the same frame five times over: the chain on its own framing

    def gap(mesh: np.ndarray) -> float:
        return float(np.linalg.norm(mesh - where_it_goes, axis=1).mean())

    # Measured: 2.07 px unsettled, 0.87 px settled.
    assert gap(settled) < 0.6 * gap(unsettled[0])


def test_the_pipeline_swaps_from_tracked_landmarks_with_one_pass_per_face(
    small_detector: RetinaFaceDetector,
    landmarker: CountingLandmarker,
    moving_face: tuple[MotionClip, list[list[Face]]],
    t1: Image,
) -> None:
    clip, _ = moving_face
    engine = MeshEngine(landmarker)
    pipeline = FramePipeline(small_detector, engine, config=PipelineConfig(tracker=TrackerConfig(detect_interval=3)))
    source = pipeline.prepare_source(t1)
    tracker = pipeline.new_stream()
    timer = StageTimer()
    before = landmarker.crops
    frames = clip.frames[:6]
    results = [pipeline.process([frame], source, tracker, timer)[0] for frame in frames]
    # One pass per face per frame (the engine adds none), and the settling passes on the chain's first frame.
    assert landmarker.crops - before == len(frames) + MeshTrackConfig().settle_passes
    assert len(timer.samples["landmarks"]) == len(frames) and len(timer.samples["detect"]) < len(frames)
    for frame, result in zip(frames, results, strict=True):
        (face,) = result.faces
        x0, y0, x1, y1 = (int(v) for v in face.box)
        assert np.mean(result.image[y0:y1, x0:x1] != frame[y0:y1, x0:x1]) > 0.3
    # The swapped face's five points are the tracked mesh's once smoothed (app.pipeline.smoothing); the chain keeps
    # the raw mesh, which frames the next frame's crop.
    chains, smoother = tracker.landmarks, tracker.smoother
    assert chains is not None and smoother is not None
    track_id = results[-1].faces[0].track_id
    assert np.allclose(five_points(smoother.states[track_id].shown), results[-1].faces[0].landmarks)
    assert not np.allclose(chains._meshes[track_id], smoother.states[track_id].points)


@pytest.mark.slow
def test_hold_and_cover_never_reveal_a_face_the_landmark_model_cannot_find(
    small_detector: RetinaFaceDetector, landmarker: CountingLandmarker, astronaut: Image
) -> None:
    """The face-lost clip (hand, fast motion, turn, exit) with the mesh engine: where the landmark model finds
    the face from neither its previous mesh nor the tracker (under the hand, half out of the frame) the face
    is covered as a lost one. Without landmark tracking the engine leaves such crops as they are."""
    (faces,) = small_detector.process([astronaut])
    clip = face_lost_clip(astronaut, faces[0], size=(320, 240), face_width=75.0)
    source_photo = load_sample("tom_hanks")

    def revealed(policy: FaceLostPolicy, track_landmarks: bool) -> dict[str, object]:
        config = PipelineConfig(
            tracker=TrackerConfig(detect_interval=3, on_face_lost=policy),
            paste=PasteConfig(mask="box", color_strength=0.0),
            track_landmarks=track_landmarks,
        )
        pipeline = FramePipeline(small_detector, MeshEngine(landmarker), config=config)
        source = pipeline.prepare_source(source_photo)
        tracker = pipeline.new_stream()
        return count_revealed(clip, [pipeline.process([frame], source, tracker)[0].image for frame in clip.frames])

    untracked = revealed("hold", False)  # the counting can fail: measured frames 38 and 101
    assert untracked["frames_showing_a_face"] >= 100 and untracked["revealed_frames"] >= 1, untracked
    for policy in ("hold", "cover"):
        counts = revealed(policy, True)
        assert counts["frames_showing_a_face"] >= 100 and counts["revealed_frames"] == 0, (policy, counts)
