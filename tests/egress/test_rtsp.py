"""RTSP out and RTSP ingest over loopback: a real gst-rtsp-server, real clients (ffprobe, PyAV).

Every pushed frame is a view of a real face (the astronaut) with its frame id stamped into the
top edge, so a client can tell which frame it decoded and compare it with what was pushed.
"""

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest

from app.bench.rtsp_latency import read_frame_id, stamp_frame_id
from app.egress.rtsp import RtspPublisher, RtspServer, rtsp_unavailable_reason
from app.media.clips import MotionClip, load_sample, make_motion_clip, write_clip
from app.media.rtsp_in import IngestWorker
from app.pipeline.types import Image
from tests.egress.rtsp_clients import pull
from tests.helpers import psnr, wait_for

REPO = Path(__file__).resolve().parents[2]
UNAVAILABLE = rtsp_unavailable_reason()
needs_rtsp = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"GStreamer RTSP unavailable: {UNAVAILABLE}")
FPS = 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Feeder:
    """Pushes stamped clip frames to a publisher at `fps` from a thread."""

    def __init__(self, clip: MotionClip, publisher: RtspPublisher, *, scale: int = 1, fps: int = FPS) -> None:
        self.clip = clip
        self.publisher = publisher
        self.scale = scale
        self.fps = fps
        self.pushed: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def reference(self, frame_id: int) -> Image:
        """The frame pushed with `frame_id` (at the pushed size)."""
        image = self.clip.frames[frame_id % len(self.clip)]
        size = (image.shape[1] * self.scale, image.shape[0] * self.scale)
        scaled = np.ascontiguousarray(cv2.resize(image, size, interpolation=cv2.INTER_LINEAR), dtype=np.uint8)
        return stamp_frame_id(scaled, frame_id, block=16 * self.scale)

    def rate(self, since: float, until: float) -> float:
        n = sum(1 for t in self.pushed if since <= t <= until)
        return n / (until - since)

    def _run(self) -> None:
        next_at = time.monotonic()
        frame_id = 0
        while not self._stop.is_set():
            self.publisher.push(self.reference(frame_id))
            self.pushed.append(time.monotonic())
            frame_id += 1
            next_at += 1 / self.fps
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def __enter__(self) -> "Feeder":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture(scope="module")
def clip() -> MotionClip:
    return make_motion_clip(load_sample("astronaut"), size=(640, 480), frames=60, fps=FPS)


@pytest.fixture(scope="module")
def server() -> Iterator[RtspServer]:
    if UNAVAILABLE is not None:
        pytest.skip(f"GStreamer RTSP unavailable: {UNAVAILABLE}")
    with RtspServer(port=0) as s:
        yield s


@pytest.fixture
def publisher(server: RtspServer, request: pytest.FixtureRequest) -> Iterator[RtspPublisher]:
    p = server.publish(request.node.name.replace("[", "-").rstrip("]"), 640, 480, FPS)
    yield p
    p.close()


@needs_rtsp
def test_frames_before_any_client_are_dropped_cheaply(server: RtspServer, clip: MotionClip) -> None:
    p = server.publish("idle", 640, 480, FPS)
    try:
        for frame in clip.frames[:10]:
            p.push(frame)
        assert p.own is not None and wait_for(lambda: p.own.feed.stats()["frames_published"] == 10, 5)
        # Nobody plays the path: nothing is encoded or sent.
        assert (p.encode.frames_encoded, p.encode.running, p.feed.packets_sent, p.feed.streaming) == (
            0,
            False,
            0,
            False,
        )
        assert server.client_count("idle") == 0
        with pytest.raises(ValueError, match="BGR uint8"):
            p.push(np.zeros((480, 640), np.uint8))
    finally:
        p.close()
    assert "/idle" not in server.paths()


@pytest.mark.slow
@needs_rtsp
def test_a_paused_producer_still_serves_its_last_frame(server: RtspServer, clip: MotionClip) -> None:
    never = server.publish("never-pushed", 640, 480, FPS)
    paused = server.publish("paused", 640, 480, FPS)
    try:
        ((_, slate),) = pull(server.url("never-pushed"), 1)  # the path's slate until its producer's first frame
        assert slate.shape == (480, 640, 3) and float(slate.mean()) < 60.0
        paused.push(stamp_frame_id(clip.frames[5].copy(), 7))  # pushed while nobody watches
        frames = pull(server.url("paused"), 2)  # the second one only comes as a repeat
        assert [read_frame_id(image) for _, image in frames] == [7, 7]
        assert paused.own is not None and paused.own.feed.stats()["frames_held"] >= 2
    finally:
        never.close()
        paused.close()


