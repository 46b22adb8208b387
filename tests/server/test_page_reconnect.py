"""The streamer's page in a real browser connects again by itself: the server ends its session, or the network
goes silent for longer than the grace, and the page opens a new one with the same identity, channel and camera
(backing off, honouring Retry-After), back into the same channel; or, when the new session is refused for good
(the identity deleted) or another device took the channel over, it stops and says why without trying again."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.bench.rtc_client import RtcClient
from app.media.clips import MotionClip
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.server.harness import PAGE_HEADERS, RunningServer, server_settings, start_server, upload
from tests.server.test_browser import (
    CHROMIUM,
    camera_still,
    chromium_args,
    keep_loopback_candidates,
    sync_playwright,
    write_y4m,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (apt chromium)"),
    pytest.mark.skipif(sync_playwright is None, reason="needs the playwright Python package (pip playwright)"),
]

# Counts the page's camera requests: a reconnection must reuse the stream it has.
COUNT_CAMERA_REQUESTS = """
    window.cameraRequests = 0;
    const getUserMedia = navigator.mediaDevices.getUserMedia.bind(navigator.mediaDevices);
    navigator.mediaDevices.getUserMedia = (constraints) => {
        window.cameraRequests += 1;
        return getUserMedia(constraints);
    };
"""


class SessionPosts:
    """Every `POST /v1/sessions` the page makes (when, and the URL), sent on with loopback candidates only;
    `refuse_next` answers the next one with a 503 and `Retry-After` instead, as a full server does."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, str]] = []
        self.refuse_next: int | None = None  # Retry-After seconds
        self.refused_at: float | None = None

    def __call__(self, route: Any) -> None:
        request = route.request
        if request.method != "POST":
            route.continue_()
            return
        self.sent.append((time.monotonic(), request.url))
        if self.refuse_next is not None:
            seconds, self.refuse_next = self.refuse_next, None
            self.refused_at = time.monotonic()
            route.fulfill(status=503, headers={"Retry-After": str(seconds)}, json={"detail": "no free session slot"})
            return
        keep_loopback_candidates(route)


def camera(detector: RetinaFaceDetector, tmp_path: Path) -> Path:
    still, _ = camera_still(detector)
    y4m = (tmp_path / "camera.y4m").resolve()  # Chromium needs an absolute path
    write_y4m(y4m, still)
    return y4m


def open_page(
    browser: Any, server: RunningServer, posts: SessionPosts, identity: str, errors: list[str], query: str = ""
) -> Any:
    """The page, loaded, with `identity` chosen; its uncaught errors go to `errors`."""
    page = browser.new_page()
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.add_init_script(COUNT_CAMERA_REQUESTS)
    page.route("**/v1/sessions?identity=*", posts)
    page.goto(f"{server.base_url}/{query}")
    page.wait_for_selector("#server-status:text-matches('ready')", timeout=30_000)
    page.wait_for_selector(f"#identity-{identity}", timeout=30_000)
    page.check(f"#identity-{identity}")
    return page


def stream_live(page: Any) -> str:
    """Start the camera, wait for swapped frames both ways; the session's URL."""
    page.click("#start-button")
    page.wait_for_function(
        "() => window.swapcast.state === 'live' || window.swapcast.state === 'failed'", timeout=30_000
    )
    assert page.evaluate("window.swapcast.state") == "live", page.evaluate("window.swapcast.error")
    page.wait_for_function(
        "() => window.swapcast.browser && window.swapcast.browser.framesDecoded >= 15", timeout=60_000
    )
    page.wait_for_function("() => window.swapcast.server && window.swapcast.server.frames_out >= 15", timeout=30_000)
    return str(page.evaluate("window.swapcast.sessionUrl"))


def mouth_mask(server: RunningServer, session_url: str) -> dict[str, Any]:
    options = httpx.get(f"{server.base_url}{session_url}", headers=PAGE_HEADERS).json()["options"]
    return {key: options[key] for key in ("mouth_mask", "mouth_mask_available")}


