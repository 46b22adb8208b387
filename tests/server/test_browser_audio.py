"""The page with the microphone on: headless Chromium's fake microphone goes to the server and comes back."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from app.media.clips import sample_faces
from app.pipeline.detect import RetinaFaceDetector
from tests.server.harness import RunningServer
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


def test_the_microphone_comes_back_to_the_page(
    server: RunningServer, detector: RetinaFaceDetector, tmp_path: Path
) -> None:
    still, _ = camera_still(detector)
    y4m = (tmp_path / "camera.y4m").resolve()
    write_y4m(y4m, still)
    tom_path = tmp_path / "tom.png"
    shutil.copy(sample_faces()["tom_hanks"], tom_path)
    args = chromium_args(y4m)
    assert sync_playwright is not None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=args)
        try:
            page = browser.new_page()
            page.route("**/v1/sessions?identity=*", keep_loopback_candidates)
            page.goto(server.base_url)
            page.wait_for_selector("#server-status:text-matches('ready')", timeout=30_000)
            page.set_input_files("#upload-file", str(tom_path))
            page.click("#upload-button")
            page.wait_for_selector("#identity-list li.selected", timeout=30_000)
            page.check("#mic-toggle")
            page.click("#start-button")
            page.wait_for_function("() => window.swapcast.state === 'live'", timeout=30_000)
            session_url = page.evaluate("window.swapcast.sessionUrl")
            page.wait_for_function(
                """() => {
                    const audio = document.getElementById('remote-audio');
                    return !!audio.srcObject && audio.srcObject.getAudioTracks().length === 1
                        && audio.currentTime > 1;
                }""",
                timeout=30_000,
            )
            audio: dict[str, object] = {}
            for _ in range(100):
                audio = httpx.get(f"{server.base_url}{session_url}/audio").json()
                if int(str(audio["frames_out"])) >= 100:  # 2 s of 20 ms frames
                    break
                page.wait_for_timeout(200)
            assert audio["enabled"] and int(str(audio["frames_out"])) >= 100, audio
            page.wait_for_function("() => (window.swapcast.browser || {}).audioBytes > 2000", timeout=20_000)
            page.click("#stop-button")
        finally:
            browser.close()
