"""`swapcast bench-stability`: hands kept in front of the face (occlusion) and the swapped face's steadiness
(flicker, landmark jitter, lag), per engine, on clips made from packaged photos."""

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.commands.arguments import comma_list, int_between
from app.errors import UserError

KNOWN = ("classic", "mesh")


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser(
        "bench-stability",
        help="occlusion (a real hand crossing a face: hand kept, IoU, cost) and flicker/jitter/lag per engine",
    )
    p.add_argument("--engines", type=comma_list, default=None, help="comma list of classic, mesh (default both)")
    p.add_argument("--frames", type=int_between(8, 400), default=40, help="frames of the hand-crossing clip")
    p.add_argument(
        "--hand-model",
        choices=("hand_landmark", "hand_landmark_lite"),
        default="hand_landmark",
        help="the occlusion stage's hand model",
    )
    p.add_argument("--no-flicker", action="store_true", help="measure occlusion only")
    p.add_argument("--out", type=Path, default=Path("bench-stability.json"), help="where to write the JSON report")
    p.add_argument("--threads", type=int_between(1, 64), default=None, help="inference threads (default: all cores)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    engines = tuple(args.engines) if args.engines else KNOWN
    unknown = [name for name in engines if name not in KNOWN]
    if unknown:
        raise UserError(f"unknown engine {unknown[0]!r}; choose from {', '.join(KNOWN)}")

    import time

    from app.bench import flicker_bench, occlusion_bench
    from app.media.clips import load_sample
    from app.model_store import open_model_store
    from app.pipeline.factory import build_pipeline
    from app.settings import PipelineSettings
    from engines.atomic import write_bytes_atomic

    store = open_model_store()
    extra: dict[str, Any] = {"threads": args.threads} if args.threads else {}
    report: dict[str, Any] = {"occlusion": {}, "flicker": []}
    for name in engines:
        off = build_pipeline(PipelineSettings(engine=name, faces="largest", occlusion="off", **extra), store)
        hands = {"occlusion": "hands", "hand_model": args.hand_model}
        on = build_pipeline(PipelineSettings(engine=name, faces="largest", **hands, **extra), store)
        try:
            source = off.prepare_source(load_sample("t1"))
            report["occlusion"][name] = {
                "hand_model": args.hand_model,
                **occlusion_bench.run(off, on, source, args.frames),
            }
            if args.no_flicker:
                continue
            (faces,) = off.detector.process([load_sample("astronaut")])
            truth = faces[0].landmarks
            # Only tracked dense landmarks (mesh) are One-Euro smoothed; the others' five points are the tracker's
            # Kalman-filtered ones either way.
            variants = [("one-euro" if name == "mesh" else "kalman", off.config)]
            if name == "mesh":
                variants.append(("raw", replace(off.config, smoothing=None)))
            for label, config in variants:
                off.config = config
                for spec in flicker_bench.CLIPS:
                    row, _ = flicker_bench.run_clip(name, off, source, spec, truth, time.perf_counter)
                    report["flicker"].append({**flicker_bench.rows_as_dicts([row])[0], "landmarks": label})
        finally:
            off.close()
            on.close()
    text = json.dumps(report, indent=2)
    write_bytes_atomic(args.out, (text + "\n").encode("utf-8"))
    print(text)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0
