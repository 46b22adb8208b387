"""Occlusion: a real hand over a real face stays in front of the swapped face (app.pipeline.occlusion)."""

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from app.bench.hand_scene import HandScene, hand_over_face
from app.bench.occlusion_bench import crossing, score
from app.media.clips import make_motion_clip
from app.model_store import hand_model_in_store
from app.pipeline.detect import DetectorConfig, RetinaFaceDetector
from app.pipeline.factory import build_hand_finder
from app.pipeline.occlusion import HandFinder, HandTracking, OcclusionConfig, Points, hand_mask
from app.pipeline.pipeline import FramePipeline
from app.pipeline.swap import ClassicEngine, PreparedSource
from app.pipeline.timing import StageTimer
from app.pipeline.types import Face, Image, Matrix
from app.runtime.onnx import OnnxModel
from app.settings import PipelineSettings
from engines.errors import ModelError
from engines.store import ModelStore

REPO = Path(__file__).resolve().parents[2]

NEAR = 12  # grey levels within which a pixel counts as the input's own


@pytest.fixture(scope="module")
def finder(store: ModelStore) -> Iterator[HandFinder]:
    try:
        path = store.ensure(PipelineSettings().hand_model)
    except ModelError as exc:
        pytest.skip(f"the hand model cannot be imported here: {exc}")
    hands = HandFinder(OnnxModel(path, threads=2))
    yield hands
    hands.close()


@pytest.fixture(scope="module")
def scene() -> HandScene:
    return hand_over_face()


def _swapped(
    detector: RetinaFaceDetector, finder: HandFinder | None, scene: HandScene, source: PreparedSource | None = None
) -> tuple[np.ndarray, PreparedSource]:
    pipeline = FramePipeline(detector, ClassicEngine(), hands=finder)
    source = source or pipeline.prepare_source(scene.face)  # the face itself, unoccluded, as its own source
    return pipeline.swap_image(scene.image, source).image, source


def _near(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a.astype(np.int16) - b.astype(np.int16)).max(axis=2) <= NEAR


def test_hand_pixels_stay_and_the_rest_of_the_face_is_swapped(
    detector: RetinaFaceDetector, finder: HandFinder, scene: HandScene, t1: np.ndarray
) -> None:
    source = FramePipeline(detector, ClassicEngine()).prepare_source(t1)  # another person's face
    off, _ = _swapped(detector, None, scene, source)
    on, _ = _swapped(detector, finder, scene, source)
    painted = ~_near(off, scene.image)  # what the swap changes when nothing is kept
    hand = scene.hand & painted
    assert hand.sum() > 1000, "the swap paints over the hand when occlusion is off"
    kept = _near(on, scene.image)[hand].mean()
    assert kept >= 0.9, f"only {kept:.0%} of the hand's painted-over pixels are kept"
    face = painted & ~scene.hand
    # Away from the hand (beyond its feathered rim) the face is swapped as without occlusion.
    rows, cols = np.nonzero(scene.hand)
    far = face.copy()
    far[max(0, rows.min() - 12) : rows.max() + 12, max(0, cols.min() - 12) : cols.max() + 12] = False
    assert far.sum() > 500
    assert _near(on, off)[far].mean() >= 0.95
    still_swapped = (~_near(on, scene.image))[face].mean()
    assert still_swapped >= 0.6, f"only {still_swapped:.0%} of the face outside the hand is still swapped"


def test_a_face_without_a_hand_is_swapped_as_before(
    detector: RetinaFaceDetector, finder: HandFinder, scene: HandScene
) -> None:
    off, source = _swapped(detector, None, HandScene(scene.face, scene.face, np.zeros_like(scene.hand)))
    on, _ = _swapped(detector, finder, HandScene(scene.face, scene.face, np.zeros_like(scene.hand)), source)
    assert np.array_equal(on, off)


