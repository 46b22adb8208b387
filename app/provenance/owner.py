"""Who a file made on the command line belongs to, for the mark registry.

The server knows each request's principal; `swapcast swap` runs without one, so its owner is `--owner`, else the
`SWAPCAST_OWNER` setting, else the operating-system user running it."""

from __future__ import annotations

import getpass
import unicodedata

from app.errors import UserError

MAX_OWNER_CHARS = 128


def check_owner(name: str) -> str:
    """The owner name, stripped; a clear error when it is empty, too long or holds control characters."""
    owner = name.strip()
    if not owner:
        raise UserError("--owner must not be empty")
    if len(owner) > MAX_OWNER_CHARS:
        raise UserError(f"--owner must be at most {MAX_OWNER_CHARS} characters")
    if any(unicodedata.category(ch).startswith("C") for ch in owner):
        raise UserError("--owner must not contain control characters")
    return owner


def os_user() -> str | None:
    """The operating-system user name, or None where there is none (e.g. a container's uid without an entry)."""
    try:
        return getpass.getuser() or None
    except (KeyError, OSError):  # KeyError before Python 3.13, OSError from it on
        return None


def cli_owner(explicit: str | None, configured: str | None) -> str | None:
    """The owner of a CLI job: `explicit` (`--owner`), else `configured` (`SWAPCAST_OWNER`), else the OS user."""
    for name in (explicit, configured):
        if name is not None:
            return check_owner(name)
    user = os_user()
    return check_owner(user) if user else None
