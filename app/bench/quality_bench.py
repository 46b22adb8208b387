"""Swap quality as numbers: identity moved to the source, expression and pose kept from the target.

Every face of the sample photos that packages ship becomes a portrait (the face about `face_size` pixels, with
context around it); every ordered pair of different people is a (source, target) pair. Each engine swaps the
source into the target, and dlib (app.bench.face_measure, a model none of the engines uses) measures:

- identity: embedding distance of the output to the source photo and to the target; the share of outputs
  closer to the source, and under dlib's same-person threshold;
- expression and pose: the mean distance of the output's 68 landmarks from the target's, over the target's
  outer-eye distance; eye- and mouth-opening error against the target.

`passthrough` (the target unchanged) is the floor: landmark error 0, identity the target's.
"""

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from app.bench.face_measure import SAME_PERSON, DlibMeasurer, FaceMeasure
from app.media.clips import sample_faces
from app.media.video_file import read_image
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.pipeline import FramePipeline
from app.pipeline.swap import PreparedSource
from app.pipeline.types import Face, Image
from engines.atomic import atomic_path

Box = tuple[int, int, int, int]


@dataclass(frozen=True)
class Portrait:
    name: str
    image: Image
    box: Box  # the face, as our detector placed it


@dataclass
class EngineScore:
    engine: str
    pairs: int = 0
    failed: int = 0  # pairs whose source the engine could not prepare
    distance_to_source: float = 0.0
    distance_to_target: float = 0.0
    closer_to_source: float = 0.0
    same_person_as_source: float = 0.0
    landmark_error: float = 0.0
    eye_opening_error: float = 0.0
    mouth_opening_error: float = 0.0
    ms_per_image: float = 0.0  # the whole image: detection, swap, paste-back (noisy on shared cores)


@dataclass
class QualityReport:
    portraits: list[str]
    pairs: int
    engines: list[EngineScore] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"portraits": self.portraits, "pairs": self.pairs, "engines": [asdict(e) for e in self.engines]}


def _square(face: Face, context: float) -> np.ndarray:
    x0, y0, x1, y1 = (float(v) for v in face.box)
    side = max(x1 - x0, y1 - y0) * context
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    return np.array([cx - side / 2, cy - side / 2, side])


def portraits(detector: RetinaFaceDetector, face_size: int = 160, context: float = 3.0) -> list[Portrait]:
    """One portrait per face of every sample photo on this machine, faces left to right within a photo."""
    found: list[Portrait] = []
    for name, path in sorted(sample_faces().items()):
        image = read_image(path)
        (faces,) = detector.process([image])
        faces = sorted(faces, key=lambda f: float(f.box[0]))
        for index, face in enumerate(faces):
            x, y, side = _square(face, context)
            size = round(face_size * context)
            scale = size / side
            matrix = np.array([[scale, 0.0, -x * scale], [0.0, scale, -y * scale]])
            crop = np.asarray(cv2.warpAffine(image, matrix, (size, size), borderMode=cv2.BORDER_REPLICATE), np.uint8)
            box = np.asarray(face.box, np.float64).reshape(2, 2) @ matrix[:, :2].T + matrix[:, 2]
            label = name if len(faces) == 1 else f"{name}:{index}"
            found.append(Portrait(label, crop, tuple(int(round(v)) for v in box.reshape(-1))))  # type: ignore[arg-type]
    return found


def make_pairs(people: list[Portrait], limit: int | None = None) -> list[tuple[Portrait, Portrait]]:
    """Every ordered pair of different people, spread over sources when limited."""
    pairs = [(s, t) for t in people for s in people if s.name != t.name]
    pairs.sort(key=lambda pair: (people.index(pair[1]) - people.index(pair[0])) % len(people))
    return pairs[:limit] if limit else pairs


@dataclass
class _Measured:
    measure: FaceMeasure
    box: Box