def make_channel(server: RunningServer, name: str) -> None:
    made = httpx.post(f"{server.base_url}/v1/channels", json={"name": name}, headers=PAGE_HEADERS)
    assert made.status_code == 201, made.text


def channel(server: RunningServer, name: str) -> dict[str, Any]:
    found = httpx.get(f"{server.base_url}/v1/channels/{name}")
    assert found.status_code == 200, found.text
    return dict(found.json())


def session_ids(server: RunningServer) -> set[str]:
    listed = httpx.get(f"{server.base_url}/v1/sessions")
    assert listed.status_code == 200, listed.text
    return {s["id"] for s in listed.json()["sessions"]}


def test_the_page_opens_a_new_session_when_the_server_ends_its_own(
    server: RunningServer, detector: RetinaFaceDetector, tmp_path: Path, tom_png: bytes
) -> None:
    args = chromium_args(camera(detector, tmp_path))
    identity = upload(server.base_url, tom_png, "tom.png").json()["id"]
    make_channel(server, "studio-a")
    posts = SessionPosts()
    assert sync_playwright is not None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=args)
        try:
            errors: list[str] = []
            page = open_page(browser, server, posts, identity, errors, "?channel=studio-a")
            assert page.input_value("#channel-input") == "studio-a"
            first_url = stream_live(page)
            first_id = first_url.rsplit("/", 1)[1]
            assert page.text_content("#session-status") == "live"
            assert len(posts.sent) == 1
            assert channel(server, "studio-a")["publisher"] == f"session/{first_id}"

            # The server ends the session, as its owner's DELETE does; the page's next try finds the server
            # full (503, Retry-After: 3), and the one after gets a session.
            posts.refuse_next = 3
            assert httpx.delete(f"{server.base_url}{first_url}", headers=PAGE_HEADERS).status_code == 204
            page.wait_for_function("() => window.swapcast.state === 'reconnecting'", timeout=15_000)
            page.wait_for_function(
                "() => document.getElementById('session-status').textContent.includes('reconnecting (attempt 2) in')",
                timeout=30_000,
            )
            page.wait_for_function(
                f"() => window.swapcast.state === 'live' && window.swapcast.sessionUrl"
                f" && !window.swapcast.sessionUrl.endsWith('{first_id}')",
                timeout=60_000,
            )
            second_url = str(page.evaluate("window.swapcast.sessionUrl"))
            second_id = second_url.rsplit("/", 1)[1]
            listed = session_ids(server)
            assert second_id in listed and first_id not in listed
            status = page.text_content("#session-status") or ""
            assert "Reconnected" in status, status
            assert page.evaluate("window.swapcast.reconnects") == 1

            # Three tries in all, each with the identity and the channel; the refused one was waited out.
            assert len(posts.sent) == 3, posts.sent
            for _, url in posts.sent:
                assert f"identity={identity}" in url and "channel=studio-a" in url, url
            assert posts.refused_at is not None
            assert posts.sent[2][0] - posts.refused_at >= 2.5, "Retry-After was not honoured"
            stats = httpx.get(f"{server.base_url}{second_url}").json()
            assert stats["identity"] == identity and stats["state"] == "connected"
            assert stats["channel"] == "studio-a"  # back into the same channel, by itself
            assert channel(server, "studio-a")["publisher"] == f"session/{second_id}"

            # Swapped frames flow on the new session, from the same camera stream (asked for once).
            before = stats["frames_out"]
            page.wait_for_function(
                "() => window.swapcast.browser && window.swapcast.browser.framesDecoded >= 15", timeout=60_000
            )
            deadline = time.monotonic() + 30
            while httpx.get(f"{server.base_url}{second_url}").json()["frames_out"] < before + 10:
                assert time.monotonic() < deadline, "no frames on the new session"
                time.sleep(0.5)
            assert page.evaluate("window.cameraRequests") == 1
            assert (
                page.evaluate("document.getElementById('local-video').srcObject.getVideoTracks()[0].readyState")
                == "live"
            )
            assert "channel=studio-a" in page.url

            # Stop is final: the session ends and nothing is tried again.
            page.click("#stop-button")
            page.wait_for_function("() => window.swapcast.state === 'stopped'")
            assert httpx.get(f"{server.base_url}{second_url}").status_code == 404
            time.sleep(3)
            assert len(posts.sent) == 3
            assert second_id not in session_ids(server)
            assert errors == []
        finally:
            browser.close()


