"""The browser extension in headless Chromium against a real server on 127.0.0.1: a call page on loopback lists
the "swapcast" camera, getUserMedia on it gives the channel's swapped frames (stamped by a publisher, read back
in the page in order), the page sends them over a WebRTC call to its far side, the viewer ends and reconnects as
it should, a wrong token and a server that never answers are refused with clear messages in bounded time, and the
extension holds no other site.

Chrome asks the user to grant the server's and the sites' origins when the options are saved; a headless browser
shows no prompt to accept, so these tests load a copy of the extension whose manifest lists exactly the test
server's and the call page's origins as required host permissions (granted at install, so the options page's
request is answered yes at once). Nothing else in the copy differs; `tests/extension/test_package.py` checks that
the shipped manifest requires no site at all."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cv2
import httpx
import numpy as np
import pytest

from app.auth.keys import KeyStore
from app.auth.settings import AccessSettings
from app.bench.rtc_client import RtcClient, read_stamp
from app.media.clips import MotionClip
from app.pipeline.pipeline import FramePipeline
from app.pipeline.types import Image
from app.settings import PipelineSettings
from tests.extension.extension_files import copy_with_host_permissions, extension_id
from tests.helpers import wait_for
from tests.server.credentials import bearer
from tests.server.harness import RunningServer, server_settings, start_server, upload
from tests.server.test_browser import CHROMIUM, chromium_args, keep_loopback_candidates, sync_playwright

if TYPE_CHECKING:
    from playwright.sync_api import BrowserContext, Page

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (apt chromium)"),
    pytest.mark.skipif(sync_playwright is None, reason="needs the playwright Python package (pip playwright)"),
]

CALL_PAGE = Path(__file__).resolve().parents[1] / "extension" / "call_page.html"
CHANNEL = "call"
FPS = 15
# Where the test leaves a screenshot of the call page in a call (the docs' picture), when set.
SCREENSHOT_ENV = "SWAPCAST_EXTENSION_SCREENSHOT"


class Publisher:
    """An aiortc client streaming the stamped face clip into the channel from its own thread and loop; the
    time each stamped frame went to the encoder is `client.result.sent_at` (monotonic clock)."""

    def __init__(self, server: RunningServer, key: str, identity: str, clip: MotionClip) -> None:
        self.client: RtcClient | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        run = self._run(server.base_url, key, identity, clip)
        self._thread = threading.Thread(target=asyncio.run, args=(run,), daemon=True)

    async def _run(self, base_url: str, key: str, identity: str, clip: MotionClip) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self.client = RtcClient(clip.frames, fps=FPS)
        async with httpx.AsyncClient(base_url=base_url, timeout=30, headers=bearer(key)) as http:
            await self.client.connect(http, f"/v1/sessions?identity={identity}&channel={CHANNEL}")
            await self.client.wait_frames(3, 90)
            self._ready.set()
            await self._stop.wait()
            await self.client.close()

    def start(self) -> Publisher:
        self._thread.start()
        assert self._ready.wait(120), "the publisher's session did not start"
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


HANG_S = 15.0  # longer than the extension waits for the server's answer (10 s)


class CallPageHandler(SimpleHTTPRequestHandler):
    """Serves the call page; under /hang/ it is a server that takes every request and answers too late."""

    def do_POST(self) -> None:
        if not self.path.startswith("/hang/"):
            self.send_error(404)
            return
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        time.sleep(HANG_S)
        with contextlib.suppress(OSError):  # the browser gave up long ago
            self.send_error(504)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class Rig:
    server: RunningServer
    owner_key: str
    viewer_token: str
    publisher: Publisher
    page_origin: str
    context: BrowserContext
    extension: str  # chrome-extension://ID
    requests: list[tuple[str, str]]  # (method, URL) of every request to the channel's WHEP URL

    def configure(
        self, token: str | None = None, server: str | None = None, sound: str = "microphone", always: bool = False
    ) -> str:
        """Saves the options as a user would (the form, then Save); the status line it ends with."""
        options = self.context.new_page()
        try:
            options.goto(f"{self.extension}/options.html")
            options.check(f"input[name=sound][value={sound}]")
            options.set_checked("#always", always)
            options.fill("#server", server or self.server.base_url)
            options.fill("#channel", CHANNEL)
            options.fill("#token", token or self.viewer_token)
            options.fill("#sites", self.page_origin)
            options.click("#save")
            options.wait_for_function("() => document.getElementById('status').textContent !== ''", timeout=15_000)
            return options.text_content("#status") or ""
        finally:
            options.close()

    @contextmanager
    def configured(self, **changes: Any) -> Iterator[None]:
        """The options saved with `changes` (see `configure`), and saved as before afterwards."""
        assert self.configure(**changes).startswith("Saved."), "the options were not saved"
        try:
            yield
        finally:
            assert self.configure().startswith("Saved."), "the options were not put back"

    def viewer_url(self, viewer_id: str) -> str:
        return f"{self.server.base_url}/v1/channels/{CHANNEL}/whep/{viewer_id}"

    @contextmanager
    def call_page(self, *, camera: bool = False) -> Iterator[Page]:
        """The call page in a new tab, closed afterwards; with `camera`, the swapcast camera opened in it."""
        page = self.context.new_page()
        try:
            page.goto(f"{self.page_origin}/call_page.html")
            if camera:
                opened = page.evaluate("openCamera('swapcast-camera')")
                assert opened["ok"] and opened["label"] == "swapcast", opened
            yield page
        finally:
            page.close()

    def in_extension(self, expression: str) -> Any:
        """Evaluates `expression` in the extension's options page (where chrome.* is)."""
        page = self.context.new_page()
        try:
            page.goto(f"{self.extension}/options.html")
            return page.evaluate(expression)
        finally:
            page.close()

    def sent(self, page: Page, method: str, url: str, within_s: float = 10.0) -> bool:
        """Whether the browser sent `method url` (events reach this thread only while Playwright is called)."""
        deadline = time.monotonic() + within_s
        while (method, url) not in self.requests and time.monotonic() < deadline:
            page.wait_for_timeout(100)
        return (method, url) in self.requests

    def viewers(self) -> list[dict[str, Any]]:
        listing = httpx.get(f"{self.server.base_url}/v1/channels/{CHANNEL}/whep", headers=bearer(self.owner_key))
        assert listing.status_code == 200, listing.text
        return list(listing.json()["viewers"])


