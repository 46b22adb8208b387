"""Identity maps on real photos: in insightface's group photo (six people) only the mapped people change, each
into their own identity, and every pixel outside their swapped regions stays exactly as it was. Faces are
embedded once per track, and a new map re-matches them without embedding anyone again."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import cv2
import numpy as np
import pytest

from app.identity.embedder import DlibEmbedder, DlibProcessEmbedder
from app.media.clips import load_sample
from app.pipeline.align import estimate_matrix
from app.pipeline.cover import cover_region
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.identity_map import (
    PENDING,
    RECHECK_FRAMES,
    IdentityMap,
    MapEntry,
    MappedFaces,
    mean_embedding,
)
from app.pipeline.pipeline import FramePipeline
from app.pipeline.swap import ClassicEngine, PreparedSource
from app.pipeline.track import FaceTracker
from app.pipeline.types import Face, Image
from tests.server.harness import face_crop


@pytest.fixture(scope="module")
def embedder() -> DlibEmbedder:
    return DlibEmbedder()


@pytest.fixture(scope="module")
def pipeline(detector: RetinaFaceDetector) -> FramePipeline:
    return FramePipeline(detector, ClassicEngine())


@pytest.fixture(scope="module")
def people(detector: RetinaFaceDetector, t1: Image) -> list[Face]:
    (faces,) = detector.process([t1])
    assert len(faces) == 6
    return sorted(faces, key=lambda f: float(f.box[0]))  # left to right


@pytest.fixture(scope="module")
def looks(pipeline: FramePipeline) -> dict[str, PreparedSource]:
    return {name: pipeline.prepare_source(load_sample(name)) for name in ("tom_hanks", "astronaut")}


def reference(embedder: DlibEmbedder, detector: RetinaFaceDetector, t1: Image, face: Face) -> np.ndarray:
    """A "reference photo" of one of the six: their face cut out of the group photo, as a user would upload it."""
    photo = face_crop(t1, face.box)
    (found,) = detector.process([photo])
    return mean_embedding(embedder.embed(photo, [max(found, key=lambda f: f.area)]))


@pytest.fixture(scope="module")
def only_me(
    embedder: DlibEmbedder,
    detector: RetinaFaceDetector,
    t1: Image,
    people: list[Face],
    looks: dict[str, PreparedSource],
) -> IdentityMap:
    """Swap only me: the third person of the group photo (known by their reference photo) becomes Tom Hanks."""
    return IdentityMap(
        (MapEntry("me", "tom", reference(embedder, detector, t1, people[2]), looks["tom_hanks"]),),
        embedder.same_person,
        embedder.key,
    )


@pytest.fixture(scope="module")
def tracked(people: list[Face]) -> list[Face]:
    """The six faces as the tracker hands them over, each with a track of its own."""
    return [Face(f.box, f.score, f.landmarks, track_id=i) for i, f in enumerate(people)]


def swapped_region(pipeline: FramePipeline, frame: Image, face: Face) -> np.ndarray:
    """Where paste-back may write for this face: its aligned crop's square mapped back into the frame."""
    spec = pipeline.engine.align
    inverse = cv2.invertAffineTransform(estimate_matrix(face.landmarks, spec))
    square = np.full((spec.size, spec.size), 255, np.uint8)
    height, width = frame.shape[:2]
    region = cv2.warpAffine(square, inverse, (width, height), flags=cv2.INTER_NEAREST)
    return np.asarray(cv2.dilate(region, np.ones((5, 5), np.uint8)) > 0)


def changed(a: Image, b: Image) -> np.ndarray:
    return np.asarray((a != b).any(axis=2))


