"""A real browser as the client: headless Chromium with a fake camera playing real face stills loads the page,
uploads an identity, streams, gets swapped frames back, switches identity live and stops."""

from __future__ import annotations

import base64
import hashlib
import shutil
from pathlib import Path

import cv2
import httpx
import numpy as np
import pytest

from app.media.clips import load_sample, sample_faces
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.types import Image
from tests.server.harness import RunningServer, face_crop

CHROMIUM = Path("/usr/bin/chromium")

try:
    from playwright.sync_api import Page, Route, sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (apt chromium)"),
    pytest.mark.skipif(sync_playwright is None, reason="needs the playwright Python package (pip playwright)"),
]

WIDTH, HEIGHT = 640, 480


def camera_still(detector: RetinaFaceDetector) -> tuple[Image, np.ndarray]:
    """A 640x480 picture of a real face, and the face's box in it."""
    astronaut = load_sample("astronaut")
    (faces,) = detector.process([astronaut])
    x1, y1, x2, y2 = (float(v) for v in max(faces, key=lambda f: f.area).box)
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    scale = 1.6
    resized = cv2.resize(astronaut, None, fx=scale, fy=scale, interpolation=cv2.INTER_CUBIC)
    left = int(np.clip(cx * scale - WIDTH / 2, 0, resized.shape[1] - WIDTH))
    top = int(np.clip(cy * scale - HEIGHT / 2, 0, resized.shape[0] - HEIGHT))
    still = np.ascontiguousarray(resized[top : top + HEIGHT, left : left + WIDTH])
    (found,) = detector.process([still])
    return still, max(found, key=lambda f: f.area).box


def write_y4m(path: Path, image: Image, frames: int = 15) -> None:
    """An uncompressed 4:2:0 video for Chromium's fake camera (it loops the file)."""
    yuv = cv2.cvtColor(image, cv2.COLOR_BGR2YUV_I420).tobytes()
    with path.open("wb") as f:
        f.write(f"YUV4MPEG2 W{WIDTH} H{HEIGHT} F30:1 Ip A1:1 C420jpeg XYSCSS=420JPEG\n".encode())
        for _ in range(frames):
            f.write(b"FRAME\n")
            f.write(yuv)


def chromium_args(camera: Path | None = None, *extra: str) -> list[str]:
    """Headless Chromium's flags for these tests: no outside traffic, loopback ICE, and (with `camera`, an
    absolute .y4m path) a fake camera and microphone that need no permission prompt."""
    args = [
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--autoplay-policy=no-user-gesture-required",
        "--allow-loopback-in-peer-connection",
    ]
    if camera is not None:
        args += [
            "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-video-capture={camera}",
        ]
    return [*args, *extra]


def keep_loopback_candidates(route: Route) -> None:
    """The offer reaches the server with only its 127.0.0.1 candidates, so media stays on loopback."""
    request = route.request
    if request.method != "POST":
        route.continue_()
        return
    lines = (request.post_data or "").split("\r\n")
    kept = [line for line in lines if not line.startswith("a=candidate:") or " 127.0.0.1 " in line]
    route.continue_(post_data="\r\n".join(kept))


def grab(page: Page, video_id: str) -> Image:
    data_url = page.evaluate(
        """(id) => {
            const video = document.getElementById(id);
            const canvas = document.createElement("canvas");
            canvas.width = video.videoWidth;
            canvas.height = video.videoHeight;
            canvas.getContext("2d").drawImage(video, 0, 0);
            return canvas.toDataURL("image/png");
        }""",
        video_id,
    )
    png = base64.b64decode(data_url.split(",", 1)[1])
    image = cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None and image.size, f"{video_id} has no frame"
    if image.shape[:2] != (HEIGHT, WIDTH):
        image = cv2.resize(image, (WIDTH, HEIGHT), interpolation=cv2.INTER_AREA)
    return image


def region_diff(a: Image, b: Image, box: np.ndarray, shrink: float = 0.25) -> float:
    x1, y1, x2, y2 = (float(v) for v in box)
    dx, dy = (x2 - x1) * shrink, (y2 - y1) * shrink
    ys, xs = slice(int(y1 + dy), int(y2 - dy)), slice(int(x1 + dx), int(x2 - dx))
    return float(np.abs(a[ys, xs].astype(np.int16) - b[ys, xs].astype(np.int16)).mean())


def corner_diff(a: Image, b: Image) -> float:
    return float(np.abs(a[8:72, 8:136].astype(np.int16) - b[8:72, 8:136].astype(np.int16)).mean())


