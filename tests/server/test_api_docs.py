"""The API explorer at `/docs` is Swagger UI from the server's own files: no third-party host, the pages'
Content-Security-Policy, never framed; it renders the API in a real browser without breaking that policy."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

from app.auth.browser import PAGE_CSP
from tests.server.harness import RunningServer

CHROMIUM = Path("/usr/bin/chromium")

try:
    from playwright.sync_api import Route, sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None


def referenced(html: str) -> list[str]:
    return re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html)


def test_the_docs_page_loads_swagger_ui_from_this_server_under_the_pages_policy(server: RunningServer) -> None:
    page = httpx.get(f"{server.base_url}/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == PAGE_CSP and "frame-ancestors 'none'" in PAGE_CSP
    assert page.headers["x-frame-options"] == "DENY"
    assert "<script>" not in page.text.replace(" ", "")  # no inline script: the policy would refuse it
    urls = referenced(page.text)
    assert any(u.endswith("swagger-ui-bundle.js") for u in urls) and any(u.endswith("swagger-ui.css") for u in urls)
    for url in urls:
        assert not urlsplit(url).netloc and not urlsplit(url).scheme, f"{url} is on another host"
        asset = httpx.get(urljoin(f"{server.base_url}/docs", url))
        assert asset.status_code == 200, url
        assert asset.headers["content-security-policy"] == PAGE_CSP and asset.headers["x-frame-options"] == "DENY"
    bundle = httpx.get(f"{server.base_url}/static/swagger-ui-bundle.js")
    assert len(bundle.content) > 500_000 and b"SwaggerUIBundle" in bundle.content
    # FastAPI's own CDN pages are gone.
    assert httpx.get(f"{server.base_url}/redoc").status_code == 404
    assert httpx.get(f"{server.base_url}/docs/oauth2-redirect").status_code == 404


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (apt chromium)")
@pytest.mark.skipif(sync_playwright is None, reason="needs the playwright Python package (pip playwright)")
def test_swagger_ui_renders_the_api_in_chromium_without_another_host_or_a_policy_violation(
    server: RunningServer,
) -> None:
    own = urlsplit(server.base_url).netloc
    elsewhere: list[str] = []
    complaints: list[str] = []

    def only_this_server(route: Route) -> None:
        if urlsplit(route.request.url).netloc == own:
            route.continue_()
        else:  # recorded and never sent
            elsewhere.append(route.request.url)
            route.abort()

    with sync_playwright() as p:
        # Names resolve to nothing: even a request that slipped past the route could not leave the machine.
        rules = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox", "--disable-gpu", rules]
        )
        try:
            page = browser.new_page()
            page.route("**/*", only_this_server)
            page.on("console", lambda m: complaints.append(m.text) if "Content Security Policy" in m.text else None)
            page.on("pageerror", lambda e: complaints.append(str(e)))
            page.goto(f"{server.base_url}/docs")
            page.wait_for_selector(".opblock", timeout=30_000)  # the operations, from /openapi.json
            paths = page.eval_on_selector_all(".opblock-summary-path", "els => els.map(e => e.textContent)")
            title = page.inner_text(".info .title")
        finally:
            browser.close()
    assert "/v1/channels" in [p.replace("\u200b", "") for p in paths], paths
    assert "swapcast" in title
    assert elsewhere == [] and complaints == []
