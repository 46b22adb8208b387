"""The page in a real browser over HTTPS on a server that needs a key: headless Chromium trusts the throwaway
certificate by its public key, the page asks for the key, keeps it in session storage (not the URL), uploads an
identity, streams its fake camera and gets swapped frames back."""

from __future__ import annotations

import shutil
import ssl
from collections.abc import Callable
from pathlib import Path

import httpx

from app.auth.settings import AccessSettings
from app.media.clips import sample_faces
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.server.credentials import bearer, make_credentials
from tests.server.harness import server_settings, start_server
from tests.server.test_browser import (
    CHROMIUM,
    camera_still,
    chromium_args,
    grab,
    keep_loopback_candidates,
    pytestmark,  # noqa: F401  (the same skips: Chromium and Playwright needed; slow)
    region_diff,
    sync_playwright,
    write_y4m,
)
from tests.server.tls import make_tls


def test_the_page_works_over_https_with_a_key(
    tmp_path: Path,
    detector: RetinaFaceDetector,
    pipeline_factory: Callable[[PipelineSettings], FramePipeline],
) -> None:
    tls = make_tls(tmp_path)
    creds = make_credentials(tmp_path / "keys.json")
    access = AccessSettings(keys_file=creds.keys_file, tls_cert=tls.cert, tls_key=tls.key, auth_failure_delay_s=0.0)
    still, box = camera_still(detector)
    y4m = (tmp_path / "camera.y4m").resolve()
    write_y4m(y4m, still)
    tom_path = tmp_path / "tom.png"
    shutil.copy(sample_faces()["tom_hanks"], tom_path)
    args = chromium_args(y4m, f"--ignore-certificate-errors-spki-list={tls.spki_sha256}")
    settings = server_settings(tmp_path / "identities", access=access)
    assert sync_playwright is not None
    with start_server(settings, pipeline_factory, ca_file=tls.ca) as server, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=args)
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.route("**/v1/sessions?identity=*", keep_loopback_candidates)
            page.goto(server.base_url)
            assert page.evaluate("window.isSecureContext") is True
            page.wait_for_selector("#key-form:not([hidden])", timeout=30_000)
            page.fill("#key-input", creds.owner)
            page.click("#key-button")
            page.wait_for_selector("#server-status:text-matches('ready')", timeout=60_000)
            assert page.evaluate("sessionStorage.getItem('swapcast.key')") == creds.owner
            assert creds.owner not in page.url

            page.set_input_files("#upload-file", str(tom_path))
            page.fill("#upload-name", "Tom over HTTPS")
            page.check("#consent-self")
            page.click("#upload-button")
            page.wait_for_selector("#identity-list li.selected:has-text('Tom over HTTPS')", timeout=30_000)
            page.wait_for_function(
                "() => document.querySelector('#identity-list li.selected img').src.startsWith('blob:')", timeout=10_000
            )
            page.click("#start-button")
            page.wait_for_function(
                "() => window.swapcast.state === 'live' || window.swapcast.state === 'failed'", timeout=30_000
            )
            assert page.evaluate("window.swapcast.state") == "live", page.evaluate("window.swapcast.error")
            page.wait_for_function(
                "() => window.swapcast.browser && window.swapcast.browser.framesDecoded >= 10", timeout=60_000
            )
            swapped = grab(page, "remote-video")
            assert region_diff(swapped, still, box) > 15

            session_url = page.evaluate("window.swapcast.sessionUrl")
            trusted = ssl.create_default_context(cafile=str(tls.ca))
            assert httpx.get(f"{server.base_url}{session_url}", verify=trusted).status_code == 401
            as_other = httpx.get(f"{server.base_url}{session_url}", verify=trusted, headers=bearer(creds.other))
            assert as_other.status_code == 404
            assert (
                httpx.get(f"{server.base_url}{session_url}", verify=trusted, headers=bearer(creds.owner)).json()[
                    "state"
                ]
                == "connected"
            )
            page.click("#stop-button")
            page.wait_for_function("() => window.swapcast.state === 'stopped'")
            assert errors == []
        finally:
            browser.close()
