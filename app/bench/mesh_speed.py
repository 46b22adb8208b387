"""Cost of the mesh engine per face, step by step, with classic measured side by side in the same run.

One face (the astronaut photo, scaled so the face box is ~222 px at 480p and ~329 px at 720p, as in the
figures the targets were set with) in a frame. Per face, mesh with landmarks tracked from the previous frame:
landmarks, align, maps, mask, remap, colour+blend, paste; classic: align, swap (texture + colour), paste.
The two alternate run by run, so a busy shared machine slows both alike: compare the ratio. Whole frames:
`FramePipeline.process` on frames that need no detection (the tracker follows the face).

Times are the calling thread's CPU time (OpenCV and ONNX Runtime on one thread each, so every step runs on
it) and wall time; the load average says how busy the machine was.
"""

import os
import platform
import time
from dataclasses import replace
from typing import Any

import cv2
import numpy as np

from app.media.clips import load_sample
from app.pipeline.align import align_faces
from app.pipeline.detect import DetectorConfig, RetinaFaceDetector
from app.pipeline.landmarks import FaceMeshLandmarker
from app.pipeline.mesh import MeshEngine
from app.pipeline.mesh_track import MeshTracking, mesh_in
from app.pipeline.paste import PasteBack, PasteConfig, PasteItem
from app.pipeline.pipeline import FramePipeline, PipelineConfig
from app.pipeline.swap import ClassicEngine, SwapItem
from app.pipeline.timing import StageTimer, percentiles_ms
from app.pipeline.track import TrackerConfig
from app.pipeline.types import Face, Image
from app.runtime.onnx import OnnxModel
from engines.store import ModelStore

FACE_PX = {"480p": ((640, 480), 222.0), "720p": ((1280, 720), 329.0)}


def cpu_timer() -> StageTimer:
    """Stages timed in the calling thread's CPU time."""
    return StageTimer(clock=time.thread_time)


def face_frame(still: Image, face: Face, size: tuple[int, int], face_px: float) -> Image:
    """`still` scaled so `face`'s box is `face_px` wide, its centre at the frame's centre."""
    scale = face_px / float(face.box[2] - face.box[0])
    centre = face.landmarks.mean(axis=0)
    matrix = np.array([[scale, 0, size[0] / 2 - scale * centre[0]], [0, scale, size[1] / 2 - scale * centre[1]]])
    return np.asarray(cv2.warpAffine(still, matrix, size, borderMode=cv2.BORDER_REFLECT), np.uint8)


def _tracked_config(paste: PasteConfig) -> PipelineConfig:
    return PipelineConfig(tracker=TrackerConfig(detect_interval=10**6), paste=paste)


def run_mesh_speed(store: ModelStore, runs: int = 60) -> dict[str, Any]:
    cv2.setNumThreads(1)
    detector = RetinaFaceDetector(
        OnnxModel(store.ensure("retinaface_mnet025"), threads=1), DetectorConfig(refine_landmarks=True)
    )
    landmarker = FaceMeshLandmarker(OnnxModel(store.ensure("face_mesh_468"), threads=1))
    mesh, classic = MeshEngine(landmarker), ClassicEngine()
    still, source_photo = load_sample("astronaut"), load_sample("tom_hanks")
    (still_face,) = detector.process([still])[0][:1]
    (source_face,) = detector.process([source_photo])[0][:1]
    sources = {"mesh": mesh.prepare(source_photo, source_face), "classic": classic.prepare(source_photo, source_face)}
    # As the factory sets them: mesh blends under its own mask, classic pastes an ellipse and matches colour.
    pasters = {"mesh": PasteBack(PasteConfig(mask="box", color_strength=0.0)), "classic": PasteBack(PasteConfig())}
    out: dict[str, Any] = {}
    load_before = os.getloadavg()
    for label, (size, face_px) in FACE_PX.items():
        frame = face_frame(still, still_face, size, face_px)
        (face,) = detector.process([frame])[0][:1]
        face = replace(face, track_id=0)
        tracking = MeshTracking(landmarker)
        tracking.follow([frame], [[face]])
        timers = {"mesh": cpu_timer(), "classic": cpu_timer()}
        walls: dict[str, list[float]] = {"mesh": [], "classic": []}
        for _ in range(runs):
            timer, wall, cpu = timers["mesh"], time.perf_counter(), time.thread_time()
            with timer.stage("landmarks"):
                ((moved,),), ((found,),) = tracking.follow([frame], [[face]])
            with timer.stage("align"):
                (aligned,) = align_faces([frame], [[moved]], mesh.align)
            assert found is not None
            swapped = mesh.swap_one(aligned.crop, sources["mesh"].data, mesh_in(found, aligned.matrix), timer)
            with timer.stage("paste"):
                pasters["mesh"].paste(frame, [PasteItem(swapped, aligned.matrix, aligned.crop)])
            timer.add("total", time.thread_time() - cpu)
            walls["mesh"].append(time.perf_counter() - wall)

            timer, wall, cpu = timers["classic"], time.perf_counter(), time.thread_time()
            with timer.stage("align"):
                (aligned,) = align_faces([frame], [[face]], classic.align)
            with timer.stage("swap"):
                (swapped,) = classic.process([SwapItem(aligned.crop, sources["classic"])])
            with timer.stage("paste"):
                pasters["classic"].paste(frame, [PasteItem(swapped, aligned.matrix, aligned.crop)])
            timer.add("total", time.thread_time() - cpu)
            walls["classic"].append(time.perf_counter() - wall)
        per_face = {name: {**t.summary(), "wall_total": percentiles_ms(walls[name])} for name, t in timers.items()}
        ratio = per_face["mesh"]["total"]["p50"] / per_face["classic"]["total"]["p50"]
        out[label] = {"face_px": face_px, "per_face": per_face, "mesh_over_classic": round(ratio, 3)}

    # Whole 480p frames, the face followed between detections (no detector on these frames).
    size, face_px = FACE_PX["480p"]
    frame = face_frame(still, still_face, size, face_px)
    whole: dict[str, Any] = {}
    pipelines = {
        "mesh": FramePipeline(detector, mesh, config=_tracked_config(PasteConfig(mask="box", color_strength=0.0))),
        "classic": FramePipeline(detector, classic, config=_tracked_config(PasteConfig())),
    }
    streams = {name: pipeline.new_stream() for name, pipeline in pipelines.items()}
    frame_timers = {name: cpu_timer() for name in pipelines}
    frame_walls: dict[str, list[float]] = {name: [] for name in pipelines}
    for name, pipeline in pipelines.items():
        pipeline.process([frame], sources[name], streams[name])  # the first frame is detected
    for _ in range(runs):
        for name, pipeline in pipelines.items():
            wall, cpu = time.perf_counter(), time.thread_time()
            pipeline.process([frame], sources[name], streams[name], frame_timers[name])
            frame_timers[name].add("total", time.thread_time() - cpu)
            frame_walls[name].append(time.perf_counter() - wall)
    for name in pipelines:
        whole[name] = {**frame_timers[name].summary(), "wall_total": percentiles_ms(frame_walls[name])}
    whole["mesh_over_classic"] = round(whole["mesh"]["total"]["p50"] / whole["classic"]["total"]["p50"], 3)
    out["whole_frame_480p"] = whole
    out["machine"] = {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.machine(),
        "load_average_before": [round(v, 2) for v in load_before],
        "load_average_after": [round(v, 2) for v in os.getloadavg()],
        "runs": runs,
        "clock": "CPU time of the calling thread (one OpenCV and one ONNX Runtime thread); wall_total alongside",
    }
    detector.close()
    landmarker.close()
    return out
