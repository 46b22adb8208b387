"""`swapcast demo`: the whole file job on media this machine already has.

It builds a short clip (with a sound track) from insightface's six-person group photo, moving like a
handheld camera, and swaps scikit-image's astronaut into every face. Models come from installed packages
(the detector; the optional enhancer) and the classic engine needs no download at all.
"""

import argparse
import tempfile
from pathlib import Path

from app.commands.arguments import int_between
from app.settings import PipelineSettings


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("demo", help="swap a face into a clip made from real photos, end to end")
    p.add_argument("--output", type=Path, default=Path("swapcast-demo.mp4"), help="where to write the video")
    p.add_argument("--frames", type=int_between(1, 3000), default=75, help="length of the clip in frames (25 fps)")
    p.add_argument("--enhancer", default=None, help="e.g. realesr_animevideov3_x2 (slow on CPU)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.media.clips import load_sample, make_motion_clip, write_clip
    from app.media.video_file import write_image
    from app.model_store import open_model_store
    from app.swap_job import swap_file

    with tempfile.TemporaryDirectory(prefix="swapcast-demo-") as work:
        folder = Path(work)
        source = folder / "astronaut.png"
        write_image(source, load_sample("astronaut"))
        clip = make_motion_clip(
            load_sample("t1"), size=(960, 540), frames=args.frames, fps=25, pan_px=20, zoom=0.08, rotate_deg=2.0
        )
        target = folder / "group.mp4"
        write_clip(clip, target, audio_tone_hz=330.0)
        settings = PipelineSettings(engine="classic", enhancer_model=args.enhancer)
        message = swap_file(source, target, args.output, settings, open_model_store(), progress=not args.no_progress)
    print(message)
    return 0