@pytest.fixture(scope="module")
def rig(
    pipeline_factory: Callable[[PipelineSettings], FramePipeline],
    tom_png: bytes,
    clip: MotionClip,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Rig]:
    """A keyed server with the channel and its publisher, the call page's server, and Chromium with the
    extension loaded and its options saved."""
    root = tmp_path_factory.mktemp("extension")
    keys_file = root / "keys.json"
    owner = KeyStore(keys_file).create("streamer", ["sessions", "identities:write", "identities:read"])[1]
    extension = f"chrome-extension://{extension_id()}"
    # The server lets the extension's service worker in by its pinned origin (docs/guides/browser-extension.md).
    access = AccessSettings(keys_file=keys_file, cors_origins=[extension])
    page_server = ThreadingHTTPServer(("127.0.0.1", 0), partial(CallPageHandler, directory=str(CALL_PAGE.parent)))
    threading.Thread(target=page_server.serve_forever, daemon=True).start()
    page_origin = f"http://127.0.0.1:{page_server.server_address[1]}"
    assert sync_playwright is not None
    with start_server(server_settings(root / "identities", access=access), pipeline_factory) as server:
        made = httpx.post(
            f"{server.base_url}/v1/channels",
            json={"name": CHANNEL, "width": 640, "height": 480, "fps": FPS},
            headers=bearer(owner),
        )
        assert made.status_code == 201, made.text
        identity = upload(server.base_url, tom_png, headers=bearer(owner)).json()["id"]
        publisher = Publisher(server, owner, identity, clip).start()
        unpacked = copy_with_host_permissions(root / "unpacked", [f"{server.base_url}/*", f"{page_origin}/*"])
        args = chromium_args(
            None,
            f"--disable-extensions-except={unpacked}",
            f"--load-extension={unpacked}",
            "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream",
            # Real addresses in candidates (not mDNS names), so that only the loopback ones can be kept.
            "--disable-features=WebRtcHideLocalIpsWithMdns",
        )
        try:
            with sync_playwright() as p:
                context = p.chromium.launch_persistent_context(
                    str(root / "profile"),
                    executable_path=str(CHROMIUM),
                    headless=True,
                    args=args,
                    ignore_default_args=["--disable-extensions"],
                )
                try:
                    # The WHEP offers (from the extension's service worker) reach the server with only their
                    # 127.0.0.1 candidates, so media stays on loopback.
                    context.route("**/whep", keep_loopback_candidates)
                    requests: list[tuple[str, str]] = []
                    context.on(
                        "request",
                        lambda r: requests.append((r.method, r.url)) if f"/{CHANNEL}/whep" in r.url else None,
                    )
                    if not context.service_workers:
                        context.wait_for_event("serviceworker", timeout=30_000)
                    token = made.json()["viewer_token"]
                    rig = Rig(server, owner, token, publisher, page_origin, context, extension, requests)
                    assert rig.configure().startswith("Saved."), "the options were not saved"
                    yield rig
                finally:
                    context.close()
        finally:
            publisher.stop()
            page_server.shutdown()


