"""Errors with a message for the user: the CLI prints the message alone and exits non-zero; the server answers a
`StatusError` with the status its raiser chose."""

from typing import TYPE_CHECKING

from pydantic import ValidationError

from engines.errors import ModelError

if TYPE_CHECKING:
    import httpx


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


def server_reason(response: "httpx.Response") -> str:
    """Why the server refused, as a client shows it: its `detail` (one part per refused parameter of a validation
    error), else the body, else the status's phrase."""
    try:
        detail = response.json().get("detail", response.text)
    except ValueError:
        detail = response.text
    if isinstance(detail, list):
        detail = "; ".join(
            f"{'.'.join(str(p) for p in d.get('loc', [])[1:])}: {d.get('msg', '')}"
            for d in detail
            if isinstance(d, dict)
        )
    return str(detail).strip() or response.reason_phrase


__all__ = ["ModelError", "StatusError", "UserError", "invalid_setting", "server_reason"]
