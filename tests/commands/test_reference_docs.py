"""The generated reference pages (settings, command line, metrics) match what the code says now."""

from app.commands.reference_docs import pages, stale
from app.settings_catalog import catalog


def test_reference_pages_are_current() -> None:
    assert stale() == [], "run: python -m app.commands.reference_docs"


def test_every_setting_has_a_description_and_a_row() -> None:
    settings_page = pages()["settings.md"]
    for setting in catalog():
        assert setting.description.strip(), f"{setting.env} has no description"
        assert f"| `{setting.env}` |" in settings_page


def test_every_command_has_a_section() -> None:
    cli_page = pages()["cli.md"]
    for command in ("serve", "config", "keys create", "models import", "engines build-trt"):
        assert f"\n## swapcast {command}\n" in cli_page


def test_every_route_has_a_row() -> None:
    operations = pages()["openapi.md"]
    for row in ("| POST | `/v1/identities` |", "| POST | `/v1/sessions/{session_id}/whep` |", "| GET | `/readyz` |"):
        assert row in operations
