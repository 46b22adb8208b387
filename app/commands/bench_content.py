"""`swapcast bench content`: the content gate's scores on every sample photo and clip, and its cost."""

import argparse

from app.commands.bench_args import print_report
from app.commands.options import add_output_argument
from app.errors import UserError


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser(
        "content", help="content gate: score distribution on the sample photos and clips, cost; JSON out"
    )
    p.add_argument("--frames", type=int, default=30, help="frames of each motion clip (default 30)")
    p.add_argument("--repeats", type=int, default=20, help="timed runs per cost figure (default 20)")
    add_output_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.bench.content_bench import ContentBenchConfig, run_content_bench
    from app.content.check import load_content_check
    from app.content.settings import ContentSettings
    from app.model_store import open_model_store
    from app.pipeline.detect import DetectorConfig, RetinaFaceDetector
    from app.pipeline.types import Image
    from app.runtime.onnx import OnnxModel

    if args.frames < 1 or args.repeats < 1:
        raise UserError("--frames and --repeats must be at least 1")
    settings = ContentSettings()
    store = open_model_store()
    check = load_content_check(store, settings.threshold, settings.threads, settings.model_file)
    detector = RetinaFaceDetector(OnnxModel(store.ensure("retinaface_mnet025"), threads=1), DetectorConfig())

    def boxes(image: Image) -> list[object]:
        (faces,) = detector.process([image])
        return [face.box for face in faces]

    config = ContentBenchConfig(
        settings.threshold, settings.interval_s, args.frames, args.repeats, unchanged_s=settings.unchanged_s
    )
    try:
        result = run_content_bench(check, config, boxes)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return print_report(result, args.output)
