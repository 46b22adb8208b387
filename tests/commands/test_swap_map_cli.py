"""`swapcast swap --map PERSON=FACE`: in insightface's group photo only the person shown in the reference photo
is swapped; everyone else keeps their face (only the invisible watermark, at most 3 grey levels, touches them).
Bad maps end with one error line and no output."""

from pathlib import Path

import numpy as np
import pytest

from app.cli import main
from app.media.clips import load_sample
from app.media.video_file import read_image, write_image
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.types import Image
from tests.server.harness import face_crop

WATERMARK_LEVELS = 3


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory, detector: RetinaFaceDetector, t1: Image) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("map")
    (faces,) = detector.process([t1])
    third = sorted(faces, key=lambda f: float(f.box[0]))[2]
    paths = {"group": folder / "t1.jpg", "me": folder / "me.png", "tom": folder / "tom.png", "sky": folder / "sky.png"}
    write_image(paths["group"], t1)
    write_image(paths["me"], face_crop(t1, third.box))
    write_image(paths["tom"], load_sample("tom_hanks"))
    write_image(paths["sky"], np.full((200, 200, 3), (220, 170, 90), np.uint8))
    return paths


def test_only_the_mapped_person_is_swapped_in_a_file(
    photos: dict[str, Path], detector: RetinaFaceDetector, tmp_path: Path
) -> None:
    out = tmp_path / "only-me.png"
    argv = ["swap", "--map", f"{photos['me']}={photos['tom']}", "--target", str(photos["group"]), "--output", str(out)]
    assert main([*argv, "--engine", "classic", "--no-progress"]) == 0
    before, after = read_image(photos["group"]), read_image(out)
    (faces,) = detector.process([before])
    boxes = [f.box for f in sorted(faces, key=lambda f: float(f.box[0]))]
    moved = np.abs(before.astype(np.int16) - after.astype(np.int16)).max(axis=2) > WATERMARK_LEVELS

    def share_moved(box: np.ndarray) -> float:
        x1, y1, x2, y2 = (int(v) for v in box)
        return float(moved[y1:y2, x1:x2].mean())

    assert share_moved(boxes[2]) > 0.5  # the mapped person
    assert all(share_moved(box) == 0.0 for i, box in enumerate(boxes) if i != 2), [share_moved(b) for b in boxes]


def test_bad_maps_give_one_error_line_and_no_output(
    photos: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.png"
    target = ["--target", str(photos["group"]), "--output", str(out), "--engine", "classic"]
    cases = [
        (["--map", f"{photos['sky']}={photos['tom']}"], "no face"),
        (["--map", f"{photos['me']}={tmp_path / 'nope.png'}"], "not found"),
        (["--source", str(photos["tom"]), "--map", f"{photos['me']}={photos['tom']}"], "either --source or --map"),
        ([], "either --source or --map"),
    ]
    for extra, reason in cases:
        assert main(["swap", *extra, *target]) == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("swapcast: error: ") and reason in lines[0], (extra, lines)
        assert not out.exists()
    with pytest.raises(SystemExit):
        main(["swap", "--map", "no-equals-sign", *target])
    assert "PERSON_PHOTO=FACE_PHOTO" in capsys.readouterr().err