def grab(page: Page, video_id: str) -> Image:
    data_url = page.evaluate(
        """(id) => {
            const video = document.getElementById(id);
            const canvas = Object.assign(document.createElement("canvas"), {width: 640, height: 480});
            canvas.getContext("2d").drawImage(video, 0, 0);
            return canvas.toDataURL("image/png");
        }""",
        video_id,
    )
    image = cv2.imdecode(np.frombuffer(base64.b64decode(data_url.split(",", 1)[1]), np.uint8), cv2.IMREAD_COLOR)
    assert image is not None and image.shape[:2] == (480, 640)
    return image


def face_and_rest_diff(a: Image, b: Image, box: np.ndarray) -> tuple[float, float]:
    """The mean difference inside the face box's middle, and outside the box (the stamp left out)."""
    diff = np.abs(a.astype(np.int16) - b.astype(np.int16)).mean(axis=2)
    x1, y1, x2, y2 = (int(v) for v in box)
    dx, dy = (x2 - x1) // 4, (y2 - y1) // 4
    face = float(diff[y1 + dy : y2 - dy, x1 + dx : x2 - dx].mean())
    rest = np.ones(diff.shape, bool)
    rest[max(0, y1) : y2, max(0, x1) : x2] = False
    rest[:48, :144] = False
    return face, float(diff[rest].mean())


def percentiles(values: list[float]) -> str:
    p50, p95 = np.percentile(values, [50, 95])
    return f"p50 {p50:.0f} / p95 {p95:.0f} ms over {len(values)} frames"


def first_seen(frames: list[list[float]]) -> dict[int, float]:
    seen: dict[int, float] = {}
    for frame_id, at_ms in frames:
        seen.setdefault(int(frame_id), at_ms / 1000.0)
    return seen


def test_the_call_page_lists_the_swapcast_camera(rig: Rig) -> None:
    with rig.call_page() as page:
        cameras = page.evaluate("listCameras()")
    assert {"deviceId": "swapcast-camera", "label": "swapcast"} in cameras
    assert len(cameras) == 2, cameras  # Chromium's fake camera, then swapcast


