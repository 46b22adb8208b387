"""Video file I/O: probing, streaming transcodes, atomic output, and the test clips themselves."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import av
import cv2
import numpy as np
import numpy.typing as npt
import pytest

from app.errors import UserError
from app.media.clips import MotionClip, load_sample, make_motion_clip, sample_faces, write_clip
from app.media.video_file import probe, read_frames, read_image, transcode, write_image
from app.pipeline.types import Image
from tests.helpers import psnr

ASTRONAUT_FACE = (230.0, 120.0)  # roughly the centre of the face in skimage's astronaut


def identity(batch: list[Image]) -> list[Image]:
    return batch


def frame_times(path: Path) -> list[Fraction]:
    """Presentation time of every video frame, in seconds, as exact fractions."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return [Fraction(f.pts) * stream.time_base for f in container.decode(stream)]


def audio_packets(path: Path) -> list[tuple[int | None, bytes]]:
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        return [(p.pts, bytes(p)) for p in container.demux(stream) if p.size > 0]


def audio_seconds(path: Path) -> float:
    """How long the audio track plays: from time 0 to the end of its last packet."""
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        assert stream.time_base is not None
        end = max(p.pts + p.duration for p in container.demux(stream) if p.size > 0 and p.pts is not None)
        return float(end * stream.time_base)


def leftovers(folder: Path, keep: set[str]) -> set[str]:
    return {name for name in os.listdir(folder) if name not in keep}


@pytest.fixture(scope="module")
def astronaut() -> Image:
    return load_sample("astronaut")


@pytest.fixture(scope="module")
def clip(astronaut: Image) -> MotionClip:
    return make_motion_clip(
        astronaut,
        size=(320, 240),
        frames=60,
        fps=30,
        pan_px=20,
        zoom=0.15,
        rotate_deg=5,
        jitter_px=1.0,
        noise_sigma=2.0,
        seed=7,
        focus=ASTRONAUT_FACE,
    )


