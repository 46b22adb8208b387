"""The page as a streamer's control room, in a real browser: several photos make one identity, channels are made,
picked, copied, rotated and deleted without curl, "only this person" streams with an identity map, every control
has a name a screen reader reads, and a phone-width screen shows it all without scrolling sideways."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cv2
import httpx
import pytest

from app.media.clips import load_sample, sample_faces
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.pipeline import FramePipeline
from app.pipeline.types import Image
from app.settings import PipelineSettings
from tests.helpers import wait_for
from tests.server.harness import (
    LOOPBACK_DESTINATIONS,
    PAGE_HEADERS,
    RunningServer,
    face_crop,
    server_settings,
    start_server,
)
from tests.server.push_servers import NginxRtmp, Reader, nginx_unavailable
from tests.server.test_browser import (
    CHROMIUM,
    camera_still,
    chromium_args,
    keep_loopback_candidates,
    pytestmark,  # noqa: F401  (the same skips: Chromium and Playwright needed; slow)
    sync_playwright,
    write_y4m,
)
from tests.server.test_page_reconnect import stream_live

# Where the docs' screenshots of the page are refreshed from, when set (docs/images).
SCREENSHOTS = os.environ.get("SWAPCAST_PAGE_SCREENSHOTS")

# Every control without a name a screen reader can read (label, aria-label or text), as "tag#id".
UNNAMED_CONTROLS = """() => [...document.querySelectorAll('input, select, textarea, button')]
    .filter((el) => el.offsetParent !== null)
    .filter((el) => !((el.labels && el.labels.length) || el.getAttribute('aria-label') || el.textContent.trim()))
    .map((el) => `${el.tagName.toLowerCase()}#${el.id}`)"""


@pytest.fixture(scope="module")
def room_server(
    tmp_path_factory: pytest.TempPathFactory, pipeline_factory: Callable[[PipelineSettings], FramePipeline]
) -> Iterator[RunningServer]:
    settings = server_settings(
        tmp_path_factory.mktemp("identities"),
        rtsp_enabled=True,
        rtsp_port=0,
        channel_dir=tmp_path_factory.mktemp("channels"),
        **LOOPBACK_DESTINATIONS,
    )
    with start_server(settings, pipeline_factory) as server:
        yield server


def photos(tmp_path: Path, detector: RetinaFaceDetector, t1: Image) -> tuple[Path, Path, Path]:
    """Two photos of one person (the packaged portrait, and it mirrored), and a face cut from the group photo."""
    tom = tmp_path / "tom.png"
    shutil.copy(sample_faces()["tom_hanks"], tom)
    mirrored = tmp_path / "tom-mirrored.png"
    cv2.imwrite(str(mirrored), cv2.flip(load_sample("tom_hanks"), 1))
    (faces,) = detector.process([t1])
    other = tmp_path / "other.jpg"
    cv2.imwrite(str(other), face_crop(t1, max(faces, key=lambda f: f.area).box))
    return tom, mirrored, other


def upload_through_page(page: Any, files: list[Path], name: str) -> str:
    page.set_input_files("#upload-file", [str(f) for f in files])
    page.fill("#upload-name", name)
    page.check("#consent-self")
    page.click("#upload-button")
    page.wait_for_selector(f"#identity-list li.selected:has-text('{name}')", timeout=30_000)
    return str(page.get_attribute("#identity-list li.selected", "data-id"))


def channel_item(name: str) -> str:
    return f"#channel-list li[data-name='{name}']"


def test_the_page_runs_identities_channels_and_only_this_person(
    room_server: RunningServer, detector: RetinaFaceDetector, tmp_path: Path, t1: Image
) -> None:
    base = room_server.base_url
    still, _ = camera_still(detector)  # the astronaut: the person in the camera
    camera = (tmp_path / "camera.y4m").resolve()
    write_y4m(camera, still)
    person_photo = tmp_path / "person.png"
    cv2.imwrite(str(person_photo), still)
    tom, mirrored, other = photos(tmp_path, detector, t1)

    assert sync_playwright is not None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=chromium_args(camera))
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            context.grant_permissions(["camera", "microphone", "clipboard-read", "clipboard-write"], origin=base)
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.on("dialog", lambda dialog: dialog.accept())
            page.route("**/v1/sessions?*", keep_loopback_candidates)
            page.goto(base)
            page.wait_for_selector("#server-status:text-matches('ready')", timeout=30_000)

            # Two photos of one person make one identity.
            tom_id = upload_through_page(page, [tom, mirrored], "Tom, two photos")
            assert httpx.get(f"{base}/v1/identities/{tom_id}").json()["photos"] == 2
            assert "from 2 photos" in (page.text_content("#upload-status") or "")
            me_id = upload_through_page(page, [person_photo], "Me")
            upload_through_page(page, [other], "Someone else")

            # A channel made on the page: listed with its RTSP URL, its Browser Source URL shown once.
            page.fill("#channel-name", "main-cam")
            page.click("#channel-create")
            page.wait_for_selector(channel_item("main-cam"), timeout=15_000)
            listed = httpx.get(f"{base}/v1/channels/main-cam").json()
            shown_url = page.text_content(f"{channel_item('main-cam')} code") or ""
            assert shown_url == listed["rtsp_url"] and shown_url.startswith("rtsp://"), shown_url
            view_url = page.text_content("#channel-view-url") or ""
            assert view_url.startswith(f"{base}/view/channel/main-cam?token=vt_"), view_url
            page.click(f"{channel_item('main-cam')} [data-action=copy]")
            assert page.evaluate("navigator.clipboard.readText()") == listed["rtsp_url"]

            # Rotating gives OBS new addresses: the old password and token no longer work.
            page.click(f"{channel_item('main-cam')} [data-action=rotate]")
            page.wait_for_function(
                f"() => !document.getElementById('channel-view-url').textContent.endsWith('{view_url[-12:]}')",
                timeout=15_000,
            )
            rotated = httpx.get(f"{base}/v1/channels/main-cam").json()
            assert rotated["rtsp_url"] != listed["rtsp_url"]
            assert rotated["viewer_token_id"] != listed["viewer_token_id"]
            page.wait_for_function(
                f'() => document.querySelector("{channel_item("main-cam")} code").textContent'
                f" === {rotated['rtsp_url']!r}",
                timeout=15_000,
            )

            # A bad name is refused by the server with its reason, and nothing is made.
            page.evaluate("document.getElementById('channel-name').removeAttribute('pattern')")
            page.fill("#channel-name", "Not A Name")
            page.click("#channel-create")
            page.wait_for_selector("#channel-status.error", timeout=15_000)
            assert "not created" in (page.text_content("#channel-status") or "")
            assert [c["name"] for c in httpx.get(f"{base}/v1/channels").json()["channels"]] == ["main-cam"]
            page.fill("#channel-name", "")

            # Pick the channel for live, swap only "Me" (the person in the camera) with Tom's face.
            page.click(f"{channel_item('main-cam')} [data-action=use]")
            assert page.input_value("#channel-input") == "main-cam"
            page.check(f"#identity-{tom_id}")
            page.check("#swap-person")
            page.select_option("#person-select", me_id)
            session_url = stream_live(page)
            stats = httpx.get(f"{base}{session_url}").json()
            mapping = stats["identity_map"]
            assert mapping is not None, stats
            assert [(e["person"], e["identity"]) for e in mapping["entries"]] == [(me_id, tom_id)], mapping
            page.wait_for_function(
                f'() => document.querySelector("{channel_item("main-cam")} .status").textContent'
                f".startsWith('live from a session')",
                timeout=15_000,
            )
            # The session's own face-lost policy, from the page while live.
            assert stats["options"]["on_face_lost"] == "hold"  # the server's default
            page.select_option("#face-lost-select", "cover")
            page.wait_for_function(
                "() => window.swapcast.server && window.swapcast.server.options.on_face_lost === 'cover'",
                timeout=15_000,
            )
            assert httpx.get(f"{base}{session_url}").json()["options"]["on_face_lost"] == "cover"
            # "Use for live" waits for the stream to stop.
            assert page.is_disabled(f"{channel_item('main-cam')} [data-action=use]")

            # Back to everyone's face, live, without a new session.
            page.check("#swap-everyone")
            page.wait_for_function(
                "() => document.getElementById('session-status').textContent === 'identity switched'", timeout=15_000
            )
            after = httpx.get(f"{base}{session_url}").json()
            assert after["identity"] == tom_id and not after["identity_map"], after

            assert page.evaluate(UNNAMED_CONTROLS) == []
            if SCREENSHOTS:
                page.screenshot(path=str(Path(SCREENSHOTS) / "page-desktop.png"), full_page=True)

            # A phone-width screen: one column, nothing wider than the screen.
            page.set_viewport_size({"width": 390, "height": 844})
            page.wait_for_timeout(300)
            overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0, f"the page is {overflow} px wider than a phone's screen"
            assert page.evaluate(UNNAMED_CONTROLS) == []
            if SCREENSHOTS:
                page.screenshot(path=str(Path(SCREENSHOTS) / "page-phone.png"), full_page=True)

            page.click("#stop-button")
            page.wait_for_function("() => window.swapcast.state === 'stopped'", timeout=15_000)

            # Deleting the channel from the page.
            page.click(f"{channel_item('main-cam')} [data-action=delete]")
            page.wait_for_selector("#channel-empty:visible", timeout=15_000)
            assert httpx.get(f"{base}/v1/channels/main-cam").status_code == 404
            assert errors == []
        finally:
            browser.close()


def test_the_controls_are_reached_by_keyboard_in_reading_order(room_server: RunningServer) -> None:
    """Tab walks the controls in the order they are read: no control is skipped or reached out of order."""
    assert sync_playwright is not None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=chromium_args())
        try:
            page = browser.new_page()
            page.goto(room_server.base_url)
            page.wait_for_selector("#server-status:text-matches('ready')", timeout=30_000)
            # Number the controls in document order (as they are read); a group of radios is one stop.
            count = page.evaluate(
                """() => {
                    const focusable = 'input, select, textarea, button, summary, [tabindex]';
                    const controls = [...document.querySelectorAll(focusable)]
                        .filter((el) => el.offsetParent !== null && !el.disabled && el.tabIndex >= 0)
                        .filter((el) => {
                            if (el.type !== 'radio') return true;
                            const group = `input[type=radio][name="${el.name}"]`;
                            const checked = document.querySelector(`${group}:checked`);
                            return checked ? el === checked : el === document.querySelector(group);
                        });
                    controls.forEach((el, i) => { el.dataset.readingOrder = String(i); });
                    return controls.length;
                }"""
            )
            assert count > 10
            assert page.evaluate("[...document.querySelectorAll('[tabindex]')].filter((el) => el.tabIndex > 0)") == []
            visited: list[int] = []
            for _ in range(count):
                page.keyboard.press("Tab")
                visited.append(
                    page.evaluate(
                        "document.activeElement.dataset.readingOrder ?? document.activeElement.outerHTML.slice(0, 80)"
                    )
                )
            assert visited == [str(i) for i in range(count)]
        finally:
            browser.close()


@pytest.mark.skipif(nginx_unavailable() is not None, reason=f"no RTMP server: {nginx_unavailable()}")
def test_the_page_pushes_a_channel_to_an_rtmp_server_and_never_shows_the_key(
    room_server: RunningServer, tmp_path: Path
) -> None:
    base = room_server.base_url
    made = httpx.post(f"{base}/v1/channels", json={"name": "to-platform"}, headers=PAGE_HEADERS)
    assert made.status_code == 201, made.text
    key = "live_page_key_4f2a9"
    assert sync_playwright is not None
    with NginxRtmp(tmp_path / "nginx") as nginx, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=chromium_args())
        reader: Reader | None = None
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(base)
            item = channel_item("to-platform")
            page.wait_for_selector(item, timeout=30_000)
            page.click(f"{item} details.pushes summary")
            page.fill(f"{item} .push-form input[name=url]", nginx.url("").rstrip("/"))
            page.fill(f"{item} .push-form input[name=key]", key)
            page.click(f"{item} .push-form button")
            page.wait_for_selector(f"{item} .pushes li[data-push]", timeout=15_000)
            # Connected, and the page says so at its next refresh; the channel's slate reaches the server.
            page.wait_for_function(
                f'() => document.querySelector("{item} .pushes li[data-push] .status").textContent'
                ".startsWith('live')",
                timeout=30_000,
            )
            reader = Reader(nginx.url(key))
            assert wait_for(lambda: len(reader.seen.frames) >= 5, 30), reader.seen.errors
            # The key went to the server once: the page shows the destination with it hidden, and keeps none.
            assert key not in page.evaluate("document.body.innerText")
            assert page.input_value(f"{item} .push-form input[name=key]") == ""
            shown = page.text_content(f"{item} .pushes li[data-push] code") or ""
            assert "***" in shown and key not in shown, shown
            assert "(1, 1 live)" in (page.text_content(f"{item} details.pushes summary") or "")

            page.click(f"{item} .pushes li[data-push] button")
            page.wait_for_function(f'() => !document.querySelector("{item} .pushes li[data-push]")', timeout=15_000)
            assert httpx.get(f"{base}/v1/channels/to-platform/pushes").json()["pushes"] == []
            assert errors == []
        finally:
            if reader is not None:
                reader.stop()
            browser.close()
            httpx.delete(f"{base}/v1/channels/to-platform", headers=PAGE_HEADERS)
