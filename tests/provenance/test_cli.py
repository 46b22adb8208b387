"""`swapcast swap` writes marked, C2PA-signed files; `swapcast watermark detect` finds the session a file was
issued to; `swapcast provenance verify` accepts the file and refuses a tampered one."""

from pathlib import Path

import pytest

from app.cli import main
from app.media.clips import load_sample, make_motion_clip, write_clip
from app.media.video_file import write_image
from tests.provenance.credentials import make_signer


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory, model_root: Path) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("media")
    source = folder / "astronaut.png"
    write_image(source, load_sample("astronaut"))
    clip = make_motion_clip(load_sample("t1"), size=(640, 360), frames=15, fps=15, seed=2, focus=(500.0, 330.0))
    video = folder / "clip.mp4"
    write_clip(clip, video, audio_tone_hz=None)
    unmarked = folder / "unmarked.mp4"
    write_clip(clip, unmarked, audio_tone_hz=None, crf=23)
    still = folder / "still.png"
    write_image(still, clip.frames[0])
    return {"source": source, "video": video, "unmarked": unmarked, "still": still, **make_signer(folder)}


def swap(media: dict[str, Path], out: Path, *extra: str, target: str = "video") -> int:
    return main(
        ["swap", "--source", str(media["source"]), "--target", str(media[target]), "--output", str(out),
         "--engine", "classic", "--no-progress", *extra]
    )  # fmt: skip


@pytest.mark.slow
def test_swapped_file_is_marked_signed_and_traced_to_its_issue(
    media: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SWAPCAST_C2PA_CERT", str(media["chain"]))
    monkeypatch.setenv("SWAPCAST_C2PA_KEY", str(media["key"]))
    out = tmp_path / "swapped.mp4"
    assert swap(media, out, "--owner", "alice") == 0
    assert "C2PA signed" in capsys.readouterr().out

    assert main(["watermark", "detect", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "payload: " in printed and f"issued to: file {out.resolve()}" in printed
    assert "identity photo:astronaut.png, owner alice," in printed

    assert main(["provenance", "verify", str(out), "--trust-anchors", str(media["ca"])]) == 0
    printed = capsys.readouterr().out
    assert "valid (C2PA state Trusted)" in printed and "face replaced" in printed

    tampered = tmp_path / "tampered.mp4"
    data = bytearray(out.read_bytes())
    data[data.find(b"mdat") + 400] ^= 0xFF
    tampered.write_bytes(bytes(data))
    assert main(["provenance", "verify", str(tampered)]) == 1
    assert "NOT valid" in capsys.readouterr().out


def test_unsigned_and_unmarked_files_say_so(media: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["watermark", "detect", str(media["unmarked"])]) == 1
    assert "no watermark found" in capsys.readouterr().out
    assert main(["provenance", "verify", str(media["unmarked"])]) == 1
    assert "no C2PA manifest" in capsys.readouterr().out


def test_bad_input_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["watermark", "detect", str(tmp_path / "missing.mp4")]) == 2
    assert capsys.readouterr().err.startswith("swapcast: error: file not found")
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"not a video")
    assert main(["watermark", "detect", str(broken)]) == 2
    assert main(["provenance", "verify", str(tmp_path / "missing.jpg")]) == 2


def test_signing_is_refused_for_a_format_c2pa_cannot_carry(
    media: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SWAPCAST_C2PA_CERT", str(media["chain"]))
    monkeypatch.setenv("SWAPCAST_C2PA_KEY", str(media["key"]))
    out = tmp_path / "swapped.mkv"
    assert swap(media, out) == 2
    assert "C2PA cannot be embedded in .mkv" in capsys.readouterr().err
    assert not out.exists()


def test_a_swapped_file_without_owner_belongs_to_the_configured_owner(
    media: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SWAPCAST_OWNER", "carol")
    out = tmp_path / "swapped.png"
    assert swap(media, out, target="still") == 0
    capsys.readouterr()
    assert main(["watermark", "detect", str(out)]) == 0
    assert f"issued to: file {out.resolve()}, identity photo:astronaut.png, owner carol," in capsys.readouterr().out


def test_a_bad_owner_is_one_error_line_and_writes_nothing(
    media: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "swapped.png"
    assert swap(media, out, "--owner", "bad\nname", target="still") == 2
    assert capsys.readouterr().err == "swapcast: error: --owner must not contain control characters\n"
    assert not out.exists()