@pytest.fixture(scope="module")
def clip_file(clip: MotionClip, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("clips") / "astronaut.mp4"
    write_clip(clip, path, audio_tone_hz=440.0)
    return path


@pytest.fixture(scope="module")
def small_clip(astronaut: Image) -> MotionClip:
    return make_motion_clip(astronaut, size=(160, 120), frames=12, seed=1, focus=ASTRONAUT_FACE)


# --------------------------------------------------------------------------------------------
# probe


def test_probe_describes_the_clip(clip_file: Path) -> None:
    info = probe(clip_file)
    assert (info.width, info.height) == (320, 240)
    assert info.fps == Fraction(30)
    assert info.frames == 60
    assert info.duration == pytest.approx(2.0, abs=0.05)
    assert info.video_codec == "h264"
    assert info.has_audio and info.audio_codec == "aac"
    assert info.audio_rate == 48000


def test_probe_without_audio(small_clip: MotionClip, tmp_path: Path) -> None:
    path = tmp_path / "silent.mkv"
    write_clip(small_clip, path, audio_tone_hz=None)
    info = probe(path)
    assert not info.has_audio and info.audio_codec is None
    assert (info.width, info.height) == (160, 120)


# --------------------------------------------------------------------------------------------
# transcode: the happy paths


def test_identity_transcode_keeps_frames_timing_and_audio(clip: MotionClip, clip_file: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out.mp4"
    stats = transcode(clip_file, dst, identity, batch_size=4, progress=False)
    assert stats.frames == 60
    assert stats.audio_copied and not stats.audio_reencoded
    assert stats.fps > 0 and stats.seconds > 0

    src_info, out_info = probe(clip_file), probe(dst)
    assert out_info.video_codec == "h264"
    assert out_info.frames == 60
    assert out_info.fps == src_info.fps == Fraction(30)
    assert (out_info.width, out_info.height) == (320, 240)
    with av.open(str(dst)) as container:
        assert container.streams.video[0].codec_context.pix_fmt == "yuv420p"

    # Same presentation times, frame for frame.
    assert frame_times(dst) == frame_times(clip_file)

    # The audio went across untouched: same packets, same timestamps, same length.
    assert out_info.has_audio and out_info.audio_codec == src_info.audio_codec
    assert audio_packets(dst) == audio_packets(clip_file)
    assert audio_seconds(dst) == pytest.approx(2.0, abs=0.05)

    # Two lossy encodes later the pictures are still those of the clip.
    decoded = list(read_frames(dst))
    assert len(decoded) == len(clip.frames)
    scores = [psnr(a, b) for a, b in zip(decoded, clip.frames, strict=True)]
    assert min(scores) > 30.0, scores


def test_the_output_holds_what_process_returned(clip_file: Path, tmp_path: Path) -> None:
    seen: list[int] = []
    sources: list[Image] = []

    def invert(batch: list[Image]) -> list[Image]:
        seen.append(len(batch))
        sources.extend(f.copy() for f in batch)
        return [255 - f for f in batch]

    dst = tmp_path / "inverted.mp4"
    stats = transcode(clip_file, dst, invert, batch_size=7, progress=False)
    assert stats.frames == 60
    assert all(1 <= n <= 7 for n in seen) and sum(seen) == 60
    assert seen[:-1] == [7] * (len(seen) - 1)
    # `process` saw the input frames in order ...
    decoded_src = list(read_frames(clip_file))
    assert all(np.array_equal(a, b) for a, b in zip(sources, decoded_src, strict=True))
    # ... and the file holds its output.
    out = list(read_frames(dst))
    assert len(out) == 60
    assert min(psnr(o, 255 - s) for o, s in zip(out, decoded_src, strict=True)) > 35.0


def test_clip_without_audio_transcodes(small_clip: MotionClip, tmp_path: Path) -> None:
    src = tmp_path / "silent.mp4"
    write_clip(small_clip, src, audio_tone_hz=None)
    dst = tmp_path / "silent-out.mkv"
    stats = transcode(src, dst, identity, batch_size=5, progress=False)
    assert stats.frames == 12 and not stats.audio_copied and not stats.audio_reencoded
    info = probe(dst)
    assert not info.has_audio and info.video_codec == "h264"
    assert len(list(read_frames(dst))) == 12
    # Matroska counts time in milliseconds.
    times = zip(frame_times(dst), frame_times(src), strict=True)
    assert all(abs(a - b) <= Fraction(1, 2000) for a, b in times)


def test_variable_frame_timing_is_kept(small_clip: MotionClip, tmp_path: Path) -> None:
    # Frames at uneven times, as a phone's variable-rate recording has them.
    src = tmp_path / "vfr.mp4"
    pts = [0, 1, 2, 4, 5, 8, 9, 10, 13, 14, 15, 17]
    with av.open(str(src), "w") as out:
        stream = out.add_stream("libx264", rate=30)
        stream.width, stream.height = small_clip.size
        stream.pix_fmt = "yuv420p"
        stream.codec_context.time_base = Fraction(1, 30)
        for image, t in zip(small_clip.frames, pts, strict=True):
            frame = av.VideoFrame.from_ndarray(image, format="bgr24")
            frame.pts, frame.time_base = t, Fraction(1, 30)
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    assert frame_times(src) == [Fraction(t, 30) for t in pts]
    dst = tmp_path / "vfr-out.mp4"
    assert transcode(src, dst, identity, progress=False).frames == 12
    assert frame_times(dst) == [Fraction(t, 30) for t in pts]


def test_audio_the_container_cannot_hold_is_reencoded(
    small_clip: MotionClip, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = tmp_path / "mulaw.mov"
    write_clip(small_clip, src, audio_codec="pcm_mulaw", audio_rate=8000)
    assert probe(src).audio_codec == "pcm_mulaw"
    dst = tmp_path / "mulaw.mp4"
    with caplog.at_level(logging.WARNING, logger="app.media.video_file"):
        stats = transcode(src, dst, identity, progress=False)
    assert stats.audio_reencoded and not stats.audio_copied
    assert "re-encoding the audio to AAC" in caplog.text
    info = probe(dst)
    assert info.audio_codec == "aac" and info.frames == 12
    assert audio_seconds(dst) == pytest.approx(small_clip.duration, abs=0.05)


def test_audio_refused_only_when_the_header_is_written_is_reencoded(small_clip: MotionClip, tmp_path: Path) -> None:
    # FFmpeg lists FLAC as fine for MOV but then refuses it when writing the header.
    src = tmp_path / "flac.mkv"
    write_clip(small_clip, src, audio_codec="flac")
    dst = tmp_path / "flac.mov"
    stats = transcode(src, dst, identity, progress=False)
    assert stats.audio_reencoded
    assert probe(dst).audio_codec == "aac"
    assert len(list(read_frames(dst))) == 12


def test_odd_sizes_are_padded_to_even(astronaut: Image, tmp_path: Path) -> None:
    odd = make_motion_clip(astronaut, size=(161, 121), frames=6, seed=2, focus=ASTRONAUT_FACE)
    src = tmp_path / "odd.mp4"
    write_clip(odd, src, pix_fmt="yuv444p", audio_tone_hz=None)
    assert (probe(src).width, probe(src).height) == (161, 121)
    dst = tmp_path / "odd-out.mp4"
    stats = transcode(src, dst, identity, progress=False)
    assert (stats.width, stats.height) == (162, 122)
    out = list(read_frames(dst))
    assert len(out) == 6 and out[0].shape == (122, 162, 3)
    assert min(psnr(o[:121, :161], f) for o, f in zip(out, odd.frames, strict=True)) > 30.0
    # The added column repeats the last one.
    assert np.abs(out[0][:121, 161].astype(int) - out[0][:121, 160].astype(int)).mean() < 4


# --------------------------------------------------------------------------------------------
# transcode: failures leave nothing behind


@pytest.mark.parametrize("error", [RuntimeError("model crashed"), KeyboardInterrupt()])
def test_failure_inside_process_leaves_no_output(clip_file: Path, tmp_path: Path, error: BaseException) -> None:
    calls = 0

    def fail_halfway(batch: list[Image]) -> list[Image]:
        nonlocal calls
        calls += 1
        if calls == 8:  # 4 frames a batch: frame 28 of 60
            raise error
        return batch

    dst = tmp_path / "out.mp4"
    with pytest.raises(type(error)):
        transcode(clip_file, dst, fail_halfway, batch_size=4, progress=False)
    assert calls == 8
    assert not dst.exists()
    assert os.listdir(tmp_path) == []


def test_process_returning_the_wrong_number_of_frames_fails(clip_file: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out.mp4"
    with pytest.raises(ValueError, match="returned 3 frames for a batch of 4"):
        transcode(clip_file, dst, lambda b: b[:3], batch_size=4, progress=False)
    assert os.listdir(tmp_path) == []


def test_an_existing_destination_survives_a_failed_run(clip_file: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out.mp4"
    dst.write_bytes(b"previous result")

    def boom(batch: list[Image]) -> list[Image]:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        transcode(clip_file, dst, boom, progress=False)
    assert dst.read_bytes() == b"previous result"
    assert os.listdir(tmp_path) == ["out.mp4"]


def _corrupt_inputs(clip_file: Path, small_clip: MotionClip, folder: Path) -> dict[str, Path]:
    data = clip_file.read_bytes()
    faststart = folder / "faststart-source.mp4"
    write_clip(small_clip, faststart, faststart=True)
    fs_data = faststart.read_bytes()
    faststart.unlink()
    files = {
        "truncated": data[: len(data) // 2],
        "truncated-index-first": fs_data[: int(len(fs_data) * 0.8)],
        "random-bytes": np.random.default_rng(0).integers(0, 256, 40_000, dtype=np.uint8).tobytes(),
        "text": b"this is a shopping list, not a video\n" * 20,
        "empty": b"",
    }
    paths = {}
    for name, payload in files.items():
        path = folder / f"{name}.mp4"
        path.write_bytes(payload)
        paths[name] = path
    return paths


@pytest.mark.parametrize("kind", ["truncated", "truncated-index-first", "random-bytes", "text", "empty"])
def test_corrupt_input_is_a_user_error(kind: str, clip_file: Path, small_clip: MotionClip, tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    outputs = tmp_path / "out"
    inputs.mkdir()
    outputs.mkdir()
    src = _corrupt_inputs(clip_file, small_clip, inputs)[kind]
    called = False

    def process(batch: list[Image]) -> list[Image]:
        nonlocal called
        called = True
        return batch

    with pytest.raises(UserError) as probed:
        probe(src)
    with pytest.raises(UserError) as excinfo:
        transcode(src, outputs / "out.mp4", process, progress=False)
    for message in (str(probed.value), str(excinfo.value)):
        assert src.name in message and "\n" not in message
    assert any(word in str(excinfo.value) for word in ("corrupt", "truncated", "empty", "not a video"))
    assert not called
    assert os.listdir(outputs) == []


def test_missing_input_is_a_user_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.mp4"
    with pytest.raises(UserError, match="not found"):
        probe(missing)
    with pytest.raises(UserError, match="not found"):
        transcode(missing, tmp_path / "out.mp4", identity, progress=False)
    with pytest.raises(UserError, match="not a regular file"):
        probe(tmp_path)
    assert os.listdir(tmp_path) == []


def _unwritable_dirs(tmp_path: Path) -> list[Path]:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    dirs = [tmp_path / "no" / "such" / "dir", blocker]
    if Path("/proc/self").is_dir():
        dirs.append(Path("/proc"))  # refuses new files even to root
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        dirs.append(locked)
    return dirs


def test_unwritable_destination_fails_before_any_work(clip_file: Path, tmp_path: Path) -> None:
    called = False

    def process(batch: list[Image]) -> list[Image]:
        nonlocal called
        called = True
        return batch

    for folder in _unwritable_dirs(tmp_path):
        with pytest.raises(UserError) as excinfo:
            transcode(clip_file, folder / "out.mp4", process, progress=False)
        assert "\n" not in str(excinfo.value)
        assert not called
    with pytest.raises(UserError, match="output path is a directory"):
        transcode(clip_file, tmp_path, process, progress=False)
    with pytest.raises(UserError, match="output format"):
        transcode(clip_file, tmp_path / "out.xyz", process, progress=False)
    assert not called


# --------------------------------------------------------------------------------------------
# still images


def test_image_round_trip_with_unicode_path(astronaut: Image, tmp_path: Path) -> None:
    path = tmp_path / "visage été 顔.png"
    write_image(path, astronaut)
    assert np.array_equal(read_image(path), astronaut)
    jpeg = tmp_path / "rostro.jpg"
    write_image(jpeg, astronaut)
    assert psnr(read_image(jpeg), astronaut) > 30
    assert sorted(os.listdir(tmp_path)) == sorted(["visage été 顔.png", "rostro.jpg"])


def test_bad_images_are_user_errors(astronaut: Image, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found"):
        read_image(tmp_path / "missing.png")
    text = tmp_path / "notes.png"
    text.write_text("not an image at all")
    with pytest.raises(UserError, match="not an image"):
        read_image(text)
    good = tmp_path / "good.jpg"
    write_image(good, astronaut)
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(UserError, match="corrupt"):
        read_image(cut)
    with pytest.raises(UserError, match="output directory does not exist"):
        write_image(tmp_path / "none" / "x.png", astronaut)
    with pytest.raises(UserError, match="image format"):
        write_image(tmp_path / "x.unknown", astronaut)


# --------------------------------------------------------------------------------------------
# the clips themselves


def test_sample_faces_are_real_images() -> None:
    faces = sample_faces()
    assert {"t1", "tom_hanks", "astronaut"} <= set(faces)
    shapes = {name: read_image(path).shape for name, path in faces.items()}
    assert shapes["astronaut"] == (512, 512, 3)
    assert shapes["t1"][0] > 500 and shapes["t1"][1] > 1000
    assert shapes["tom_hanks"][2] == 3


def test_motion_clip_is_deterministic_and_moves(astronaut: Image) -> None:
    a = make_motion_clip(astronaut, size=(160, 120), frames=8, jitter_px=1.5, noise_sigma=3.0, seed=4)
    b = make_motion_clip(astronaut, size=(160, 120), frames=8, jitter_px=1.5, noise_sigma=3.0, seed=4)
    c = make_motion_clip(astronaut, size=(160, 120), frames=8, jitter_px=1.5, noise_sigma=3.0, seed=5)
    assert all(np.array_equal(x, y) for x, y in zip(a.frames, b.frames, strict=True))
    assert all(np.array_equal(x, y) for x, y in zip(a.matrices, b.matrices, strict=True))
    assert not np.allclose(a.matrices[3], c.matrices[3])  # another seed, other jitter
    assert a.size == (160, 120) and len(a) == 8 and a.fps == 30
    assert all(m.shape == (2, 3) for m in a.matrices)
    centres = np.array([a.map_points(i, [[255.5, 255.5]])[0] for i in range(8)])
    assert np.ptp(centres[:, 0]) > 10  # it pans
    still = make_motion_clip(astronaut, size=(160, 120), frames=3, pan_px=0, zoom=0, rotate_deg=0)
    assert np.allclose(still.matrices[0], still.matrices[2])
    assert np.array_equal(still.frames[0], still.frames[2])


def _sift_affine(still: Image) -> Callable[[Image], npt.NDArray[np.float64]]:
    sift = cv2.SIFT_create()
    keys_still, desc_still = sift.detectAndCompute(cv2.cvtColor(still, cv2.COLOR_BGR2GRAY), None)
    matcher = cv2.BFMatcher()

    def estimate(frame: Image) -> npt.NDArray[np.float64]:
        keys, desc = sift.detectAndCompute(cv2.cvtColor(frame, cv2.COLOR_BGR2GRAY), None)
        pairs = matcher.knnMatch(desc_still, desc, k=2)
        good = [m for m, n in pairs if m.distance < 0.7 * n.distance]
        src = np.float32([keys_still[m.queryIdx].pt for m in good])
        dst = np.float32([keys[m.trainIdx].pt for m in good])
        matrix, inliers = cv2.estimateAffine2D(src, dst, ransacReprojThreshold=1.5)
        assert matrix is not None and int(inliers.sum()) >= 30
        return np.asarray(matrix, dtype=np.float64)

    return estimate


@pytest.mark.parametrize(("name", "focus"), [("astronaut", ASTRONAUT_FACE), ("t1", None)])
def test_ground_truth_matrices_match_the_pictures(name: str, focus: tuple[float, float] | None) -> None:
    still = load_sample(name)  # t1 is large, so it also takes the shrink-first path
    clip = make_motion_clip(
        still,
        size=(320, 240),
        frames=12,
        pan_px=30,
        zoom=0.2,
        rotate_deg=8,
        jitter_px=2.0,
        noise_sigma=3.0,
        seed=3,
        focus=focus,
    )
    estimate = _sift_affine(still)
    gx, gy = np.meshgrid(np.linspace(10, 310, 7), np.linspace(10, 230, 5))
    frame_points = np.stack([gx.ravel(), gy.ravel()], axis=1)
    h, w = still.shape[:2]
    for i in (2, 7):
        truth = clip.matrices[i]
        # 1. Features matched between the still and the frame give the same mapping.
        found = estimate(clip.frames[i])
        full = np.vstack([truth, [0.0, 0.0, 1.0]])
        still_points = (np.linalg.inv(full) @ np.c_[frame_points, np.ones(len(frame_points))].T).T[:, :2]
        mapped_truth = clip.map_points(i, still_points)
        mapped_found = still_points @ found[:, :2].T + found[:, 2]
        assert np.allclose(mapped_truth, frame_points)
        assert np.abs(mapped_found - mapped_truth).max() < 0.75

        # 2. Warping the frame back with the matrix lands on the still's own pixels; a matrix
        #    off by 1.5 px does visibly worse.
        def misfit(matrix: np.ndarray, frame: Image = clip.frames[i]) -> float:
            back = cv2.warpAffine(frame, matrix, (w, h), flags=cv2.WARP_INVERSE_MAP | cv2.INTER_LINEAR)
            ones = np.full(frame.shape[:2], 255, np.uint8)
            mask = cv2.warpAffine(ones, matrix, (w, h), flags=cv2.WARP_INVERSE_MAP | cv2.INTER_NEAREST)
            mask = cv2.erode(mask, np.ones((5, 5), np.uint8)) > 0
            diff = cv2.GaussianBlur(back.astype(np.float32), (0, 0), 2) - cv2.GaussianBlur(
                still.astype(np.float32), (0, 0), 2
            )
            return float(np.abs(diff)[mask].mean())

        shifted = truth.copy()
        shifted[:, 2] += 1.5
        assert misfit(truth) < 4.0
        assert misfit(shifted) > 2 * misfit(truth)

    # 3. A landmark lands on the same content. Render the still's surroundings of the landmark
    #    at the frame's scale and angle (the matrix's linear part), then search the frame for them:
    #    the best match must sit where the matrix puts the landmark.
    landmark = np.array(focus if focus is not None else ((w - 1) / 2, (h - 1) / 2))
    half = 20
    for i in (0, 5, 10):
        linear = clip.matrices[i][:, :2]
        local = np.hstack([linear, (np.array([half, half]) - linear @ landmark)[:, None]])
        template = cv2.warpAffine(still, local, (2 * half + 1, 2 * half + 1), flags=cv2.INTER_LINEAR)
        result = cv2.matchTemplate(clip.frames[i], template, cv2.TM_CCOEFF_NORMED)
        _, score, _, top_left = cv2.minMaxLoc(result)
        x, y = clip.map_points(i, [landmark])[0]
        assert score > 0.9
        assert abs(top_left[0] + half - x) <= 1.0 and abs(top_left[1] + half - y) <= 1.0
