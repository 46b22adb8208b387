"""The page's "Keep hands in front" box shows what the server can do before a session starts: ticked where it runs
the occlusion stage, unticked, disabled and saying why where it does not (headless Chromium, no camera)."""

from collections.abc import Callable
from pathlib import Path

import pytest

from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from engines.errors import ModelError
from engines.store import ModelStore
from tests.server.harness import server_settings, start_server
from tests.server.test_browser import CHROMIUM, chromium_args, sync_playwright

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (apt chromium)"),
    pytest.mark.skipif(sync_playwright is None, reason="needs the playwright Python package (pip playwright)"),
]


def hands_box(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], occlusion: str
) -> tuple[bool, bool, str | None]:
    """(ticked, disabled, the note beside it where shown) of the page's box once the server is ready, on a
    server with SWAPCAST_OCCLUSION=`occlusion`, no session started."""

    def factory(settings: PipelineSettings) -> FramePipeline:
        return pipeline_factory(settings.model_copy(update={"engine": "classic", "occlusion": occlusion}))

    assert sync_playwright is not None
    with start_server(server_settings(tmp_path / "identities"), factory) as server, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=chromium_args())
        try:
            page = browser.new_page()
            page.goto(server.base_url)
            page.wait_for_selector("#server-status:text-matches('ready')", timeout=30_000)
            box = page.locator("#occlusion-toggle")
            note = page.text_content("#occlusion-note") if page.is_visible("#occlusion-note") else None
            return box.is_checked(), box.is_disabled(), note
        finally:
            browser.close()


def test_a_server_without_the_hand_stage_shows_the_box_off_with_the_reason_before_a_session(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline]
) -> None:
    ticked, disabled, note = hands_box(tmp_path, pipeline_factory, "off")
    assert (ticked, disabled) == (False, True)
    assert note is not None and "swapcast models import" in note


def test_a_server_with_the_hand_stage_shows_the_box_ticked_before_a_session(
    tmp_path: Path, store: ModelStore, pipeline_factory: Callable[[PipelineSettings], FramePipeline]
) -> None:
    try:
        store.ensure(PipelineSettings().hand_model)
    except ModelError as exc:
        pytest.skip(f"the hand model cannot be imported here: {exc}")
    assert hands_box(tmp_path, pipeline_factory, "auto") == (True, False, None)