@needs_rtsp
@pytest.mark.skipif(shutil.which("ffprobe") is None, reason="ffprobe (Debian package ffmpeg) is not installed")
def test_ffprobe_sees_h264_640x480(server: RtspServer, publisher: RtspPublisher, clip: MotionClip) -> None:
    with Feeder(clip, publisher):
        out = subprocess.run(
            ["ffprobe", "-v", "error", "-rtsp_transport", "tcp", "-select_streams", "v:0"]
            + ["-show_entries", "stream=codec_name,width,height", "-of", "json", server.url(publisher.path)],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    (stream,) = json.loads(out.stdout)["streams"]
    assert (stream["codec_name"], stream["width"], stream["height"]) == ("h264", 640, 480)


@pytest.mark.slow
@needs_rtsp
def test_pyav_client_gets_the_pushed_frames(server: RtspServer, publisher: RtspPublisher, clip: MotionClip) -> None:
    burst = clip.frames[0].copy()
    dropped: list[int] = []

    def push_burst(n: int) -> None:
        # With the client still connected, a burst far faster than the encoder: only the newest
        # frames are kept and the others are counted.
        if n == 45:
            before = replaced()
            for _ in range(100):
                publisher.push(burst)
            dropped.append(replaced() - before)

    def replaced() -> int:
        assert publisher.own is not None
        return publisher.own.feed.counters.frames_superseded + publisher.encode.frames_dropped

    with Feeder(clip, publisher) as feeder:
        frames = pull(server.url(publisher.path), 45, on_frame=push_burst)
        pushed_rate = feeder.rate(frames[0][0], frames[-1][0])
    assert dropped[0] > 0

    assert all(image.shape == (480, 640, 3) for _, image in frames)
    ids = [read_frame_id(image) for _, image in frames]
    readable = [(i, image) for i, (_, image) in zip(ids, frames, strict=True) if i is not None]
    assert len(readable) >= 0.9 * len(frames), ids
    # Non-decreasing: a frame that comes late from the feeder thread lets the last one be repeated.
    assert [i for i, _ in readable] == sorted(i for i, _ in readable), "frame ids must not go back"
    right = [psnr(image, feeder.reference(i)) for i, image in readable]
    wrong = [psnr(image, feeder.reference(i + 15)) for i, image in readable]
    assert min(right) > 25.0, right
    assert float(np.median(right)) > float(np.median(wrong)) + 3.0
    # Roughly the pushed rate: no pile-up, no long stalls (bounds are generous for busy machines).
    received_rate = (len(frames) - 1) / (frames[-1][0] - frames[0][0])
    assert 0.5 * pushed_rate < received_rate < 1.5 * pushed_rate, (received_rate, pushed_rate)
    first, last = readable[0][0], readable[-1][0]
    assert last - first + 1 <= 1.5 * len(frames), "too many frames skipped"
    assert publisher.feed.packets_sent <= publisher.encode.frames_encoded


@pytest.mark.slow
@needs_rtsp
def test_a_slow_producer_is_sent_at_its_own_rate_and_opens_fast(server: RtspServer, clip: MotionClip) -> None:
    # A producer at 12 fps on a path announced at 30 (a swap pipeline on a CPU): every frame once, no
    # repeats in between, and an FFmpeg-based client opens and decodes its first frame within about a
    # second (before honest pacing: 51% distinct frames, first frame after 3.6 s).
    slow = server.publish("slow", 640, 480, FPS)
    try:
        with Feeder(clip, slow, fps=12):
            time.sleep(0.5)
            connect = time.monotonic()
            frames = pull(server.url("slow"), 40)
    finally:
        slow.close()
    first_frame_s = frames[0][0] - connect
    ids = [i for _, image in frames[5:] if (i := read_frame_id(image)) is not None]
    assert len(ids) >= 30
    assert len(set(ids)) >= 0.95 * len(ids), ids
    received_rate = (len(frames) - 6) / (frames[-1][0] - frames[5][0])
    # A 12 fps producer is received near 12 fps, not at the announced 30 with repeats (speed itself is measured in
    # `app.bench.rtsp_latency`; these bounds only tell the old behaviour apart and stay loose for busy machines).
    assert 7.0 < received_rate < 18.0, received_rate
    assert first_frame_s < 2.5, first_frame_s  # measured 0.8 s; 3.5 s before frames were paced


@pytest.mark.slow
@needs_rtsp
def test_frames_of_another_size_are_resized(server: RtspServer, publisher: RtspPublisher, clip: MotionClip) -> None:
    with Feeder(clip, publisher, scale=2) as feeder:  # pushes 1280x960 into a 640x480 path
        frames = pull(server.url(publisher.path), 15)
    scores = []
    for _, image in frames:
        assert image.shape == (480, 640, 3)
        frame_id = read_frame_id(image)
        if frame_id is not None:
            expected = cv2.resize(feeder.reference(frame_id), (640, 480), interpolation=cv2.INTER_AREA)
            scores.append(psnr(image, expected))
    assert len(scores) >= 12 and min(scores) > 25.0, scores


@pytest.mark.slow
@needs_rtsp
def test_two_clients_at_once(server: RtspServer, publisher: RtspPublisher, clip: MotionClip) -> None:
    url = server.url(publisher.path)
    results: list[list[tuple[float, Image]]] = [[], []]
    errors: list[BaseException] = []
    have_frames = [threading.Event(), threading.Event()]
    release = threading.Event()

    def client(k: int) -> None:
        def enough(n: int) -> None:
            if n == 20:
                have_frames[k].set()
                release.wait(20)

        try:
            results[k] = pull(url, 20, on_frame=enough)
        except BaseException as exc:
            errors.append(exc)
            have_frames[k].set()

    with Feeder(clip, publisher):
        threads = [threading.Thread(target=client, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        try:
            assert all(e.wait(30) for e in have_frames)
            assert not errors, errors
            assert wait_for(lambda: server.client_count(publisher.path) == 2, 5.0)
            assert server.client_count() >= 2
        finally:
            release.set()
            for t in threads:
                t.join()
    assert not errors, errors
    for frames in results:
        assert len(frames) == 20
        ids = [i for _, image in frames if (i := read_frame_id(image)) is not None]
        assert len(ids) >= 18
    assert wait_for(lambda: server.client_count(publisher.path) == 0, 5.0)


@pytest.mark.slow
@needs_rtsp
def test_clients_that_come_right_after_each_other_are_served(
    server: RtspServer, publisher: RtspPublisher, clip: MotionClip
) -> None:
    # gst-rtsp-server refuses (503) a client that comes while a shared media shuts down; the
    # publisher keeps its media, so a client reconnecting at once is served.
    with Feeder(clip, publisher):
        for _ in range(3):
            ((_, image),) = pull(server.url(publisher.path), 1)
            assert read_frame_id(image) is not None


@pytest.mark.slow
@pytest.mark.alone
@needs_rtsp
def test_ingest_processes_and_republishes(server: RtspServer, clip: MotionClip) -> None:
    source = server.publish("camera", 640, 480, FPS)
    output = server.publish("flipped", 640, 480, FPS)
    states: list[str] = []

    def flip(batch: list[Image]) -> list[Image]:
        return [np.ascontiguousarray(image[:, ::-1]) for image in batch]

    try:
        with Feeder(clip, source) as feeder:
            worker = IngestWorker(server.url("camera"), flip, output, on_state=states.append)
            worker.start()
            try:
                frames = pull(server.url("flipped"), 20)
                stats = worker.stats()
            finally:
                assert worker.stop(timeout=10.0)
    finally:
        source.close()
        output.close()

    assert states[0] == "running" and states[-1] == "stopped" and worker.state == "stopped"
    assert stats.state == "running" and stats.frames_in >= 10 and stats.frames_out >= 10
    assert stats.process_errors == 0
    flipped_scores, unflipped_scores = [], []
    for _, image in frames:
        frame_id = read_frame_id(cv2.flip(image, 1))
        if frame_id is not None:
            flipped_scores.append(psnr(image, cv2.flip(feeder.reference(frame_id), 1)))
            unflipped_scores.append(psnr(image, feeder.reference(frame_id)))
    assert len(flipped_scores) >= 12
    assert min(flipped_scores) > 25.0, flipped_scores
    assert max(unflipped_scores) < min(flipped_scores) - 5.0


@pytest.mark.slow
@needs_rtsp
def test_ingest_reconnects_when_the_source_comes_back(clip: MotionClip) -> None:
    states: list[str] = []
    with RtspServer(port=0) as source_server:
        source = source_server.publish("camera", 640, 480, FPS)
        worker = IngestWorker(
            source_server.url("camera"),
            lambda batch: batch,
            None,
            on_state=states.append,
            reconnect_initial_s=0.2,
            reconnect_max_s=1.0,
        )
        with Feeder(clip, source):
            worker.start()
            try:
                assert wait_for(lambda: worker.state == "running" and worker.stats().frames_out >= 10, 20.0)
                source_server.stop()
                assert wait_for(lambda: worker.state == "reconnecting", 15.0), worker.stats()
                assert worker.stats().last_error
                frames_before = worker.stats().frames_in
                source_server.start()  # same port, same path
                assert wait_for(lambda: worker.state == "running", 20.0), worker.stats()
                assert wait_for(lambda: worker.stats().frames_in >= frames_before + 10, 10.0)
            finally:
                assert worker.stop(timeout=10.0)
                source.close()
    stats = worker.stats()
    assert stats.reconnects >= 1
    assert states[:3] == ["running", "reconnecting", "running"], states
    assert states[-1] == "stopped"


@needs_rtsp
@pytest.mark.parametrize("where", ["closed-port", "unknown-path"])
def test_ingest_of_an_unreachable_url_keeps_retrying(server: RtspServer, where: str) -> None:
    url = f"rtsp://127.0.0.1:{free_port()}/nothing" if where == "closed-port" else server.url("not-published")
    worker = IngestWorker(url, lambda batch: batch, None, reconnect_initial_s=0.1, reconnect_max_s=0.4)
    worker.start()
    try:
        assert wait_for(lambda: worker.stats().reconnects >= 2, 20.0), worker.stats()
        stats = worker.stats()
        assert stats.state == "reconnecting" and stats.last_error and stats.frames_in == 0
    finally:
        assert worker.stop(timeout=10.0)
    assert worker.state == "stopped"


@pytest.mark.parametrize(
    ("where", "error"), [("missing-file", "no such file"), ("unknown-scheme", "ProtocolNotFoundError")]
)
def test_ingest_of_a_source_that_cannot_work_fails(tmp_path: Path, where: str, error: str) -> None:
    url = str(tmp_path / "missing.mp4") if where == "missing-file" else "nosuchscheme://127.0.0.1/x"
    worker = IngestWorker(url, lambda batch: batch, None)
    worker.start()
    assert wait_for(lambda: worker.state == "failed", 10.0)
    assert error in (worker.stats().last_error or "")
    assert worker.stop(timeout=5.0)
    assert worker.state == "failed"


def test_ingest_of_a_file_reads_every_frame(tmp_path: Path) -> None:
    clip = make_motion_clip(load_sample("astronaut"), size=(320, 240), frames=24, fps=FPS)
    path = tmp_path / "clip.mp4"
    write_clip(clip, path, audio_tone_hz=None)
    seen: list[Image] = []
    states: list[str] = []

    def keep(batch: list[Image]) -> list[Image]:
        seen.extend(batch)
        return batch

    worker = IngestWorker(str(path), keep, None, on_state=states.append, loop_file=False)
    worker.start()
    assert wait_for(lambda: worker.state == "stopped", 15.0), worker.stats()
    stats = worker.stats()
    assert stats.frames_in == 24 and stats.frames_out == len(seen) and stats.frames_out >= 1
    assert stats.frames_in == stats.frames_out + stats.dropped
    assert states == ["running", "stopped"]
    assert all(image.shape == (240, 320, 3) for image in seen)
    assert max(psnr(seen[-1], frame) for frame in clip.frames[-3:]) > 30.0


def test_rtsp_is_reported_off_without_gstreamer() -> None:
    code = (
        "import sys\n"
        "sys.modules['gi'] = None\n"
        "from app.errors import UserError\n"
        "from app.media.rtsp_in import IngestWorker\n"
        "from app.egress.rtsp import RtspServer\n"
        "server = RtspServer()\n"
        "print('available:', server.available)\n"
        "print('reason:', server.unavailable_reason)\n"
        "try:\n"
        "    server.publish('x', 640, 480, 30)\n"
        "except UserError as exc:\n"
        "    print('refused:', exc)\n"
        "server.stop()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "available: False" in out.stdout
    assert "reason: PyGObject is not installed: apt-get install" in out.stdout
    assert "refused: RTSP is not available: PyGObject is not installed" in out.stdout
