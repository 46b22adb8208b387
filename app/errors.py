"""Errors with a message for the user: the CLI prints the message alone and exits non-zero."""

from engines.errors import ModelError


class UserError(Exception):
    """Bad input from the user (a path, an option, a file that is not what it claims to be)."""


__all__ = ["ModelError", "UserError"]