def test_the_page_stops_and_says_why_when_the_identity_is_gone(
    server: RunningServer, detector: RetinaFaceDetector, tmp_path: Path, tom_png: bytes
) -> None:
    args = chromium_args(camera(detector, tmp_path))
    identity = upload(server.base_url, tom_png, "tom.png").json()["id"]
    posts = SessionPosts()
    assert sync_playwright is not None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=args)
        try:
            errors: list[str] = []
            page = open_page(browser, server, posts, identity, errors)
            session_url = stream_live(page)

            # Deleting the identity ends its session; the page tries once more, is refused for good, and stops.
            deleted = httpx.delete(f"{server.base_url}/v1/identities/{identity}", headers=PAGE_HEADERS)
            assert deleted.status_code in (200, 204), deleted.text
            page.wait_for_function(
                "() => window.swapcast.state === 'failed' || window.swapcast.state === 'stopped'", timeout=30_000
            )
            assert page.evaluate("window.swapcast.state") == "failed"
            status = page.text_content("#session-status") or ""
            assert "not found" in status and identity in status, status
            assert "reconnecting (attempt" not in status
            assert page.is_disabled("#stop-button")

            # Longer than the first backoff steps together: a page still trying would have tried again by now.
            time.sleep(6)
            assert len(posts.sent) == 2, posts.sent
            assert page.evaluate("window.swapcast.state") == "failed"
            assert session_url.rsplit("/", 1)[1] not in session_ids(server)
            left = httpx.get(f"{server.base_url}/v1/sessions").json()["sessions"]
            assert not any(s["identity"] == identity for s in left), left
            assert page.evaluate("window.cameraRequests") == 1
            assert errors == []
        finally:
            browser.close()