class QualityBench:
    def __init__(self, engines: dict[str, FramePipeline], measurer: DlibMeasurer | None = None) -> None:
        self.engines = engines
        self.measurer = measurer or DlibMeasurer()
        self._measured: dict[str, _Measured] = {}

    def _portrait_measure(self, portrait: Portrait) -> _Measured:
        if portrait.name not in self._measured:
            box = self.measurer.box(portrait.image) or portrait.box
            self._measured[portrait.name] = _Measured(self.measurer.measure(portrait.image, box), box)
        return self._measured[portrait.name]

    def run(
        self,
        pairs: list[tuple[Portrait, Portrait]],
        grid_path: Path | None = None,
        grid_rows: int = 12,
        progress: Callable[[str], None] | None = None,
    ) -> QualityReport:
        names = sorted({p.name for pair in pairs for p in pair})
        report = QualityReport(names, len(pairs))
        outputs: dict[str, list[Image | None]] = {}
        for engine, pipeline in self.engines.items():
            if progress:
                progress(engine)
            score, images = self._score(engine, pipeline, pairs)
            report.engines.append(score)
            outputs[engine] = images
        if grid_path is not None:
            write_grid(grid_path, pairs[:grid_rows], {k: v[:grid_rows] for k, v in outputs.items()})
        return report

    def _score(
        self, engine: str, pipeline: FramePipeline, pairs: list[tuple[Portrait, Portrait]]
    ) -> tuple[EngineScore, list[Image | None]]:
        prepared: dict[str, PreparedSource | None] = {}
        rows: list[dict[str, float]] = []
        images: list[Image | None] = []
        spent = 0.0
        swaps = 0
        for source, target in pairs:
            if source.name not in prepared:
                try:
                    prepared[source.name] = pipeline.prepare_source(source.image)
                except Exception:  # an engine that cannot use this photo scores it as failed
                    prepared[source.name] = None
            ready = prepared[source.name]
            if ready is None:
                images.append(None)
                continue
            started = time.perf_counter()
            out = pipeline.swap_image(target.image, ready).image
            spent += time.perf_counter() - started
            swaps += 1
            images.append(out)
            rows.append(self._compare(source, target, out))
        score = EngineScore(engine, pairs=len(rows), failed=len(pairs) - len(rows))
        if rows:
            for key in rows[0]:
                setattr(score, key, round(float(np.mean([r[key] for r in rows])), 4))
        score.ms_per_image = round(1000.0 * spent / max(swaps, 1), 1)
        return score, images

    def _compare(self, source: Portrait, target: Portrait, out: Image) -> dict[str, float]:
        wanted = self._portrait_measure(target)
        given = self._portrait_measure(source).measure
        got = self.measurer.measure(out, wanted.box)
        to_source = float(np.linalg.norm(got.embedding - given.embedding))
        to_target = float(np.linalg.norm(got.embedding - wanted.measure.embedding))
        error = np.linalg.norm(got.landmarks - wanted.measure.landmarks, axis=1).mean() / wanted.measure.eye_distance
        return {
            "distance_to_source": to_source,
            "distance_to_target": to_target,
            "closer_to_source": float(to_source < to_target),
            "same_person_as_source": float(to_source < SAME_PERSON),
            "landmark_error": float(error),
            "eye_opening_error": abs(got.eye_opening() - wanted.measure.eye_opening()),
            "mouth_opening_error": abs(got.mouth_opening() - wanted.measure.mouth_opening()),
        }


def _tile(image: Image | None, box: Box, size: int) -> Image:
    if image is None:
        return np.full((size, size, 3), 40, np.uint8)
    x0, y0, x1, y1 = box
    side = max(x1 - x0, y1 - y0) * 1.6
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    scale = size / side
    matrix = np.array([[scale, 0.0, size / 2 - cx * scale], [0.0, scale, size / 2 - cy * scale]])
    return np.asarray(cv2.warpAffine(image, matrix, (size, size), borderMode=cv2.BORDER_REPLICATE), np.uint8)


def write_grid(
    path: Path, pairs: list[tuple[Portrait, Portrait]], outputs: dict[str, list[Image | None]], size: int = 128
) -> Path:
    """A PNG with one row per pair: source | target | each engine's output, labelled on top."""
    header = np.full((24, size * (2 + len(outputs)), 3), 255, np.uint8)
    for column, label in enumerate(["source", "target", *outputs]):
        cv2.putText(header, label, (column * size + 4, 17), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (0, 0, 0), 1, cv2.LINE_AA)
    rows = [header]
    for index, (source, target) in enumerate(pairs):
        tiles = [_tile(source.image, source.box, size), _tile(target.image, target.box, size)]
        tiles += [_tile(images[index], target.box, size) for images in outputs.values()]
        rows.append(np.hstack(tiles))
    with atomic_path(Path(path), suffix=".png") as tmp:
        if not cv2.imwrite(str(tmp), np.vstack(rows)):
            raise OSError(f"cannot write {path}")
    return Path(path)