def test_only_the_mapped_people_change_each_into_their_own_identity(
    pipeline: FramePipeline,
    detector: RetinaFaceDetector,
    embedder: DlibEmbedder,
    t1: Image,
    people: list[Face],
    looks: dict[str, PreparedSource],
) -> None:
    first, fourth = people[0], people[3]
    entries = (
        MapEntry("ref-a", "tom", reference(embedder, detector, t1, first), looks["tom_hanks"]),
        MapEntry("ref-d", "astronaut", reference(embedder, detector, t1, fourth), looks["astronaut"]),
    )
    mapped = MappedFaces(IdentityMap(entries, embedder.same_person, embedder.key), embedder)

    result = pipeline.process([t1], mapped, pipeline.new_stream())[0]

    swapped_boxes = sorted(float(f.box[0]) for f in result.faces)
    assert swapped_boxes == pytest.approx([float(first.box[0]), float(fourth.box[0])], abs=4.0)
    regions = swapped_region(pipeline, t1, first) | swapped_region(pipeline, t1, fourth)
    diff = changed(result.image, t1)
    assert diff.any()
    assert not (diff & ~regions).any(), f"{int((diff & ~regions).sum())} pixels changed outside the swapped faces"
    for other in (people[1], people[2], people[4], people[5]):  # the four unmapped people, untouched
        x1, y1, x2, y2 = (int(v) for v in other.box)
        inside = np.zeros_like(diff)
        inside[y1:y2, x1:x2] = True
        assert not (diff & inside & ~regions).any()

    # Each mapped face became its own identity: what one identity on every face gives there.
    for face, look in ((first, looks["tom_hanks"]), (fourth, looks["astronaut"])):
        alone = pipeline.process([t1], look)[0].image
        x1, y1, x2, y2 = (int(v) for v in face.box)
        mapped_face = result.image[y1:y2, x1:x2].astype(np.int16)
        assert np.abs(mapped_face - alone[y1:y2, x1:x2]).mean() < 1.0
        assert np.abs(mapped_face - t1[y1:y2, x1:x2]).mean() > 10.0


def test_faces_are_embedded_once_per_track_and_a_new_map_rematches_them(
    pipeline: FramePipeline,
    detector: RetinaFaceDetector,
    embedder: DlibEmbedder,
    t1: Image,
    people: list[Face],
    looks: dict[str, PreparedSource],
    only_me: IdentityMap,
) -> None:
    streamer, guest = people[2], people[5]
    mapped = MappedFaces(only_me, embedder)
    tracker = pipeline.new_stream()
    frames = [np.ascontiguousarray(np.roll(t1, shift, axis=1)) for shift in (0, 2, 4, 6)]
    results = [pipeline.process([frame], mapped, tracker)[0] for frame in frames]
    assert mapped.embedded == 6  # six tracks, each embedded when it started, not on every frame
    for result in results:
        assert len(result.faces) == 1
        assert abs(float(result.faces[0].box[0]) - float(streamer.box[0])) < 12

    # Live change: the guest instead. Same tracks, no new embedding, the other face swapped from the next frame.
    mapped.use_map(
        IdentityMap(
            (MapEntry("guest", "astronaut", reference(embedder, detector, t1, guest), looks["astronaut"]),),
            embedder.same_person,
            embedder.key,
        )
    )
    after = pipeline.process([frames[-1]], mapped, tracker)[0]
    assert mapped.embedded == 6
    assert len(after.faces) == 1 and abs(float(after.faces[0].box[0]) - float(guest.box[0])) < 12


def test_a_face_that_matches_nobody_is_left_as_it_is(
    pipeline: FramePipeline, embedder: DlibEmbedder, t1: Image, looks: dict[str, PreparedSource]
) -> None:
    tom = load_sample("tom_hanks")
    (found,) = pipeline.detector.process([tom])
    stranger = mean_embedding(embedder.embed(tom, found))  # nobody in the group photo
    mapped = MappedFaces(
        IdentityMap((MapEntry("tom", "astronaut", stranger, looks["astronaut"]),), embedder.same_person, embedder.key),
        embedder,
    )
    result = pipeline.process([t1], mapped, FaceTracker())[0]
    assert result.faces == []
    assert np.array_equal(result.image, t1)


