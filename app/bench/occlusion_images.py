"""Before/after images of the occlusion stage for the docs: a hand over a face, swapped with occlusion off and on.

The hand is any RGBA image whose alpha is the hand (its true region); the docs use a public-domain drawing
from Debian's `openclipart-png` (no photographed hand with a licence that allows a derived image ships in a
package we reach; see docs/guides/occlusion.md). It is pasted over the astronaut photo's face
(app.bench.hand_scene) and the face is swapped with the source photo's. Writes three PNGs, each the square
around the face: ``occlusion-input.png``, ``occlusion-off.png``, ``occlusion-on.png``; prints the scene's
figures (app.bench.occlusion_bench.score) as JSON.

    python -m app.bench.occlusion_images --hand HAND.png --source FACE.jpg --out docs/images
"""

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import cv2
import numpy as np

from app.bench.hand_scene import HandCutout, HandScene, paste_hand
from app.bench.occlusion_bench import score
from app.media.clips import load_sample
from app.media.video_file import read_image
from app.model_store import open_model_store
from app.pipeline.factory import build_pipeline
from app.pipeline.types import Image
from app.settings import PipelineSettings
from engines.atomic import atomic_path

CROP = (90, 20, 346, 276)  # x0, y0, x1, y1 of the astronaut photo: her face and the hand, 256 px square
HAND_AT, HAND_WIDTH = (245.0, 170.0), 110.0  # over her mouth and chin, the finger up to her eyes


def cutout_from_rgba(path: Path) -> HandCutout:
    """An RGBA image as a cut-out: its colour, and alpha >= 128 as the hand."""
    rgba = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if rgba is None or rgba.ndim != 3 or rgba.shape[2] != 4:
        raise ValueError(f"{path} is not an image with an alpha channel")
    return HandCutout(np.ascontiguousarray(rgba[..., :3]), rgba[..., 3] >= 128)


def scene(hand: Path) -> HandScene:
    return paste_hand(load_sample("astronaut"), cutout_from_rgba(hand), HAND_AT, HAND_WIDTH)


def _write(path: Path, image: Image) -> None:
    x0, y0, x1, y1 = CROP
    with atomic_path(path, suffix=".png") as tmp:
        if not cv2.imwrite(str(tmp), image[y0:y1, x0:x1], [cv2.IMWRITE_PNG_COMPRESSION, 9]):
            raise OSError(f"cannot write {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hand", type=Path, required=True, help="RGBA image of a hand (alpha: the hand)")
    parser.add_argument("--source", type=Path, required=True, help="photo of the face to swap in")
    parser.add_argument("--engine", default="mesh", choices=("classic", "mesh"))
    parser.add_argument("--out", type=Path, default=Path("docs/images"))
    args = parser.parse_args(argv)

    store = open_model_store()
    made = scene(args.hand)
    outputs: dict[str, Image] = {"input": made.image}
    for mode in ("off", "hands"):
        pipeline = build_pipeline(PipelineSettings(engine=args.engine, faces="largest", occlusion=mode), store)
        try:
            source = pipeline.prepare_source(read_image(args.source))
            outputs["off" if mode == "off" else "on"] = pipeline.swap_image(made.image, source).image
        finally:
            pipeline.close()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, image in outputs.items():
        _write(args.out / f"occlusion-{name}.png", image)
    figures = score(made, outputs["off"], outputs["on"])
    print(json.dumps({"engine": args.engine, **(asdict(figures) if figures else {"hand_over_face": False})}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