@pytest.mark.slow
def test_browser_streams_through_the_page(
    server: RunningServer, detector: RetinaFaceDetector, tmp_path: Path, t1: Image
) -> None:
    still, box = camera_still(detector)
    y4m = (tmp_path / "camera.y4m").resolve()  # Chromium needs an absolute path
    write_y4m(y4m, still)
    tom_path = tmp_path / "tom.png"
    shutil.copy(sample_faces()["tom_hanks"], tom_path)
    (t1_faces,) = detector.process([t1])
    second_path = tmp_path / "second.jpg"
    cv2.imwrite(str(second_path), face_crop(t1, max(t1_faces, key=lambda f: f.area).box))

    args = chromium_args(y4m)
    assert sync_playwright is not None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=args)
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.route("**/v1/sessions?identity=*", keep_loopback_candidates)
            page.goto(server.base_url)
            page.wait_for_selector("#server-status:text-matches('ready')", timeout=30_000)

            page.set_input_files("#upload-file", str(tom_path))
            page.fill("#upload-name", "Tom from the page")
            # The form cannot be sent without a consent statement.
            assert page.evaluate("document.getElementById('upload-form').checkValidity()") is False
            page.check("#consent-self")
            page.click("#upload-button")
            page.wait_for_selector("#identity-list li.selected:has-text('Tom from the page')", timeout=30_000)
            first = page.get_attribute("#identity-list li.selected", "data-id")
            consent = httpx.get(f"{server.base_url}/v1/identities/{first}").json()["consent"]
            assert consent["statement"] == "self"
            assert consent["photo_sha256"] == hashlib.sha256(tom_path.read_bytes()).hexdigest()

            page.click("#start-button")
            page.wait_for_function(
                "() => window.swapcast.state === 'live' || window.swapcast.state === 'failed'", timeout=30_000
            )
            assert page.evaluate("window.swapcast.state") == "live", page.evaluate("window.swapcast.error")
            page.wait_for_function(
                "() => window.swapcast.browser && window.swapcast.browser.framesDecoded >= 15", timeout=60_000
            )
            page.wait_for_function(
                "() => window.swapcast.server && window.swapcast.server.frames_out >= 15", timeout=30_000
            )
            session_url = page.evaluate("window.swapcast.sessionUrl")
            stats = httpx.get(f"{server.base_url}{session_url}").json()
            assert stats["identity"] == first and stats["state"] == "connected"
            assert page.text_content("#stat-server-fps") != "—"
            # The Browser Source URL the page makes carries a viewer token of this session.
            page.click("#make-view-url")
            page.wait_for_function("() => document.getElementById('view-url').textContent.includes('token=vt_')")
            view_url = page.text_content("#view-url") or ""
            assert view_url.startswith(f"{server.base_url}/view/{session_url.rsplit('/', 1)[1]}?token=vt_"), view_url

            local = grab(page, "local-video")
            swapped = grab(page, "remote-video")
            # The camera shows the still; the swapped video differs in the face and matches elsewhere.
            assert region_diff(local, still, box) < 12
            assert region_diff(swapped, still, box) > 15
            assert region_diff(swapped, still, box) > 3 * corner_diff(swapped, still)

            # Uploading while live selects the new identity and switches the session without renegotiating.
            page.set_input_files("#upload-file", str(second_path))
            page.check("#consent-obtained")  # someone else's face: the attestation is then required
            assert page.evaluate("document.getElementById('upload-form').checkValidity()") is False
            page.fill("#upload-attestation", "my colleague, who agreed in writing")
            page.click("#upload-button")
            page.wait_for_function(f"() => window.swapcast.identity && window.swapcast.identity !== '{first}'")
            second = page.evaluate("window.swapcast.identity")
            after_switch = httpx.get(f"{server.base_url}{session_url}").json()
            assert after_switch["identity"] == second
            consent = httpx.get(f"{server.base_url}/v1/identities/{second}").json()["consent"]
            assert consent["statement"] == "obtained"
            assert consent["attestation"] == "my colleague, who agreed in writing"
            page.wait_for_function(
                f"() => window.swapcast.server.frames_out >= {after_switch['frames_out'] + 10}", timeout=60_000
            )
            switched = grab(page, "remote-video")
            assert region_diff(switched, swapped, box) > 10

            # The page's "Keep hands in front" box shows and switches the session's occlusion.
            def occlusion() -> dict:
                options = httpx.get(f"{server.base_url}{session_url}").json()["options"]
                return {k: options[k] for k in ("occlusion", "occlusion_available")}

            if occlusion()["occlusion_available"]:
                page.wait_for_function("() => !document.getElementById('occlusion-toggle').disabled", timeout=10_000)
                page.uncheck("#occlusion-toggle")
                page.wait_for_selector("#session-status:has-text('faces pasted whole')", timeout=10_000)
                assert occlusion() == {"occlusion": False, "occlusion_available": True}
            else:
                page.wait_for_function("() => document.getElementById('occlusion-toggle').disabled", timeout=10_000)
                assert page.is_checked("#occlusion-toggle") is False

            # The "Keep my own mouth" box: this server's engine cannot keep the mouth (classic, SWAPCAST_MOUTH_MASK
            # 0), so the box is disabled and says how to enable it (the reconnection test clicks it where it can).
            assert httpx.get(f"{server.base_url}{session_url}").json()["options"]["mouth_mask_available"] is False
            mouth_box = page.get_by_label("Keep my own mouth")
            assert mouth_box.is_disabled() and not mouth_box.is_checked()
            assert page.is_visible("#mouth-note")
            assert "SWAPCAST_MOUTH_MASK" in (page.text_content("#mouth-note") or "")

            page.click("#stop-button")
            page.wait_for_function("() => window.swapcast.state === 'stopped'")
            assert httpx.get(f"{server.base_url}{session_url}").status_code == 404
            assert errors == []
        finally:
            browser.close()
