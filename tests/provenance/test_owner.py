"""The owner of a file made on the command line: `--owner`, else the setting, else the OS user."""

import pytest

from app.errors import UserError
from app.provenance import owner
from app.provenance.owner import MAX_OWNER_CHARS, check_owner, cli_owner


def test_explicit_then_configured_then_os_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(owner, "os_user", lambda: "dave")
    assert cli_owner(" alice ", "carol") == "alice"
    assert cli_owner(None, "carol") == "carol"
    assert cli_owner(None, None) == "dave"
    monkeypatch.setattr(owner, "os_user", lambda: None)
    assert cli_owner(None, None) is None


def test_os_user_is_the_login_name_or_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOGNAME", "erin")
    assert owner.os_user() == "erin"

    def no_user() -> str:
        raise OSError("no user name")

    monkeypatch.setattr(owner.getpass, "getuser", no_user)
    assert owner.os_user() is None


@pytest.mark.parametrize(
    ("name", "message"),
    [("  ", "must not be empty"), ("x" * (MAX_OWNER_CHARS + 1), "at most"), ("a\x1bb", "control characters")],
)
def test_bad_owner_names_are_refused(name: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        check_owner(name)
