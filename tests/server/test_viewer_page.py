"""The OBS viewer page in a real browser: headless Chromium opens /view/{session}, shows the session's swapped
output pulled over WHEP (stamped frame ids match what the session produced) and reconnects on its own."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import cv2
import httpx
import numpy as np
import pytest

from app.auth.keys import KeyStore
from app.auth.settings import AccessSettings
from app.bench.rtc_client import RtcClient, read_stamp
from app.live.frame import OutputFrame
from app.media.clips import MotionClip
from app.pipeline.pipeline import FramePipeline
from app.pipeline.types import Image
from app.settings import PipelineSettings
from tests.server.credentials import bearer
from tests.server.harness import RunningServer, server_settings, start_server, upload
from tests.server.test_browser import CHROMIUM, chromium_args, keep_loopback_candidates, sync_playwright

if TYPE_CHECKING:
    from playwright.sync_api import Route

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (apt chromium)"),
    pytest.mark.skipif(sync_playwright is None, reason="needs the playwright Python package (pip playwright)"),
]

ARGS = chromium_args()


class Sender:
    """An aiortc client streaming a stamped face clip into a session from its own thread and loop."""

    def __init__(
        self, server: RunningServer, identity: str, clip: MotionClip, headers: dict[str, str] | None = None
    ) -> None:
        self.location: str | None = None
        self._headers = headers or {}
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=asyncio.run, args=(self._run(server, identity, clip),), daemon=True)

    async def _run(self, server: RunningServer, identity: str, clip: MotionClip) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        client = RtcClient(clip.frames, fps=15)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30, headers=self._headers) as http:
            await client.connect(http, f"/v1/sessions?identity={identity}")
            self.location = client.location
            await client.wait_frames(3, 90)
            self._ready.set()
            await self._stop.wait()
            await client.close()

    def __enter__(self) -> Sender:
        self._thread.start()
        assert self._ready.wait(120), "the session did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


def grab(page: object) -> Image:
    data_url = page.evaluate(  # type: ignore[attr-defined]
        """() => {
            const video = document.getElementById("video");
            const canvas = document.createElement("canvas");
            canvas.width = video.videoWidth;
            canvas.height = video.videoHeight;
            canvas.getContext("2d").drawImage(video, 0, 0);
            return canvas.toDataURL("image/png");
        }"""
    )
    png = base64.b64decode(data_url.split(",", 1)[1])
    image = cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None and image.size
    return image


def test_viewer_page_shows_the_session_and_reconnects(server: RunningServer, tom_png: bytes, clip: MotionClip) -> None:
    response = upload(server.base_url, tom_png, "tom.png")
    assert response.status_code == 201, response.text
    output_at: dict[int, float] = {}

    def record(frame: OutputFrame) -> None:
        frame_id = read_stamp(frame.image)
        if frame_id is not None:
            output_at.setdefault(frame_id, time.monotonic())

    assert sync_playwright is not None
    with Sender(server, response.json()["id"], clip) as sender:
        assert sender.location is not None
        session_id = sender.location.rsplit("/", 1)[1]
        assert server.state.sessions is not None and server.state.loop is not None
        session = server.state.sessions.get(session_id)
        server.state.loop.call_soon_threadsafe(session.output_listeners.append, record)
        viewers_url = f"{server.base_url}/v1/sessions/{session_id}/whep"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
            try:
                page = browser.new_page(viewport={"width": 640, "height": 480})
                errors: list[str] = []
                page.on("pageerror", lambda error: errors.append(str(error)))
                page.route("**/whep", keep_loopback_candidates)
                page.goto(f"{server.base_url}/view/{session_id}?token=viewer-token")
                page.wait_for_function("() => window.swapcastViewer.framesDecoded >= 15", timeout=60_000)
                assert page.evaluate("window.swapcastViewer.state") == "live"
                style = page.evaluate(
                    """() => [getComputedStyle(document.body).backgroundColor,
                              getComputedStyle(document.getElementById('video')).objectFit,
                              document.getElementById('video').controls]"""
                )
                assert style == ["rgba(0, 0, 0, 0)", "contain", False]

                latencies = []
                ids = []
                for _ in range(8):
                    image = grab(page)
                    grabbed = time.monotonic()
                    frame_id = read_stamp(image)
                    assert frame_id is not None and frame_id in output_at, frame_id
                    ids.append(frame_id)
                    latencies.append((grabbed - output_at[frame_id]) * 1000.0)
                    time.sleep(0.2)
                assert ids == sorted(ids) and len(set(ids)) >= 4, ids
                print(f"session output -> Chromium viewer page (grab included): median {np.median(latencies):.0f} ms")

                # The viewer's resource is removed on the server: the page notices and connects again.
                (viewer,) = httpx.get(viewers_url).json()["viewers"]
                assert httpx.delete(f"{viewers_url}/{viewer['id']}").status_code == 200
                page.wait_for_function("() => window.swapcastViewer.connects >= 2", timeout=30_000)
                page.wait_for_function("() => window.swapcastViewer.framesDecoded >= 10", timeout=30_000)
                # The reconnected video element has a picture before it is read back.
                page.wait_for_function("() => document.getElementById('video').videoWidth > 0", timeout=30_000)
                (again,) = httpx.get(viewers_url).json()["viewers"]
                assert again["id"] != viewer["id"]
                page.wait_for_function("() => window.swapcastViewer.message === 'reconnected · live'", timeout=30_000)
                assert page.title().endswith("reconnected · live")
                assert read_stamp(grab(page)) in output_at
                assert errors == []
            finally:
                browser.close()


def test_the_obs_recipe_a_viewer_token_in_the_page_url_shows_the_session_on_a_keyed_server(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], tom_png: bytes, clip: MotionClip
) -> None:
    """As the OBS guide says: mint a viewer token for the session, put the answer's `view_url` into the Browser
    Source; the page plays, and revoking the token stops it."""
    keys_file = tmp_path / "keys.json"
    streamer = KeyStore(keys_file).create("streamer", ["sessions", "identities:write", "identities:read"])[1]
    settings = server_settings(tmp_path / "identities", access=AccessSettings(keys_file=keys_file))
    with start_server(settings, pipeline_factory) as server:
        identity = upload(server.base_url, tom_png, headers=bearer(streamer)).json()["id"]
        assert sync_playwright is not None
        with Sender(server, identity, clip, bearer(streamer)) as sender:
            assert sender.location is not None
            session = sender.location.rsplit("/", 1)[1]
            minted = httpx.post(f"{server.base_url}/v1/sessions/{session}/viewer-tokens", headers=bearer(streamer))
            assert minted.status_code == 201, minted.text
            view_url = minted.json()["view_url"]
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
                try:
                    page = browser.new_page(viewport={"width": 640, "height": 480})
                    offers: list[float] = []

                    def count_offers(route: Route) -> None:
                        if route.request.method == "POST":
                            offers.append(time.monotonic())
                        keep_loopback_candidates(route)

                    page.route("**/whep", count_offers)
                    page.goto(f"{server.base_url}{view_url}")
                    page.wait_for_function("() => window.swapcastViewer.framesDecoded >= 10", timeout=60_000)
                    assert read_stamp(grab(page)) is not None
                    token_id = minted.json()["id"]
                    revoked = httpx.delete(
                        f"{server.base_url}/v1/sessions/{session}/viewer-tokens/{token_id}", headers=bearer(streamer)
                    )
                    assert revoked.status_code == 204
                    # The viewer ends; the page's next try is refused, and it waits long before the one after.
                    page.wait_for_function("() => (window.swapcastViewer.error || '').includes('401')", timeout=30_000)
                    refused = len(offers)
                    assert "reconnecting (attempt" in page.evaluate("window.swapcastViewer.message")
                    time.sleep(5)
                    assert len(offers) == refused, "the page asked again at once after a 401"
                finally:
                    browser.close()
