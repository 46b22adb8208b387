"""Errors with a message for the user: the CLI prints the message alone and exits non-zero; the server answers a
`StatusError` with the status its raiser chose."""

from pydantic import ValidationError

from engines.errors import ModelError


class UserError(Exception):
    """Bad input from the user (a path, an option, a file that is not what it claims to be)."""


class StatusError(Exception):
    """A refusal whose raiser picks the HTTP status (`status`) among those its kind answers with;
    `app.server.errors` answers it once, with the message as the detail."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def invalid_setting(exc: ValidationError) -> str:
    """The settings' first refusal as one line: the setting's name and why."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"invalid setting {where}: {first['msg']}"


__all__ = ["ModelError", "StatusError", "UserError", "invalid_setting"]