def test_the_hand_is_carried_between_looks(detector: RetinaFaceDetector, finder: HandFinder, scene: HandScene) -> None:
    (face,) = detector.process([scene.image])[0]
    face = type(face)(face.box, face.score, face.landmarks, track_id=7)
    tracking = HandTracking(OcclusionConfig(interval=3))
    empty = HandScene(scene.face, scene.face, np.zeros_like(scene.hand))
    # No hand: looked at on the first frame, then only every `interval` frames while the region stays the same.
    for _ in range(4):
        assert tracking.hands(finder, empty.image, [face]) == [None]
    assert tracking.looks == 2
    # A hand comes in: the region changed, so it is looked at at once, and every frame while the hand is there.
    first = tracking.hands(finder, scene.image, [face])[0]
    assert first is not None and first.shape == (21, 2)
    rows, cols = np.nonzero(scene.hand)
    inside = (cols.min() - 20 <= first[:, 0]) & (first[:, 0] <= cols.max() + 20)
    inside &= (rows.min() - 20 <= first[:, 1]) & (first[:, 1] <= rows.max() + 40)
    assert inside.mean() >= 0.9, "the landmarks lie on the pasted hand"
    assert tracking.hands(finder, scene.image, [face])[0] is not None
    assert tracking.looks == 4


def test_the_setting_picks_the_stage(store: ModelStore, finder: HandFinder, tmp_path: Path) -> None:
    assert build_hand_finder(PipelineSettings(occlusion="off"), store) is None
    on = build_hand_finder(PipelineSettings(occlusion="auto"), store)  # the model is imported in `store`
    assert isinstance(on, HandFinder) and on.model.path.name == "hand_landmark_lite.onnx"
    on.close()
    assert build_hand_finder(PipelineSettings(occlusion="auto"), ModelStore(tmp_path)) is None  # not imported here
    assert PipelineSettings().occlusion == "auto"
    assert PipelineSettings().hand_model == "hand_landmark_lite"


class _Store:
    def __init__(self, verified: set[str]) -> None:
        self.verified = verified

    def status(self, name: str) -> str:
        return "verified" if name in self.verified else "missing"


def test_auto_falls_back_to_the_other_hand_model_in_the_store() -> None:
    lite, full = PipelineSettings(), PipelineSettings(hand_model="hand_landmark")
    both = _Store({"hand_landmark", "hand_landmark_lite"})
    assert hand_model_in_store(lite, both) == "hand_landmark_lite"  # type: ignore[arg-type]
    assert hand_model_in_store(full, both) == "hand_landmark"  # type: ignore[arg-type]
    # A store that holds only the full model (imported before lite was the default) keeps hands in front.
    assert hand_model_in_store(lite, _Store({"hand_landmark"})) == "hand_landmark"  # type: ignore[arg-type]
    assert hand_model_in_store(full, _Store({"hand_landmark_lite"})) == "hand_landmark_lite"  # type: ignore[arg-type]
    assert hand_model_in_store(lite, _Store(set())) is None  # type: ignore[arg-type]


class _Recorder:
    """Stands in for HandFinder: finds nothing, and notes which squares each search looked in."""

    def __init__(self) -> None:
        self.squares: list[tuple[int, ...] | None] = []

    def hands(
        self, frame: Image, faces: list[Face], known: list[Points | None], squares: list[tuple[int, ...] | None]
    ) -> list[Points | None]:
        self.squares.extend(squares)
        return [None] * len(faces)


def test_routine_looks_search_one_square_in_turn_and_a_change_all_of_them(
    detector: RetinaFaceDetector, scene: HandScene
) -> None:
    (face,) = detector.process([scene.face])[0]
    face = Face(face.box, face.score, face.landmarks, track_id=3)
    tracking = HandTracking(OcclusionConfig(interval=3))
    recorder = _Recorder()
    for _ in range(10):
        tracking.hands(recorder, scene.face, [face])  # type: ignore[arg-type]
    # The first look searches every square; then one square every third frame, each in turn.
    assert recorder.squares == [None, (0,), (1,), (0,)]
    tracking.hands(recorder, scene.image, [face])  # type: ignore[arg-type]  # something came in: every square
    assert recorder.squares[-1] is None and tracking.looks == 5
    everything = HandTracking(OcclusionConfig(interval=3, alternate=False))
    recorder = _Recorder()
    for _ in range(4):
        everything.hands(recorder, scene.face, [face])  # type: ignore[arg-type]
    assert recorder.squares == [None, None]