class Silent:
    """A datagram transport that sends nothing; everything else is the real one's."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport

    def sendto(self, data: bytes, addr: Any = None) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def cut_network(server: RunningServer, session_id: str) -> None:
    """The session's UDP goes silent both ways, as when Wi-Fi drops: its sockets neither take nor send a packet.
    The session itself stays open on the server."""

    async def cut() -> None:
        assert server.state.sessions is not None
        session = server.state.sessions.get(session_id)
        for transceiver in session.pc.getTransceivers():
            connection = transceiver.receiver.transport.transport._connection
            for protocol in connection._protocols:
                protocol.datagram_received = lambda data, addr: None
                protocol.transport = Silent(protocol.transport)

    server.call(cut)


def test_the_page_reconnects_after_the_network_stays_silent(
    tmp_path: Path,
    pipeline_factory: Callable[[PipelineSettings], FramePipeline],
    detector: RetinaFaceDetector,
    tom_png: bytes,
) -> None:
    """No answer from the server for longer than the grace: the page gives the connection up and opens a new
    session (a server that ends silent sessions late, so only the browser notices), with the options the user
    chose on the page (here the mouth mask, which the server keeps by default, turned off)."""
    args = chromium_args(camera(detector, tmp_path))
    settings = server_settings(
        tmp_path / "identities",
        media_timeout_s=120.0,
        pipeline=PipelineSettings(engine="classic", mouth_mask=1.0),
    )
    with start_server(settings, pipeline_factory) as server:
        identity = upload(server.base_url, tom_png, "tom.png").json()["id"]
        posts = SessionPosts()
        assert sync_playwright is not None
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=args)
            try:
                errors: list[str] = []
                page = open_page(browser, server, posts, identity, errors)
                first_url = stream_live(page)
                first_id = first_url.rsplit("/", 1)[1]
                assert mouth_mask(server, first_url) == {"mouth_mask": True, "mouth_mask_available": True}
                mouth_box = page.get_by_label("Keep my own mouth")
                assert mouth_box.is_checked() and mouth_box.is_enabled() and not page.is_visible("#mouth-note")
                mouth_box.uncheck()
                page.wait_for_selector("#session-status:has-text('mouth swapped too')", timeout=10_000)
                assert mouth_mask(server, first_url) == {"mouth_mask": False, "mouth_mask_available": True}

                cut_network(server, first_id)
                page.wait_for_function(
                    "() => document.getElementById('session-status').textContent.includes('interrupted')",
                    timeout=30_000,
                )
                page.wait_for_function(
                    f"() => window.swapcast.state === 'live' && window.swapcast.sessionUrl"
                    f" && !window.swapcast.sessionUrl.endsWith('{first_id}')",
                    timeout=60_000,
                )
                assert page.evaluate("window.swapcast.error") == "the connection was interrupted"
                assert "Reconnected" in (page.text_content("#session-status") or "")
                # The silent session was still open on the server: the page ended it before opening the next.
                second_id = str(page.evaluate("window.swapcast.sessionUrl")).rsplit("/", 1)[1]
                assert session_ids(server) == {second_id}
                assert len(posts.sent) == 2, posts.sent
                page.wait_for_function(
                    "() => window.swapcast.server && window.swapcast.server.frames_out >= 15", timeout=60_000
                )
                assert page.evaluate("window.cameraRequests") == 1
                # The mouth mask the user turned off stays off on the new session, and the box says so.
                second_url = str(page.evaluate("window.swapcast.sessionUrl"))
                assert mouth_mask(server, second_url) == {"mouth_mask": False, "mouth_mask_available": True}
                assert not mouth_box.is_checked()
                assert errors == []
            finally:
                browser.close()


def test_the_page_does_not_take_its_channel_back_from_a_newer_session(
    server: RunningServer, detector: RetinaFaceDetector, tmp_path: Path, tom_png: bytes, clip: MotionClip
) -> None:
    """A second device publishing into the same channel takes it over; the page's session is ended, and the
    page stops and says so instead of taking the channel back (the two would take it from each other for ever)."""
    args = chromium_args(camera(detector, tmp_path))
    identity = upload(server.base_url, tom_png, "tom.png").json()["id"]
    make_channel(server, "studio-b")
    posts = SessionPosts()
    assert sync_playwright is not None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=args)
        try:
            errors: list[str] = []
            page = open_page(browser, server, posts, identity, errors, "?channel=studio-b")
            stream_live(page)

            done = threading.Event()
            newer: list[str] = []

            def other_device() -> None:
                async def run() -> None:
                    client = RtcClient(clip.frames, fps=10)
                    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
                        response = await client.connect(http, f"/v1/sessions?identity={identity}&channel=studio-b")
                        newer.append((client.location or "").rsplit("/", 1)[1])
                        assert response.status_code == 201
                        await asyncio.to_thread(done.wait, 60)
                        await client.close()

                asyncio.run(run())

            device = threading.Thread(target=other_device)
            device.start()
            try:
                page.wait_for_function("() => window.swapcast.state === 'failed'", timeout=60_000)
            finally:
                done.set()
                device.join(timeout=30)
            status = page.text_content("#session-status") or ""
            assert "took channel studio-b over" in status, status
            time.sleep(3)
            assert len(posts.sent) == 1, posts.sent  # no try to take it back
            assert newer and channel(server, "studio-b")["publisher"] in (f"session/{newer[0]}", None)
            assert errors == []
        finally:
            browser.close()
