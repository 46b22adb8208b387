"""`swapcast swap` under a content policy: a flagged target is refused with one line naming where, nothing written;
without a policy set, the command runs unchecked as before."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.media.clips import MotionClip, load_sample, make_motion_clip, write_clip
from app.media.video_file import write_image
from tests.content.marker import marked


def swap(source: Path, target: Path, out: Path, marker_model: Path | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWAPCAST_CONTENT_")}
    if marker_model is not None:
        env |= {"SWAPCAST_CONTENT_POLICY": "stop", "SWAPCAST_CONTENT_MODEL_FILE": str(marker_model)}
    command = [sys.executable, "-m", "app.cli", "swap", "--source", str(source), "--target", str(target)]
    command += ["--output", str(out), "--engine", "classic", "--no-progress"]
    return subprocess.run(command, capture_output=True, text=True, timeout=240, check=False, env=env)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory, model_root: Path) -> Path:
    path = tmp_path_factory.mktemp("source") / "tom.png"
    write_image(path, load_sample("tom_hanks"))
    return path


def test_a_flagged_video_is_refused_at_its_time_and_nothing_is_written(
    source: Path, marker_model: Path, tmp_path: Path
) -> None:
    clip = make_motion_clip(load_sample("astronaut"), size=(320, 240), frames=30, fps=10, seed=2)
    frames = [marked(f) if i >= 12 else f for i, f in enumerate(clip.frames)]
    target = tmp_path / "clip.mp4"
    write_clip(MotionClip(frames, clip.matrices, clip.fps), target, audio_tone_hz=None)
    out = tmp_path / "out.mp4"
    result = swap(source, target, out, marker_model)
    assert result.returncode != 0
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    # Checked once a second of video (every 10th frame): frames 0 and 10 are clear, frame 20 is the first marked
    # frame checked.
    assert line.startswith("swapcast: error: refused by the content policy: the target at 2.0 s (frame 20)"), line
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["clip.mp4"]


def test_a_flagged_image_or_source_photo_is_refused_and_a_clear_one_is_swapped(
    source: Path, marker_model: Path, tmp_path: Path
) -> None:
    flagged = tmp_path / "flagged.png"
    write_image(flagged, marked(load_sample("astronaut")))
    out = tmp_path / "out.png"
    clear = tmp_path / "clear.png"
    write_image(clear, load_sample("astronaut"))
    refused = swap(source, flagged, out, marker_model)
    assert refused.returncode != 0 and not out.exists()
    (line,) = [line for line in refused.stderr.splitlines() if line.strip()]
    assert line.startswith("swapcast: error: refused by the content policy: the target was flagged"), line
    assert "nothing was written" in line
    flagged_source = swap(flagged, clear, out, marker_model)
    assert flagged_source.returncode != 0 and not out.exists()
    (line,) = [line for line in flagged_source.stderr.splitlines() if line.strip()]
    assert line.startswith("swapcast: error: refused by the content policy: the source photo was flagged"), line
    swapped = swap(source, clear, out, marker_model)
    assert swapped.returncode == 0, swapped.stderr
    assert out.exists()
