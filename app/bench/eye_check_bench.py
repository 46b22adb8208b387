"""What the closed-eye check at identity upload measures and costs, on the sample photos' faces.

Per face (t1.jpg's six, left to right, then the single-face samples): both eyes' lid gaps and whether the upload
would be warned (app.identity.photo_check), and the time of the eye check beside the time of the mesh engine's
`prepare` of the same face (the upload's other model work), both medians and 99th percentiles over `repeats`
runs in the same process. `python -m app.bench.eye_check_bench [--repeats N] [--threads N]` prints one JSON line.
"""

import argparse
import json
from collections.abc import Callable
from functools import partial
from typing import Any

from app.identity.eye_state import load_eye_openness
from app.identity.photo_check import EYES_CLOSED
from app.media.clips import load_sample, sample_faces
from app.model_store import open_model_store
from app.pipeline.detect import DetectorConfig, RetinaFaceDetector
from app.pipeline.landmarks import FaceMeshLandmarker
from app.pipeline.mesh import MeshEngine
from app.pipeline.timing import StageTimer, percentiles_ms
from app.runtime.onnx import OnnxModel


def _time(timer: StageTimer, stage: str, run: Callable[[], object], repeats: int) -> None:
    run()  # first call: session warm-up, not counted
    for _ in range(repeats):
        with timer.stage(stage):
            run()


def measure(repeats: int = 20, threads: int = 1) -> dict[str, Any]:
    store = open_model_store()
    detector = RetinaFaceDetector(
        OnnxModel(store.ensure("retinaface_mnet025"), threads=threads), DetectorConfig(refine_landmarks=True)
    )
    engine = MeshEngine(FaceMeshLandmarker(OnnxModel(store.ensure("face_mesh_468"), threads=threads)))
    eyes = load_eye_openness(store, threads)
    faces: list[dict[str, Any]] = []
    timer = StageTimer()
    names = [name for name in ("t1", "astronaut", "tom_hanks", "grace_hopper") if name in sample_faces()]
    for name in names:
        image = load_sample(name)
        found = sorted(detector.process([image])[0], key=lambda f: float(f.box[0]))
        for index, face in enumerate(found):
            prepared = engine.prepare(image, face)
            texture, mesh = prepared.data["texture"][0], prepared.data["mesh"][0]
            left, right = eyes.measure(texture, mesh)
            faces.append(
                {
                    "face": f"{name}[{index}]" if len(found) > 1 else name,
                    "left_eye": round(left, 3),
                    "right_eye": round(right, 3),
                    "eyes_closed_warning": max(left, right) <= EYES_CLOSED,
                }
            )
            _time(timer, "eye_check", partial(eyes.measure, texture, mesh), repeats)
            _time(timer, "mesh_prepare", partial(engine.prepare, image, face), max(1, repeats // 4))
    eyes.close()
    engine.close()
    detector.model.close()
    return {
        "threshold": EYES_CLOSED,
        "faces": faces,
        "eye_check_ms": percentiles_ms(timer.samples["eye_check"]),
        "mesh_prepare_ms": percentiles_ms(timer.samples["mesh_prepare"]),
        "threads": threads,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    print(json.dumps(measure(args.repeats, args.threads)))


if __name__ == "__main__":
    main()