def test_the_camera_gives_the_channels_swapped_frames_in_order_and_a_call_carries_them(
    rig: Rig, clip: MotionClip, clip_faces: list[np.ndarray]
) -> None:
    with rig.call_page(camera=True) as page:
        assert len(rig.viewers()) == 1  # the page's WHEP viewer, on the server
        page.evaluate("startCall()")
        # 10 s of the call's frames (at 15 fps) to measure over.
        assert page.wait_for_function("() => call.far.frames.length >= 150", timeout=90_000)
        clock = time.time() - time.monotonic()  # the publisher's monotonic times on the page's clock
        call = page.evaluate("call")
        local = grab(page, "local")
        shot = os.environ.get(SCREENSHOT_ENV)
        if shot:  # the list, the camera's picture and the far side's
            page.evaluate("listCameras()")
            page.set_viewport_size({"width": 680, "height": 400})
            page.screenshot(path=shot)
    assert rig.publisher.client is not None
    sent_at = {frame_id: at + clock for frame_id, at in rig.publisher.client.result.sent_at.items()}

    for side in ("local", "far"):
        ids = [int(frame_id) for frame_id, _ in call[side]["frames"]]
        assert len(set(ids)) >= 30, (side, ids)
        assert ids == sorted(ids), (side, ids)  # in order (ids wrap only after 4096 frames: 4.5 min)
        assert set(ids) <= set(sent_at), side  # every frame shown is one the publisher sent

    # Swapped: the camera's frame differs from the publisher's in the face, hardly anywhere else.
    frame_id = read_stamp(local)
    assert frame_id is not None
    sent = clip.frames[frame_id % len(clip.frames)]
    face, rest = face_and_rest_diff(local, sent, clip_faces[frame_id % len(clip_faces)])
    assert face > 12 and face > 3 * rest, (face, rest)
    print(f"camera frame {frame_id} against the publisher's: face differs by {face:.1f}, the rest by {rest:.1f}")

    for side, label in (("local", "publisher -> getUserMedia track"), ("far", "publisher -> far side")):
        shown = first_seen(call[side]["frames"])
        latencies = [(at - sent_at[i]) * 1000.0 for i, at in shown.items() if i in sent_at]
        print(f"glass-to-glass, {label} (rendered): {percentiles(latencies)}")


def test_a_dropped_viewer_reconnects_on_the_same_track_and_stopping_it_ends_the_viewer(rig: Rig) -> None:
    with rig.call_page(camera=True) as page:
        page.evaluate("startCall()")
        page.wait_for_function("() => call.far.frames.length >= 10", timeout=60_000)
        (viewer,) = rig.viewers()
        # The server ends the viewer (as a restart or a network drop would): the link connects again by itself.
        assert httpx.delete(rig.viewer_url(viewer["id"]), headers=bearer(rig.owner_key)).status_code == 200
        page.wait_for_function("() => swapcastCamera.links()[0].connects >= 2", timeout=60_000)
        before = page.evaluate("call.far.frames.length")
        # The far side keeps receiving on the track it was given: no new getUserMedia, no renegotiation.
        page.wait_for_function(f"() => call.far.frames.length >= {before + 15}", timeout=60_000)
        (last,) = rig.viewers()
        assert last["id"] != viewer["id"]

        page.evaluate("hangUp()")  # stops the tracks: the extension ends its viewer on the server
        assert wait_for(lambda: rig.viewers() == [], 10), rig.viewers()
        assert rig.sent(page, "DELETE", rig.viewer_url(last["id"]))


def test_leaving_the_page_ends_the_viewer(rig: Rig) -> None:
    with rig.call_page(camera=True) as page:
        (viewer,) = rig.viewers()
        page.goto("about:blank")  # the tab navigates away without stopping the track
        assert wait_for(lambda: rig.viewers() == [], 10), rig.viewers()
        assert rig.sent(page, "DELETE", rig.viewer_url(viewer["id"]))


