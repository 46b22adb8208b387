"""Video and image files for the offline tools: probing, streaming transcodes and image writes.

A transcode decodes the input with PyAV, hands the frames to a callback a few at a time and
encodes what comes back as H.264, so memory stays flat however long the video is. Every
frame keeps its input timestamp, the audio track is copied packet by packet when the output
container can hold its codec (re-encoded to AAC otherwise), and the result appears at the
destination path only once it is complete (`engines.atomic`; the temporary name keeps the
destination's suffix, for writers that pick a format by it).
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import av.error
import cv2
import numpy as np
from tqdm import tqdm

from app.errors import UserError
from app.pipeline.types import Image
from engines.atomic import atomic_path

log = logging.getLogger(__name__)

ProcessFn = Callable[[list[Image]], list[Image]]

# Output containers picked by the destination's suffix: all of them hold H.264 and AAC.
OUTPUT_FORMATS: dict[str, str] = {".mp4": "mp4", ".m4v": "mp4", ".mov": "mov", ".mkv": "matroska"}

_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp"}


@dataclass(frozen=True)
class VideoInfo:
    """What `probe` found in a video file."""

    path: Path
    container: str
    width: int
    height: int
    fps: Fraction
    frames: int | None  # None when the container does not record a frame count
    duration: float | None  # seconds; None when unknown
    video_codec: str
    audio_codec: str | None
    audio_rate: int | None
    audio_channels: int | None

    @property
    def has_audio(self) -> bool:
        return self.audio_codec is not None


@dataclass(frozen=True)
class TranscodeStats:
    """The outcome of `transcode`."""

    frames: int
    seconds: float  # wall-clock time of the whole transcode
    fps: float  # frames per second of wall-clock time
    audio_copied: bool  # the audio packets went across untouched
    audio_reencoded: bool  # the audio had to be re-encoded to AAC
    width: int
    height: int


# --------------------------------------------------------------------------------------------
# helpers shared by the readers and writers


def _reason(exc: BaseException) -> str:
    """A one-line description of a PyAV or OS error, without errno numbers or file names."""
    strerror = getattr(exc, "strerror", None)
    text = strerror if isinstance(strerror, str) and strerror else str(exc)
    return " ".join(text.split()) or type(exc).__name__


def _require_file(path: Path, what: str) -> None:
    if not path.exists():
        raise UserError(f"{what} not found: {path}")
    if not path.is_file():
        raise UserError(f"{what} is not a regular file: {path}")
    if not os.access(path, os.R_OK):
        raise UserError(f"{what} is not readable: {path}")
    if path.stat().st_size == 0:
        raise UserError(f"{what} is empty: {path}")


def check_writable_destination(dst: Path) -> None:
    """Raise `UserError` unless a file can be created at `dst` (its folder exists and takes files)."""
    parent = dst.parent
    if dst.is_dir():
        raise UserError(f"output path is a directory: {dst}")
    if not parent.exists():
        raise UserError(f"output directory does not exist: {parent}")
    if not parent.is_dir():
        raise UserError(f"output directory is not a directory: {parent}")
    # os.access says yes to root even on read-only mounts, so try to create a file for real.
    probe_path = parent / f".{dst.name}.{secrets.token_hex(4)}.check"
    try:
        fd = os.open(probe_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise UserError(f"cannot write to output directory {parent}: {_reason(exc)}") from None
    os.close(fd)
    probe_path.unlink(missing_ok=True)


def _fraction(value: Any) -> Fraction | None:
    if value is None:
        return None
    frac = Fraction(value)
    return frac if frac > 0 else None


def _rescale(value: int, src: Fraction, dst: Fraction) -> int:
    return round(Fraction(value) * src / dst)


# --------------------------------------------------------------------------------------------
# reading


@contextmanager
def _open_input(path: Path) -> Iterator[av.container.InputContainer]:
    try:
        container = av.open(str(path), mode="r")
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        raise UserError(f"{path}: not a video file, or a corrupt or truncated one ({_reason(exc)})") from None
    try:
        yield container
    finally:
        container.close()


def _video_stream(container: av.container.InputContainer, path: Path) -> av.VideoStream:
    if not container.streams.video:
        raise UserError(f"{path}: no video stream in this file")
    return container.streams.video[0]


def _stream_fps(stream: av.VideoStream, path: Path) -> Fraction:
    for candidate in (stream.average_rate, stream.guessed_rate, stream.base_rate):
        frac = _fraction(candidate)
        if frac is not None:
            return frac
    raise UserError(f"{path}: the video stream has no frame rate")


def _check_complete(container: av.container.InputContainer, path: Path) -> None:
    """Catch a cut-off file whose header survived: its sample index points past the end of the file.

    Containers that index every sample up front (MP4, MOV) show it here without reading the data.
    """
    size = path.stat().st_size
    for stream in (*container.streams.video, *container.streams.audio):
        entries = stream.index_entries
        if len(entries) == 0:
            continue
        end = max(entry.pos + entry.size for entry in entries)
        if end > size:
            raise UserError(
                f"{path}: truncated file: it holds {size} bytes but its {stream.type} index reaches byte {end}"
            )


def probe(path: str | os.PathLike[str]) -> VideoInfo:
    """Describe a video file; `UserError` if it is missing, not a video, or has no decodable frame."""
    path = Path(path)
    _require_file(path, "video file")
    with _open_input(path) as container:
        stream = _video_stream(container, path)
        ctx = stream.codec_context
        fps = _stream_fps(stream, path)
        duration: float | None = None
        if stream.duration is not None and stream.time_base is not None:
            duration = float(stream.duration * stream.time_base)
        elif container.duration is not None:
            duration = container.duration / av.time_base
        audio = container.streams.audio[0] if container.streams.audio else None
        try:
            first = next(iter(container.decode(stream)), None)
        except (av.error.FFmpegError, ValueError) as exc:
            raise UserError(f"{path}: the video stream cannot be decoded ({_reason(exc)})") from None
        if first is None:
            raise UserError(f"{path}: the video stream has no decodable frame (truncated or corrupt file?)")
        _check_complete(container, path)
        return VideoInfo(
            path=path,
            container=container.format.name,
            width=ctx.width or first.width,
            height=ctx.height or first.height,
            fps=fps,
            frames=stream.frames or None,
            duration=duration,
            video_codec=ctx.name,
            audio_codec=audio.codec_context.name if audio is not None else None,
            audio_rate=audio.codec_context.sample_rate if audio is not None else None,
            audio_channels=audio.codec_context.channels if audio is not None else None,
        )


def _demux(container: av.container.InputContainer, streams: list[Any], path: Path) -> Iterator[av.Packet]:
    packets = container.demux(streams)
    while True:
        try:
            packet = next(packets)
        except StopIteration:
            return
        except (av.error.FFmpegError, ValueError) as exc:
            raise UserError(f"{path}: corrupt or truncated video ({_reason(exc)})") from None
        yield packet


def _decode_video(packet: av.Packet, path: Path) -> list[av.VideoFrame]:
    try:
        frames = packet.decode()
    except (av.error.FFmpegError, ValueError) as exc:
        raise UserError(f"{path}: corrupt video data ({_reason(exc)})") from None
    return [f for f in frames if isinstance(f, av.VideoFrame)]


def _to_bgr(frame: av.VideoFrame) -> Image:
    return np.asarray(frame.to_ndarray(format="bgr24"), dtype=np.uint8)


# --------------------------------------------------------------------------------------------
# writing


def pad_to_even(image: Image) -> Image:
    """Repeat the last row and/or column so both sides are even (H.264 with 4:2:0 needs that)."""
    h, w = image.shape[:2]
    if h % 2 == 0 and w % 2 == 0:
        return image
    return np.asarray(cv2.copyMakeBorder(image, 0, h % 2, 0, w % 2, cv2.BORDER_REPLICATE), dtype=np.uint8)


class _Writer:
    """The output side of a transcode. Streams are set up when the first processed frames arrive,
    since only then is the output size known; audio packets read before that wait in a list."""

    def __init__(
        self,
        tmp: Path,
        dst: Path,
        fmt: str,
        in_video: av.VideoStream,
        in_audio: av.AudioStream | None,
        *,
        fps: Fraction,
        crf: int,
        preset: str,
    ) -> None:
        self.tmp, self.dst, self.fmt = tmp, dst, fmt
        self.in_audio = in_audio
        self.fps = fps
        self.crf, self.preset = crf, preset
        self.in_tb = _fraction(in_video.time_base) or 1 / fps
        self.enc_tb = self.in_tb  # encoder time base: the input's, so timestamps carry over as they are
        self.frame_step = max(1, _rescale(1, 1 / fps, self.enc_tb))
        self.container: av.container.OutputContainer | None = None
        self.video: av.VideoStream | None = None
        self.audio: av.AudioStream | None = None
        self.audio_copied = False
        self.audio_reencoded = False
        self.width = self.height = 0
        self.pending_audio: list[av.Packet] = []
        self.last_pts: int | None = None
        self.frames = 0

    def _fail(self, exc: BaseException) -> UserError:
        return UserError(f"cannot write {self.dst}: {_reason(exc)}")

    def _open(self, width: int, height: int, copy_audio: bool) -> None:
        try:
            container = av.open(str(self.tmp), mode="w", format=self.fmt)
        except (av.error.FFmpegError, OSError, ValueError) as exc:
            raise self._fail(exc) from None
        self.container = container
        video = container.add_stream("libx264", rate=self.fps, options={"crf": str(self.crf), "preset": self.preset})
        video.width, video.height = width, height
        video.pix_fmt = "yuv420p"
        video.codec_context.time_base = self.enc_tb
        video.time_base = self.enc_tb
        self.video = video
        self.audio = None
        self.audio_copied = self.audio_reencoded = False
        if self.in_audio is not None:
            if copy_audio:
                try:
                    self.audio = container.add_stream_from_template(self.in_audio)
                    self.audio_copied = True
                except ValueError:
                    log.warning(
                        "audio codec %s cannot go into a %s file: re-encoding the audio to AAC",
                        self.in_audio.codec_context.name,
                        self.fmt,
                    )
            if self.audio is None:
                self._add_aac(container, self.in_audio)
        container.start_encoding()

    def _add_aac(self, container: av.container.OutputContainer, source: av.AudioStream) -> None:
        rate = source.codec_context.sample_rate or 48000
        audio = container.add_stream("aac", rate=rate)
        if source.codec_context.channels <= 2:
            audio.codec_context.layout = source.codec_context.layout
        audio.codec_context.time_base = Fraction(1, rate)
        audio.time_base = Fraction(1, rate)
        self.audio = audio
        self.audio_reencoded = True

    def _close_quietly(self) -> None:
        if self.container is not None:
            with suppress(av.error.FFmpegError, OSError, ValueError):
                self.container.close()
            self.container = None

    def _setup(self, first: Image) -> None:
        h, w = first.shape[:2]
        even = pad_to_even(first)
        self.height, self.width = even.shape[:2]
        if (self.width, self.height) != (w, h):
            log.info("padding %dx%d frames to %dx%d for H.264", w, h, self.width, self.height)
        try:
            self._open(self.width, self.height, copy_audio=True)
        except (av.error.FFmpegError, OSError, ValueError) as exc:
            if not self.audio_copied:
                self._close_quietly()
                raise self._fail(exc) from None
            # The muxer turned down the copied audio only when writing the header: start again with AAC.
            log.warning(
                "cannot copy %s audio into a %s file (%s): re-encoding the audio to AAC",
                self.in_audio.codec_context.name if self.in_audio is not None else "?",
                self.fmt,
                _reason(exc),
            )
            self._close_quietly()
            try:
                self._open(self.width, self.height, copy_audio=False)
            except (av.error.FFmpegError, OSError, ValueError) as exc2:
                self._close_quietly()
                raise self._fail(exc2) from None
        pending, self.pending_audio = self.pending_audio, []
        for packet in pending:
            self.write_audio(packet)

    def write_audio(self, packet: av.Packet) -> None:
        if packet.dts is None and packet.pts is None:
            return  # the demuxer's end-of-stream marker; a flush for the decoder only
        if self.container is None:
            self.pending_audio.append(packet)
            return
        assert self.audio is not None
        try:
            if self.audio_copied:
                packet.stream = self.audio
                self.container.mux(packet)
            else:
                for frame in packet.decode():
                    if isinstance(frame, av.AudioFrame):
                        self.container.mux(self.audio.encode(frame))
        except (av.error.FFmpegError, OSError, ValueError) as exc:
            raise self._fail(exc) from None

    def write_video(self, images: list[Image], pts: list[int | None]) -> None:
        if self.container is None:
            self._setup(images[0])
        assert self.container is not None and self.video is not None
        for image, in_pts in zip(images, pts, strict=True):
            even = pad_to_even(image)
            if even.shape[:2] != (self.height, self.width):
                raise ValueError(
                    f"process returned a {image.shape[1]}x{image.shape[0]} frame after "
                    f"{self.width}x{self.height} ones; every frame must have the same size"
                )
            out_pts = _rescale(in_pts, self.in_tb, self.enc_tb) if in_pts is not None else None
            if out_pts is None:
                out_pts = 0 if self.last_pts is None else self.last_pts + self.frame_step
            elif self.last_pts is not None and out_pts <= self.last_pts:
                out_pts = self.last_pts + 1  # the encoder refuses repeated or backwards timestamps
            self.last_pts = out_pts
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(even), format="bgr24")
            frame.pts = out_pts
            frame.time_base = self.enc_tb
            frame.duration = self.frame_step
            try:
                self.container.mux(self.video.encode(frame))
            except (av.error.FFmpegError, OSError, ValueError) as exc:
                raise self._fail(exc) from None
            self.frames += 1

    def finish(self) -> None:
        if self.container is None:
            raise UserError(f"{self.dst}: no video frame was decoded from the input")
        assert self.video is not None
        try:
            self.container.mux(self.video.encode(None))
            for packet in self.pending_audio:
                self.write_audio(packet)
            if self.audio is not None and self.audio_reencoded:
                self.container.mux(self.audio.encode(None))
            self.container.close()
        except (av.error.FFmpegError, OSError, ValueError) as exc:
            raise self._fail(exc) from None
        finally:
            self.container = None

    def abort(self) -> None:
        self._close_quietly()


def _output_format(dst: Path) -> str:
    fmt = OUTPUT_FORMATS.get(dst.suffix.lower())
    if fmt is None:
        known = ", ".join(sorted(OUTPUT_FORMATS))
        raise UserError(f"cannot tell the output format from {dst.name!r}: use one of {known}")
    return fmt


def transcode(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    process: ProcessFn,
    *,
    batch_size: int = 4,
    crf: int = 18,
    preset: str = "medium",
    progress: bool = True,
) -> TranscodeStats:
    """Decode `src`, pass its frames through `process` in batches, and encode the result to `dst`.

    `process` gets up to `batch_size` BGR frames and must return as many frames, all of one size
    (odd sizes are padded to even by repeating the last row/column). The output is H.264
    (yuv420p) at constant quality `crf`, with each input frame's timestamp and the input's audio.
    `dst` is written through a temporary file beside it and appears only when everything worked.
    """
    src, dst = Path(src), Path(dst)
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    if not 0 <= crf <= 51:
        raise ValueError("crf must be within 0..51")
    check_writable_destination(dst)
    fmt = _output_format(dst)
    info = probe(src)
    started = time.perf_counter()
    with atomic_path(dst, suffix=dst.suffix) as tmp, _open_input(src) as container:
        in_video = _video_stream(container, src)
        in_video.thread_type = "AUTO"
        in_audio = container.streams.audio[0] if container.streams.audio else None
        writer = _Writer(tmp, dst, fmt, in_video, in_audio, fps=info.fps, crf=crf, preset=preset)
        streams: list[Any] = [in_video] if in_audio is None else [in_video, in_audio]
        batch: list[Image] = []
        batch_pts: list[int | None] = []
        bar = tqdm(total=info.frames, unit="frame", desc=src.name, disable=not progress, leave=False)

        def run_batch() -> None:
            out = process(list(batch))
            if len(out) != len(batch):
                raise ValueError(f"process returned {len(out)} frames for a batch of {len(batch)}")
            writer.write_video(out, batch_pts)
            bar.update(len(batch))
            batch.clear()
            batch_pts.clear()

        video_packets = 0
        try:
            for packet in _demux(container, streams, src):
                if in_audio is not None and packet.stream_index == in_audio.index:
                    writer.write_audio(packet)
                    continue
                if packet.size > 0:
                    video_packets += 1
                for frame in _decode_video(packet, src):
                    batch.append(_to_bgr(frame))
                    batch_pts.append(frame.pts)
                    if len(batch) >= batch_size:
                        run_batch()
            if batch:
                run_batch()
            if info.frames is not None and video_packets < info.frames:
                raise UserError(
                    f"{src}: truncated or corrupt video: read {video_packets} of the {info.frames} frames it lists"
                )
            writer.finish()
        except BaseException:
            writer.abort()
            raise
        finally:
            bar.close()
    seconds = time.perf_counter() - started
    return TranscodeStats(
        frames=writer.frames,
        seconds=seconds,
        fps=writer.frames / seconds if seconds > 0 else 0.0,
        audio_copied=writer.audio_copied,
        audio_reencoded=writer.audio_reencoded,
        width=writer.width,
        height=writer.height,
    )


def read_frames(path: str | os.PathLike[str]) -> Iterator[Image]:
    """Yield every frame of a video as a BGR image, one at a time; `UserError` for bad files."""
    path = Path(path)
    probe(path)
    with _open_input(path) as container:
        stream = _video_stream(container, path)
        stream.thread_type = "AUTO"
        for packet in _demux(container, [stream], path):
            for frame in _decode_video(packet, path):
                yield _to_bgr(frame)


# --------------------------------------------------------------------------------------------
# still images


def read_image(path: str | os.PathLike[str]) -> Image:
    """Read an image file as BGR uint8; `UserError` when it is missing, unreadable or not an image."""
    path = Path(path)
    _require_file(path, "image file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read image {path}: {_reason(exc)}") from None
    image = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)
    if image is None or image.size == 0:
        raise UserError(f"{path}: not an image, or a corrupt one")
    return np.ascontiguousarray(image, dtype=np.uint8)


def write_image(path: str | os.PathLike[str], image: Image, *, quality: int = 95) -> None:
    """Write a BGR image; the format follows the suffix. The file appears only once complete."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in _IMAGE_SUFFIXES:
        known = ", ".join(sorted(_IMAGE_SUFFIXES))
        raise UserError(f"cannot tell the image format from {path.name!r}: use one of {known}")
    if image.dtype != np.uint8 or image.ndim not in (2, 3):
        raise ValueError(f"expected a uint8 image, got {image.dtype} with shape {image.shape}")
    params: list[int] = []
    if suffix in (".jpg", ".jpeg"):
        params = [cv2.IMWRITE_JPEG_QUALITY, quality]
    elif suffix == ".webp":
        params = [cv2.IMWRITE_WEBP_QUALITY, quality]
    ok, encoded = cv2.imencode(suffix, image, params)
    if not ok:
        raise UserError(f"cannot encode the image as {suffix}")
    check_writable_destination(path)
    with atomic_path(path, suffix=path.suffix) as tmp:
        try:
            tmp.write_bytes(encoded.tobytes())
        except OSError as exc:
            raise UserError(f"cannot write {path}: {_reason(exc)}") from None