def test_a_moving_camera_calls_for_no_more_than_routine_looks(detector: RetinaFaceDetector, scene: HandScene) -> None:
    """The camera pans, zooms and rolls over a face with no hand near it, fast (one loop in 24 frames). Live, the
    face's box is the last detection's while its five points follow it (app.pipeline.live): the face is looked at
    on the routine schedule only, one square at a time, as if it stood still."""
    (still_face,) = detector.process([scene.face])[0]
    x0, y0, x1, y1 = (float(v) for v in still_face.box)
    clip = make_motion_clip(scene.face, size=(640, 480), frames=24, focus=((x0 + x1) / 2, (y0 + y1) / 2), seed=3)
    (detected,) = detector.process([clip.frames[0]])[0]  # the one detection: its box stays
    tracking = HandTracking(OcclusionConfig(interval=3))
    recorder = _Recorder()
    for frame, matrix in zip(clip.frames, clip.matrices, strict=True):
        points = still_face.landmarks @ matrix[:, :2].T + matrix[:, 2]  # where the face's five points are now
        tracking.hands(recorder, frame, [Face(detected.box, 0.9, points, track_id=1)])  # type: ignore[arg-type]
    assert recorder.squares == [None] + [(k % 2,) for k in range(7)], recorder.squares


def _upright_hand() -> Points:
    """21 landmarks of an open hand, fingers up, its wrist at (100, 150): the model's order, thumb first."""
    hand = [(100.0, 150.0)]
    for finger, x in enumerate((70.0, 85.0, 100.0, 115.0, 130.0)):
        base = 120.0 if finger else 135.0
        hand += [(x, base - 12.0 * step) for step in range(4)]
    return np.array(hand, np.float64)


def test_the_mask_goes_on_past_the_wrist_into_the_forearm() -> None:
    hand, identity = _upright_hand(), np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    plain = hand_mask([hand], identity, 256, OcclusionConfig(forearm=0.0))
    arm = hand_mask([hand], identity, 256, OcclusionConfig())
    reach = float(np.linalg.norm(hand[12] - hand[0]))
    below = (100, round(150 + 0.4 * reach))  # under the wrist, away from the fingers (x, y)
    assert plain[below[1], below[0]] < 0.05 and arm[below[1], below[0]] == 1.0
    palm = float(np.linalg.norm(hand[5] - hand[17]))  # the forearm's width
    beyond = round(150 + 0.5 * reach + palm / 2 + 12)
    assert arm[beyond, 100] < 0.05, "the forearm stops at its length"
    # The hand and fingers above the wrist are drawn as before.
    assert np.array_equal(plain[:110], arm[:110])


def test_a_matrix_moves_the_mask_with_the_crop() -> None:
    hand = _upright_hand()
    shifted: Matrix = np.array([[1.0, 0.0, -20.0], [0.0, 1.0, -10.0]])
    a = hand_mask([hand], np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]), 256, OcclusionConfig())
    b = hand_mask([hand], shifted, 256, OcclusionConfig())
    assert np.allclose(a[10:200, 20:200], b[:190, :180], atol=0.02)


def test_bad_options_are_clear_errors() -> None:
    for command, message in (
        (["bench-stability", "--engines", "inswapper"], "unknown engine 'inswapper'; choose from classic, mesh"),
        (["swap", "--source", "a", "--target", "b", "--output", "c", "--occlusion", "x"], "invalid choice: 'x'"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "app.cli", *command], capture_output=True, text=True, cwd=REPO, check=False
        )
        assert done.returncode != 0 and message in done.stderr and "Traceback" not in done.stderr


def test_a_live_stream_keeps_a_moving_hand(store: ModelStore, finder: HandFinder, t1: np.ndarray) -> None:
    """The live path (background detection, tracker state): the hand crossing the face is kept frame after frame,
    followed by the model on every frame it is there."""

    def own_detector() -> RetinaFaceDetector:  # the pipelines close theirs
        return RetinaFaceDetector(OnnxModel(store.ensure("retinaface_mnet025"), threads=2), DetectorConfig())

    hands = HandFinder(OnnxModel(finder.model.path, threads=2))
    pipeline = FramePipeline(own_detector(), ClassicEngine(), hands=hands)
    plain = FramePipeline(own_detector(), ClassicEngine())
    source = pipeline.prepare_source(t1)
    scenes = crossing(40)[18:30]  # the hand over the face
    live, plain_live = pipeline.new_live_stream(), plain.new_live_stream()
    kept = []
    try:
        for scene in scenes:
            on = pipeline.process_live(scene.image, source, live, StageTimer(), "test").image
            off = plain.process_live(scene.image, source, plain_live, StageTimer(), "test").image
            figures = score(scene, off, on)
            if figures is not None:
                kept.append(figures.hand_kept)
    finally:
        pipeline.close()
        plain.close()
    assert len(kept) >= 8 and float(np.mean(kept)) >= 0.85, kept
    assert live.tracker.hands is not None and live.tracker.hands.looks >= len(kept)
