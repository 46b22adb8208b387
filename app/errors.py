"""Errors with a message for the user: the CLI prints the message alone and exits non-zero."""

from pydantic import ValidationError

from engines.errors import ModelError


class UserError(Exception):
    """Bad input from the user (a path, an option, a file that is not what it claims to be)."""


def invalid_setting(exc: ValidationError) -> str:
    """The settings' first refusal as one line: the setting's name and why."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"invalid setting {where}: {first['msg']}"


__all__ = ["ModelError", "UserError", "invalid_setting"]
