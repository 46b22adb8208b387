"""`swapcast swap` end to end on real faces, and every bad input refused with one line and no output."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from app.cli import main
from app.media.clips import load_sample, make_motion_clip, write_clip
from app.media.video_file import probe, read_frames, read_image, write_image
from engines.store import ModelStore


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory, model_root: Path) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("media")
    source = folder / "astronaut.png"
    write_image(source, load_sample("astronaut"))
    group = load_sample("t1")
    clip = make_motion_clip(
        group, size=(480, 360), frames=20, fps=25, pan_px=12, zoom=0.05, rotate_deg=2.0, seed=4, focus=(500.0, 330.0)
    )
    video = folder / "clip.mp4"
    write_clip(clip, video, audio_tone_hz=440.0)
    target_image = folder / "t1.jpg"
    write_image(target_image, group)
    return {"source": source, "video": video, "image": target_image, "dir": folder}


@pytest.mark.slow
def test_video_swap_keeps_frames_fps_and_audio(media: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "swapped.mp4"
    code = main(
        ["swap", "--source", str(media["source"]), "--target", str(media["video"]), "--output", str(out),
         "--engine", "classic", "--no-progress"]
    )  # fmt: skip
    assert code == 0
    given, made = probe(media["video"]), probe(out)
    assert made.video_codec == "h264"
    assert (made.width, made.height) == (given.width, given.height)
    assert made.fps == given.fps
    assert made.has_audio and made.audio_codec == given.audio_codec
    before, after = list(read_frames(media["video"])), list(read_frames(out))
    assert len(after) == len(before) == 20
    changed = np.mean([np.abs(a.astype(int) - b.astype(int)).mean() for a, b in zip(before, after, strict=True)])
    assert changed > 1.0, "faces should have been swapped"
    assert not list(tmp_path.glob("*.tmp*")) and sorted(p.name for p in tmp_path.iterdir()) == ["swapped.mp4"]


def test_image_swap_with_inswapper_contract_and_enhancer(media: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "swapped.png"
    code = main(
        ["swap", "--source", str(media["source"]), "--target", str(media["image"]), "--output", str(out),
         "--engine", "inswapper", "--swapper-model", "reference_swapper_narrow",
         "--recognizer-model", "reference_recognizer", "--enhancer", "realesr_animevideov3_x2", "--faces", "largest"]
    )  # fmt: skip
    assert code == 0
    before, after = read_image(media["image"]), read_image(out)
    assert after.shape == before.shape
    # The invisible watermark moves every pixel by at most 3 grey levels; beyond that, one face (the largest)
    # was replaced: a compact region changed, most of the photo did not.
    differs = np.any(np.abs(before.astype(np.int16) - after.astype(np.int16)) > 3, axis=2)
    assert 0.002 < differs.mean() < 0.1


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, timeout=240, check=False
    )


@pytest.mark.parametrize(
    "case",
    ["missing source", "source not an image", "corrupt video", "no face in source", "unknown engine",
     "output directory missing", "output beside a file", "wrong output type"],
)  # fmt: skip
@pytest.mark.slow
def test_bad_input_gives_one_line_and_no_output(case: str, media: dict[str, Path], tmp_path: Path) -> None:
    source, target, out = media["source"], media["video"], tmp_path / "out.mp4"
    extra: list[str] = []
    if case == "missing source":
        source = tmp_path / "nope.png"
    elif case == "source not an image":
        source = tmp_path / "notes.png"
        source.write_text("not an image at all")
    elif case == "corrupt video":
        target = tmp_path / "broken.mp4"
        target.write_bytes(media["video"].read_bytes()[:3000])
    elif case == "no face in source":
        source = tmp_path / "sky.png"
        write_image(source, np.full((256, 256, 3), (220, 170, 90), np.uint8))
    elif case == "unknown engine":
        extra = ["--engine", "deepfake9000"]
    elif case == "output directory missing":
        out = tmp_path / "no" / "such" / "dir" / "out.mp4"
    elif case == "output beside a file":
        blocker = tmp_path / "file"
        blocker.write_text("x")
        out = blocker / "out.mp4"
    elif case == "wrong output type":
        out = tmp_path / "out.png"
    before = set(tmp_path.rglob("*"))
    result = run_cli("swap", "--source", str(source), "--target", str(target), "--output", str(out), *extra)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("swapcast: error: "), result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()
    assert set(tmp_path.rglob("*")) == before, "nothing may be left behind"


def test_mesh_is_the_default_and_the_mouth_mask_keeps_the_target_mouth(
    media: dict[str, Path], tmp_path: Path, store: ModelStore
) -> None:
    from app.pipeline.align import AlignSpec, estimate_matrix, warp_crop
    from app.pipeline.detect import DetectorConfig, RetinaFaceDetector
    from app.pipeline.landmarks import FaceMeshLandmarker
    from app.pipeline.mouth import mouth_region
    from app.runtime.onnx import OnnxModel

    target = tmp_path / "astronaut.png"
    write_image(target, load_sample("astronaut"))
    source = tmp_path / "t1.jpg"
    write_image(source, read_image(media["image"]))
    plain, kept = tmp_path / "plain.png", tmp_path / "kept.png"
    base = ["swap", "--source", str(source), "--target", str(target), "--source-face", "0"]
    assert main([*base, "--output", str(plain)]) == 0  # no --engine: the mesh engine
    assert main([*base, "--output", str(kept), "--mouth-mask", "1"]) == 0
    original, swapped, with_mouth = read_image(target), read_image(plain), read_image(kept)
    # Where the mesh engine changed the lips, the mouth mask gives them back.
    face = RetinaFaceDetector(OnnxModel(store.ensure("retinaface_mnet025"), threads=1), DetectorConfig()).process(
        [original]
    )[0][0]
    spec = AlignSpec("face_mesh", 256)
    matrix = estimate_matrix(face.landmarks, spec)
    crops = [warp_crop(image, matrix, 256) for image in (original, swapped, with_mouth)]
    (mesh,) = FaceMeshLandmarker(OnnxModel(store.ensure("face_mesh_468"), threads=1)).process([crops[0]])
    assert mesh is not None
    lips = mouth_region(mesh, (256, 256)) >= 0.999
    changed = np.abs(crops[1][lips].astype(int) - crops[0][lips].astype(int)).mean()
    left = np.abs(crops[2][lips].astype(int) - crops[0][lips].astype(int)).mean()
    assert changed > 8.0 and left < 0.3 * changed, (changed, left)
    with pytest.raises(SystemExit) as refused:  # out of range: refused while parsing, one error line
        main([*base, "--output", str(tmp_path / "bad.png"), "--mouth-mask", "2"])
    assert refused.value.code != 0
    assert not (tmp_path / "bad.png").exists()