def test_unmatched_tracks_are_looked_at_again_now_and_then_one_per_frame(
    embedder: DlibEmbedder, t1: Image, only_me: IdentityMap, tracked: list[Face]
) -> None:
    mapped = MappedFaces(only_me, embedder)
    for _ in range(RECHECK_FRAMES):
        mapped.sources([t1], [tracked])
    assert mapped.embedded == 6
    for extra in range(1, 6):  # the five bystanders, one a frame; the streamer (matched) never again
        mapped.sources([t1], [tracked])
        assert mapped.embedded == 6 + extra
    chosen = mapped.sources([t1], [tracked])[0]
    assert mapped.embedded == 11
    assert [source is not None for source in chosen] == [False, False, True, False, False, False]


def test_live_streams_embed_new_faces_in_the_background_and_cover_them_until_known(
    pipeline: FramePipeline, embedder: DlibEmbedder, t1: Image, people: list[Face], only_me: IdentityMap
) -> None:
    """Six people come into view at once: the frame does not wait for their embeddings; until they arrive every
    face is covered (pixelated: neither shown as itself nor swapped into anyone), then only the mapped person
    is swapped and the others are left exactly as they are."""
    streamer = people[2]
    with ThreadPoolExecutor(1) as executor:
        mapped = MappedFaces(only_me, embedder, executor)
        tracker = pipeline.new_stream()
        first = pipeline.process([t1], mapped, tracker)[0]
        assert first.faces == [] and mapped.embedded == 0  # nobody swapped, nothing embedded on the frame's path
        diff = changed(first.image, t1)
        for face in people:  # every face covered
            x1, y1, x2, y2 = (int(v) for v in face.box)
            assert diff[y1:y2, x1:x2].mean() > 0.5
        covered = np.zeros_like(diff)
        for face in people:
            region = cover_region(face, t1.shape)
            assert region is not None
            x0, y0, x1, y1 = region
            covered[y0:y1, x0:x1] = True
        assert not (diff & ~covered).any(), "pixels changed away from the covered faces"

        executor.submit(lambda: None).result()  # one worker: the embedding job has finished
        after = pipeline.process([t1], mapped, tracker)[0]
        assert mapped.embedded == 6
        assert len(after.faces) == 1 and abs(float(after.faces[0].box[0]) - float(streamer.box[0])) < 12
        diff = changed(after.image, t1)
        assert not (diff & ~swapped_region(pipeline, t1, streamer)).any()


def test_new_faces_seen_while_an_embedding_runs_wait_for_the_next_one(
    embedder: DlibEmbedder, t1: Image, only_me: IdentityMap, tracked: list[Face]
) -> None:
    release = threading.Event()
    with ThreadPoolExecutor(1) as executor:
        executor.submit(release.wait, 30)  # the worker is busy: the stream's first job waits behind this
        mapped = MappedFaces(only_me, embedder, executor)
        assert mapped.sources([t1], [tracked[:2]]) == [[PENDING, PENDING]]
        assert mapped.sources([t1], [tracked]) == [[PENDING] * 6]  # one job at a time: four more wait
        release.set()
        executor.submit(lambda: None).result()
        row = mapped.sources([t1], [tracked])[0]  # the first two are known; the next job starts for the others
        assert mapped.embedded == 2 and row[:2] == [None, None] and row[2:] == [PENDING] * 4
        executor.submit(lambda: None).result()
        row = mapped.sources([t1], [tracked])[0]
        assert mapped.embedded == 6 and [s is not None for s in row] == [False, False, True, False, False, False]


def test_the_servers_dlib_worker_process_gives_the_same_embeddings_without_holding_the_gil(
    embedder: DlibEmbedder, t1: Image, people: list[Face]
) -> None:
    """dlib keeps the GIL while it computes: in a thread it would stall the frames; in its process it does not."""
    remote = DlibProcessEmbedder()
    try:
        here = embedder.embed(t1, people)
        counted = 0
        with ThreadPoolExecutor(1) as pool:
            job = pool.submit(remote.embed, t1, people)
            while not job.done():  # this thread keeps running while the six faces are embedded
                counted += 1
                time.sleep(0.001)
            there = job.result()
    finally:
        remote.close()
    assert counted >= 50  # 6 faces take ~0.5 s; a GIL held throughout would leave this loop a few turns
    for a, b in zip(here, there, strict=True):
        assert float(a @ b) > 0.9999
