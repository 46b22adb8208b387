"""What an identity map costs: embedding a face when its track starts, and matching every frame after.

On the sample photos (insightface's group photo with six faces, the astronaut, Tom Hanks): the embedder's time
per face (`embed_ms_per_face`), the time `MappedFaces` adds to a frame whose six tracks are all new
(`new_tracks_frame_ms`) and to one whose tracks are known (`known_tracks_frame_ms`: matching only), beside the
whole classic-engine frame with one identity on every face (`classic_frame_ms`), measured in the same run.
`worst_frame_ms`: the slowest whole frame (classic engine, tracker, map) from the one where the six appear to the
one after every face's embedding is known, with the faces embedded inline (as files are) and in the background
(as live streams are: dlib in its worker process), side by side; `frames_until_known` counts those frames.
`python -m app.bench.identity_map_bench [--repeats N]` prints one JSON line.
"""

import argparse
import json
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from functools import partial
from typing import Any

import numpy as np

from app.identity.embedder import DlibEmbedder, DlibProcessEmbedder
from app.media.clips import load_sample
from app.model_store import open_model_store
from app.pipeline.detect import DetectorConfig, RetinaFaceDetector
from app.pipeline.identity_map import FaceEmbedder, IdentityMap, MapEntry, MappedFaces
from app.pipeline.pipeline import FramePipeline
from app.pipeline.swap import ClassicEngine
from app.pipeline.timing import call_times
from app.pipeline.types import Face, Image
from app.runtime.onnx import OnnxModel

MAX_FRAMES = 60  # a stream's frames measured at most, after six people appear at once


def _median_ms(run: Callable[[], object], repeats: int) -> float:
    return round(float(np.median(call_times(run, repeats))) * 1000, 2)


def _first_frames(
    pipeline: FramePipeline,
    identity_map: IdentityMap,
    embedder: FaceEmbedder,
    image: Image,
    executor: Executor | None,
) -> tuple[float, int | None]:
    """The slowest frame (ms) of a stream where everyone appears at once, up to the one after every face's
    embedding is known, and that one's number (1-based; None if not within `MAX_FRAMES`)."""
    mapped = MappedFaces(identity_map, embedder, executor)
    tracker = pipeline.new_stream()
    people = len(pipeline.detector.process([image])[0])
    worst, known_at = 0.0, None
    for index in range(1, MAX_FRAMES + 1):
        started = time.perf_counter()
        pipeline.process([image], mapped, tracker)
        worst = max(worst, time.perf_counter() - started)
        if known_at is not None:
            break
        if mapped.embedded >= people:
            known_at = index
    return round(worst * 1000, 2), known_at


def measure(repeats: int = 5, threads: int = 1) -> dict[str, Any]:
    store = open_model_store()
    detector = RetinaFaceDetector(OnnxModel(store.ensure("retinaface_mnet025"), threads=threads), DetectorConfig())
    pipeline = FramePipeline(detector, ClassicEngine())
    embedder = DlibEmbedder()
    group = load_sample("t1")
    (faces,) = detector.process([group])
    singles = {name: load_sample(name) for name in ("astronaut", "tom_hanks")}
    per_face = []
    for image in [group, *singles.values()]:
        (found,) = detector.process([image])
        for face in found:
            per_face.append(_median_ms(partial(embedder.embed, image, [face]), repeats))
    tom = singles["tom_hanks"]
    source = pipeline.prepare_source(tom)
    (tom_face,) = detector.process([tom])[0][:1]
    reference = embedder.embed(tom, [tom_face])[0]
    identity_map = IdentityMap((MapEntry("tom", "tom", reference, source),), embedder.same_person, embedder.key)
    tracked = [Face(f.box, f.score, f.landmarks, track_id=i) for i, f in enumerate(faces)]

    def new_tracks() -> None:
        MappedFaces(identity_map, embedder).sources([group], [tracked])

    known = MappedFaces(identity_map, embedder)
    known.sources([group], [tracked])
    worst: dict[str, list[tuple[float, int | None]]] = {"inline": [], "background": []}
    remote = DlibProcessEmbedder()  # as a server runs it
    with ThreadPoolExecutor(1, thread_name_prefix="embed") as executor:
        for _ in range(repeats):  # interleaved, so both see the same load
            worst["inline"].append(_first_frames(pipeline, identity_map, embedder, group, None))
            worst["background"].append(_first_frames(pipeline, identity_map, remote, group, executor))
    remote.close()
    return {
        "embedder": embedder.key,
        "faces": len(per_face),
        "embed_ms_per_face": {"median": float(np.median(per_face)), "min": min(per_face), "max": max(per_face)},
        "new_tracks_frame_ms": {"faces": len(tracked), "ms": _median_ms(new_tracks, repeats)},
        "known_tracks_frame_ms": _median_ms(lambda: known.sources([group], [tracked]), repeats * 20),
        "classic_frame_ms": _median_ms(lambda: pipeline.process([group], source), repeats),
        "worst_frame_ms": {
            mode: {
                "median": float(np.median([w for w, _ in runs])),
                "max": max(w for w, _ in runs),
                "frames_until_known": [m for _, m in runs],
            }
            for mode, runs in worst.items()
        },
        "threads": threads,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="detector threads (dlib runs on one core)")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.repeats, args.threads)), flush=True)


if __name__ == "__main__":
    main()