def test_the_sound_is_the_microphone_or_the_channels_as_chosen(rig: Rig) -> None:
    ask = "navigator.mediaDevices.getUserMedia({video: {deviceId: 'swapcast-camera'}, audio: true})"
    describe = ".then((s) => [...s.getVideoTracks(), ...s.getAudioTracks()].map((t) => [t.kind, t.label]))"
    with rig.call_page() as page:
        tracks = page.evaluate(ask + describe)
    assert tracks[0] == ["video", "swapcast"] and len(tracks) == 2, tracks
    assert tracks[1][0] == "audio" and tracks[1][1].startswith("Fake"), tracks  # Chromium's fake microphone
    with rig.configured(sound="channel"), rig.call_page() as page:
        tracks = page.evaluate(ask + describe)
    assert tracks == [["video", "swapcast"], ["audio", "swapcast (channel sound)"]], tracks


def test_any_camera_request_gets_swapcast_only_when_always_is_ticked(rig: Rig) -> None:
    any_camera = "navigator.mediaDevices.getUserMedia({video: true}).then((s) => s.getVideoTracks()[0].label)"
    with rig.call_page() as page:
        assert page.evaluate(any_camera) == "fake_device_0"  # Chromium's own camera, as without the extension
        assert page.evaluate("listCameras()")[-1]["label"] == "swapcast"
    with rig.configured(always=True), rig.call_page() as page:
        assert page.evaluate(any_camera) == "swapcast"
        assert page.evaluate("listCameras()")[0]["label"] == "swapcast"  # first: the one a page picks by default


def test_the_extension_holds_only_the_server_and_the_call_page(rig: Rig) -> None:
    granted = rig.in_extension("chrome.permissions.getAll()")
    # The server (the service worker's requests) and the one site the options list (the content scripts).
    assert sorted(granted["origins"]) == sorted([f"{rig.server.base_url}/*", f"{rig.page_origin}/*"])
    assert sorted(granted["permissions"]) == ["scripting", "storage"]
    scripts = rig.in_extension("chrome.scripting.getRegisteredContentScripts()")
    assert {(s["id"], s["world"]) for s in scripts} == {("swapcast-page", "MAIN"), ("swapcast-bridge", "ISOLATED")}
    assert all(s["matches"] == [f"{rig.page_origin}/*"] and s["runAt"] == "document_start" for s in scripts)
    # The token stays in the extension: no message the page can read carries it.
    with rig.call_page(camera=True) as page:
        messages = page.evaluate("call.messages")
        page.evaluate("hangUp()")
    assert any('"kind":"response"' in m for m in messages) and any('"kind":"config"' in m for m in messages)
    assert not [m for m in messages if rig.viewer_token in m or "Bearer" in m]


def refused_camera(rig: Rig, **changes: str) -> tuple[dict[str, Any], float]:
    """What getUserMedia on the swapcast camera answers with `changes` to the options, and in how many seconds."""
    with rig.configured(**changes), rig.call_page() as page:
        started = time.monotonic()
        answer = page.evaluate("openCamera('swapcast-camera')")
        return answer, time.monotonic() - started


def test_a_wrong_token_rejects_getusermedia_with_a_clear_message_in_bounded_time(rig: Rig) -> None:
    refused, seconds = refused_camera(rig, token="vt_not-the-channels-token")
    assert seconds < 25  # the extension's own bound is 20 s; a refusal comes at once
    assert refused["ok"] is False and refused["name"] == "NotAllowedError", refused
    assert refused["message"].startswith("swapcast: the server refused the viewer token"), refused
    assert "401" in refused["message"] and f'channel "{CHANNEL}"' in refused["message"], refused
    assert rig.viewers() == []


def test_a_server_that_never_answers_rejects_getusermedia_in_bounded_time(rig: Rig) -> None:
    # A path on the call page's own server (an origin the extension holds) that takes the offer and says nothing.
    refused, seconds = refused_camera(rig, server=f"{rig.page_origin}/hang")
    assert seconds < HANG_S  # the extension gave up first
    assert refused["ok"] is False and refused["name"] == "NotReadableError", refused
    assert refused["message"] == (
        f'swapcast: cannot reach the server ({rig.page_origin}/hang, channel "{CHANNEL}"): no answer within 10 s'
    )
