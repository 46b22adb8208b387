"""`swapcast config` shows every setting with its value and source, masks secrets, and both it and `serve` name
SWAPCAST_ variables no setting reads, with the closest setting."""

import json

import pytest

from app.cli import main
from app.settings_catalog import catalog, effective, unknown_variables


def rows(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, dict[str, str]]:
    assert main(["config", "--json", *args]) == 0
    return {row["variable"]: row for row in json.loads(capsys.readouterr().out)}


def test_every_setting_with_value_source_and_description(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWAPCAST_PORT", "9123")
    monkeypatch.setenv("swapcast_encoder_backend", "x264")  # names are case-insensitive, as the settings read them
    shown = rows(capsys)
    assert set(shown) == {s.env for s in catalog()}
    assert len(shown) > 100
    assert shown["SWAPCAST_PORT"] | {"description": ""} == {
        "variable": "SWAPCAST_PORT",
        "group": "Server",
        "value": "9123",
        "source": "environment",
        "description": "",
    }
    assert shown["SWAPCAST_RTSP_PORT"]["source"] == "default"
    assert shown["SWAPCAST_RTSP_PORT"]["value"] == "8554"
    assert shown["SWAPCAST_ENCODER_BACKEND"]["value"] == "x264"
    assert shown["SWAPCAST_ENCODER_BACKEND"]["source"] == "environment"
    assert shown["SWAPCAST_BATCH_POLICY"]["group"] == "Batching"
    assert all(row["description"] for row in shown.values())


def test_secrets_are_masked(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWAPCAST_JWT_SECRET", "s" * 40)
    monkeypatch.setenv("SWAPCAST_JWT_AUDIENCE", "swapcast")
    monkeypatch.setenv("SWAPCAST_WATERMARK_KEY", "my-own-mark-key")
    monkeypatch.setenv("SWAPCAST_TURN_URLS", '["turn:turn.example.org:3478"]')
    monkeypatch.setenv("SWAPCAST_TURN_SECRET", "turn-shared-secret")
    shown = rows(capsys)
    for name in ("SWAPCAST_JWT_SECRET", "SWAPCAST_WATERMARK_KEY", "SWAPCAST_TURN_SECRET"):
        assert shown[name]["value"] == "********"
    assert shown["SWAPCAST_TURN_CREDENTIAL"]["value"] == "(unset)"
    assert shown["SWAPCAST_TURN_URLS"]["value"] == '["turn:turn.example.org:3478"]'
    assert main(["config"]) == 0
    table = capsys.readouterr().out
    assert "s" * 40 not in table and "my-own-mark-key" not in table and "turn-shared-secret" not in table


def test_changed_lists_only_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWAPCAST_MAX_SESSIONS", "2")
    assert main(["config", "--changed"]) == 0
    out = capsys.readouterr().out
    assert "SWAPCAST_MAX_SESSIONS" in out and "(environment)" in out
    assert "SWAPCAST_RTSP_PORT" not in out


def test_unknown_variables_are_named_with_the_closest_setting(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWAPCAST_MAX_SESION", "3")
    monkeypatch.setenv("SWAPCAST_ZZZ", "1")
    monkeypatch.setenv("SWAPCAST_PIPELINE__ENGINE", "mesh")  # the nested form ServerSettings reads
    monkeypatch.setenv("SWAPCAST_IMAGE_WORK", "/tmp/x")  # read by scripts/check-image.sh
    found = dict(unknown_variables())
    assert found["SWAPCAST_MAX_SESION"] == "SWAPCAST_MAX_SESSIONS"
    assert found["SWAPCAST_ZZZ"] is None
    assert "SWAPCAST_PIPELINE__ENGINE" not in found and "SWAPCAST_IMAGE_WORK" not in found
    assert main(["config", "--changed"]) == 0
    err = capsys.readouterr().err
    assert (
        "swapcast: warning: SWAPCAST_MAX_SESION is not a setting and is ignored (did you mean SWAPCAST_MAX_SESSIONS?)"
        in err
    )
    assert {row.setting.env: row.source for row in effective()}["SWAPCAST_ENGINE"] == "environment"


def test_a_refused_value_is_one_error_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWAPCAST_PORT", "eighty")
    assert main(["config"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("swapcast: error: invalid setting port:") and "Traceback" not in err
