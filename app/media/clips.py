"""Test clips made from real face photos, with the motion of every frame known exactly.

`make_motion_clip` moves a still photo through a virtual camera: a smooth pan, a slow zoom in
and out, a small rotation, optional per-frame jitter or drift and sensor-like noise. Each frame
comes with the 2x3 affine matrix that maps the still's pixel coordinates into that frame, so a
landmark found once on the still has a known position in every frame. `write_clip` turns such
a clip into an H.264 file with a test tone (`through_h264`: and back, as a camera's file
arrives), and `sample_faces` finds face photos that the installed packages ship, so the clips
need nothing downloaded.
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import math
import os
import tempfile
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import cv2
import numpy as np
import numpy.typing as npt

from app.errors import UserError
from app.media.video_file import OUTPUT_FORMATS, check_writable_destination, read_frames, read_image
from app.pipeline.types import Image, Matrix
from engines.atomic import atomic_path


@dataclass
class MotionClip:
    """Frames of a still moved through a virtual camera.

    `matrices[i]` is a 2x3 affine matrix taking pixel coordinates of the still (pixel centres
    at integer positions, as OpenCV counts them) to pixel coordinates in `frames[i]`.
    """

    frames: list[Image]
    matrices: list[Matrix]
    fps: int

    def __len__(self) -> int:
        return len(self.frames)

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the frames."""
        h, w = self.frames[0].shape[:2]
        return w, h

    @property
    def duration(self) -> float:
        return len(self.frames) / self.fps

    def map_points(self, index: int, points: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """Where points given in the still's coordinates (N x 2) are in frame `index`."""
        pts = np.asarray(points, dtype=np.float64).reshape(-1, 2)
        m = self.matrices[index]
        return pts @ m[:, :2].T + m[:, 2]


def _affine(
    scale: float, angle_rad: float, centre_from: npt.NDArray[np.float64], centre_to: npt.NDArray[np.float64]
) -> Matrix:
    """Scale and rotate about `centre_from`, then move `centre_from` onto `centre_to`."""
    c, s = math.cos(angle_rad), math.sin(angle_rad)
    linear = scale * np.array([[c, -s], [s, c]], dtype=np.float64)
    shift = centre_to - linear @ centre_from
    return np.hstack([linear, shift[:, None]])


def _cover_scale(
    still_wh: tuple[int, int],
    focus: npt.NDArray[np.float64],
    frame_wh: tuple[int, int],
    angles: npt.NDArray[np.float64],
    offsets: npt.NDArray[np.float64],
    zooms: npt.NDArray[np.float64],
) -> float:
    """The smallest base scale at which every frame, for its angle, offset and zoom, sees only the
    still (no border): each frame corner, taken back into the still, must land inside it.

    `focus` is the still's point that sits at the frame centre (before the offset)."""
    sw, sh = still_wh
    fw, fh = frame_wh
    # Room around the focus up to the still's outer pixel edges: left, right, top, bottom.
    left, right = focus[0] + 0.5, sw - 0.5 - focus[0]
    top, bottom = focus[1] + 0.5, sh - 0.5 - focus[1]
    corners = np.array([[-fw / 2, -fh / 2], [fw / 2, -fh / 2], [fw / 2, fh / 2], [-fw / 2, fh / 2]])
    need = 0.0
    for angle, offset, zoom in zip(angles, offsets, zooms, strict=True):
        c, s = math.cos(angle), math.sin(angle)
        back = np.array([[c, s], [-s, c]])  # rotation by -angle
        v = (corners - offset) @ back.T  # frame corners seen from the focus, in unscaled still units
        vx, vy = v[:, 0], v[:, 1]
        need_x = max(float(np.max(np.maximum(vx, 0.0))) / right, float(np.max(np.maximum(-vx, 0.0))) / left)
        need_y = max(float(np.max(np.maximum(vy, 0.0))) / bottom, float(np.max(np.maximum(-vy, 0.0))) / top)
        need = max(need, need_x / zoom, need_y / zoom)
    return need * 1.002


def make_motion_clip(
    still: Image,
    *,
    size: tuple[int, int] = (320, 240),
    frames: int,
    fps: int = 30,
    pan_px: float = 24.0,
    zoom: float = 0.15,
    rotate_deg: float = 6.0,
    jitter_px: float = 0.0,
    drift_px: float = 0.0,
    noise_sigma: float = 0.0,
    seed: int = 0,
    focus: tuple[float, float] | None = None,
) -> MotionClip:
    """Move `still` through a `size` = (width, height) frame for `frames` frames.

    Over the clip the camera pans one sinusoidal loop of amplitude `pan_px` (half that
    vertically, at twice the rate), zooms in by `zoom` (0.15 = 15 % closer) and back out, and
    rolls by up to `rotate_deg` each way. `jitter_px` adds a random per-frame shift (standard
    deviation, pixels), `drift_px` a random walk of the camera (each frame's step has this
    standard deviation, pixels: the slow wander of a camera on a desk) and `noise_sigma` Gaussian
    pixel noise (grey levels). `focus` = (x, y) is the point of the still kept at the frame centre
    (give a face's centre to keep it in view; the still's centre by default). The still is scaled
    just enough to fill every frame with no border. Same arguments, same clip.
    """
    if frames < 1:
        raise ValueError("frames must be at least 1")
    if fps < 1:
        raise ValueError("fps must be at least 1")
    if zoom <= -1.0:
        raise ValueError("zoom must be above -1")
    if still.dtype != np.uint8 or still.ndim != 3 or still.shape[2] != 3:
        raise ValueError(f"expected a BGR uint8 image, got {still.dtype} with shape {still.shape}")
    fw, fh = size
    if fw < 2 or fh < 2:
        raise ValueError("size must be at least 2x2")
    rng = np.random.default_rng(seed)

    phase = 2 * math.pi * np.arange(frames) / frames
    offsets = np.stack([pan_px * np.sin(phase), 0.5 * pan_px * np.sin(2 * phase)], axis=1)
    if jitter_px > 0:
        offsets = offsets + rng.normal(0.0, jitter_px, size=(frames, 2))
    if drift_px > 0:
        offsets = offsets + np.cumsum(rng.normal(0.0, drift_px, size=(frames, 2)), axis=0)
    zooms = 1.0 + zoom * np.sin(phase / 2) ** 2
    angles = np.deg2rad(rotate_deg) * np.sin(phase)

    sh, sw = still.shape[:2]
    centre = np.array([(sw - 1) / 2, (sh - 1) / 2]) if focus is None else np.asarray(focus, dtype=np.float64)
    if not (0 <= centre[0] <= sw - 1 and 0 <= centre[1] <= sh - 1):
        raise ValueError(f"focus {tuple(centre)} is outside the {sw}x{sh} still")
    base = _cover_scale((sw, sh), centre, (fw, fh), angles, offsets, zooms)

    # Shrink a large still first with area averaging: a plain warp that shrinks a lot aliases.
    source = still
    pre = np.eye(3)
    shrink = base * float(zooms.min())
    if shrink < 1.0:
        nw, nh = max(2, round(sw * shrink)), max(2, round(sh * shrink))
        source = np.asarray(cv2.resize(still, (nw, nh), interpolation=cv2.INTER_AREA), dtype=np.uint8)
        kx, ky = nw / sw, nh / sh
        # OpenCV's resize maps pixel centres: x' = (x + 0.5) * k - 0.5.
        pre = np.array([[kx, 0.0, 0.5 * kx - 0.5], [0.0, ky, 0.5 * ky - 0.5], [0.0, 0.0, 1.0]])
        centre = (centre + 0.5) * np.array([kx, ky]) - 0.5
        base = _cover_scale((nw, nh), centre, (fw, fh), angles, offsets, zooms)

    centre_src = centre
    centre_frame = np.array([(fw - 1) / 2, (fh - 1) / 2])
    out_frames: list[Image] = []
    matrices: list[Matrix] = []
    for i in range(frames):
        warp = _affine(base * float(zooms[i]), float(angles[i]), centre_src, centre_frame + offsets[i])
        frame = cv2.warpAffine(source, warp, (fw, fh), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        if noise_sigma > 0:
            noise = np.asarray(rng.normal(0.0, noise_sigma, size=frame.shape), dtype=np.float32)
            noisy = frame.astype(np.float32) + noise
            frame = np.clip(np.rint(noisy), 0, 255).astype(np.uint8)
        out_frames.append(np.ascontiguousarray(frame))
        matrices.append((np.vstack([warp, [0.0, 0.0, 1.0]]) @ pre)[:2].astype(np.float64))
    return MotionClip(frames=out_frames, matrices=matrices, fps=fps)


def write_clip(
    clip: MotionClip,
    path: str | os.PathLike[str],
    *,
    audio_tone_hz: float | None = 440.0,
    crf: int = 18,
    pix_fmt: str = "yuv420p",
    audio_codec: str = "aac",
    audio_rate: int = 48000,
    faststart: bool = False,
) -> None:
    """Encode `clip` as H.264 (`pix_fmt` yuv420p needs even sizes; yuv444p takes any) into an
    .mp4/.mov/.mkv file, with a sine tone as long as the clip when `audio_tone_hz` is set.

    `faststart` puts an MP4/MOV file's index before the media data (as files made for the web have).
    """
    path = Path(path)
    fmt = OUTPUT_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise UserError(f"cannot tell the video format from {path.name!r}")
    if not clip.frames:
        raise ValueError("the clip has no frames")
    w, h = clip.size
    if pix_fmt == "yuv420p" and (w % 2 or h % 2):
        raise ValueError(f"yuv420p needs even sizes, the clip is {w}x{h}; use pix_fmt='yuv444p'")
    check_writable_destination(path)
    options = {"movflags": "+faststart"} if faststart and fmt in ("mp4", "mov") else None
    with atomic_path(path, suffix=path.suffix) as tmp, av.open(str(tmp), mode="w", format=fmt, options=options) as out:
        video = out.add_stream("libx264", rate=clip.fps, options={"crf": str(crf), "preset": "fast"})
        video.width, video.height = w, h
        video.pix_fmt = pix_fmt
        video.codec_context.time_base = Fraction(1, clip.fps)
        audio: av.AudioStream | None = None
        if audio_tone_hz is not None:
            stream = out.add_stream(audio_codec, rate=audio_rate)
            if not isinstance(stream, av.AudioStream):
                raise ValueError(f"{audio_codec!r} is not an audio codec")
            audio = stream
            audio.codec_context.layout = "mono"
            audio.codec_context.time_base = Fraction(1, audio_rate)
        for i, image in enumerate(clip.frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="bgr24")
            frame.pts = i
            frame.time_base = Fraction(1, clip.fps)
            out.mux(video.encode(frame))
        out.mux(video.encode(None))
        if audio is not None and audio_tone_hz is not None:
            total = round(len(clip) * audio_rate / clip.fps)
            chunk = 1024
            for start in range(0, total, chunk):
                n = min(chunk, total - start)
                t = (start + np.arange(n)) / audio_rate
                samples = (0.3 * np.sin(2 * math.pi * audio_tone_hz * t)).astype(np.float32)[None, :]
                aframe = av.AudioFrame.from_ndarray(samples, format="fltp", layout="mono")
                aframe.sample_rate = audio_rate
                aframe.pts = start
                aframe.time_base = Fraction(1, audio_rate)
                out.mux(audio.encode(aframe))
            out.mux(audio.encode(None))


def through_h264(clip: MotionClip, crf: int = 12) -> MotionClip:
    """`clip` as a player gets it back from an H.264 file (yuv420p at `crf`): the codec's own frame-to-frame
    changes (a still scene's noise is coded differently in every frame) on top of the camera's."""
    with tempfile.TemporaryDirectory(prefix="swapcast-clip-") as folder:
        path = Path(folder) / "clip.mp4"
        write_clip(clip, path, audio_tone_hz=None, crf=crf)
        frames = list(read_frames(path))
    if len(frames) != len(clip):
        raise ValueError(f"the H.264 round trip gave {len(frames)} frames for {len(clip)}")
    return MotionClip(frames=frames, matrices=list(clip.matrices), fps=clip.fps)


# --------------------------------------------------------------------------------------------
# face photos shipped by installed packages


def _package_dir(name: str) -> Path | None:
    """Where a top-level package is installed, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "swapcast" / "samples"


def _astronaut() -> Path | None:
    skimage_dir = _package_dir("skimage")
    if skimage_dir is None:
        return None
    shipped = skimage_dir / "data" / "astronaut.png"
    if shipped.is_file():
        return shipped
    # Releases that keep the picture elsewhere still hand it out through skimage.data.
    cached = _cache_dir() / "astronaut.png"
    if not cached.is_file():
        try:
            from skimage import data as skdata

            rgb = np.asarray(skdata.astronaut(), dtype=np.uint8)
        except Exception:  # any failure here means: no astronaut on this machine
            return None
        from app.media.video_file import write_image

        cached.parent.mkdir(parents=True, exist_ok=True)
        write_image(cached, np.ascontiguousarray(rgb[:, :, ::-1]))
    return cached


@functools.lru_cache(maxsize=1)
def _grace_hopper() -> Path | None:
    for candidate in sorted(glob.glob("/usr/share/**/grace_hopper_512x512.jpg", recursive=True)):
        return Path(candidate)
    return None


def sample_faces() -> dict[str, Path]:
    """Face photos available on this machine, by name.

    - ``t1``: a group photo with six faces (insightface)
    - ``tom_hanks``: one face, close up (insightface)
    - ``astronaut``: one face, upper body (scikit-image)
    - ``grace_hopper``: one face, portrait (shipped by some Debian packages)

    Names whose package is not installed are left out.
    """
    found: dict[str, Path] = {}
    insightface_dir = _package_dir("insightface")
    if insightface_dir is not None:
        images = insightface_dir / "data" / "images"
        for name, filename in (("t1", "t1.jpg"), ("tom_hanks", "Tom_Hanks_54745.png")):
            if (images / filename).is_file():
                found[name] = images / filename
    astronaut = _astronaut()
    if astronaut is not None:
        found["astronaut"] = astronaut
    hopper = _grace_hopper()
    if hopper is not None:
        found["grace_hopper"] = hopper
    return found


def load_sample(name: str) -> Image:
    """One of `sample_faces()` as a BGR image; `UserError` if it is not on this machine."""
    faces = sample_faces()
    if name not in faces:
        have = ", ".join(sorted(faces)) or "none"
        raise UserError(f"sample face {name!r} is not available here (available: {have})")
    return read_image(faces[name])
