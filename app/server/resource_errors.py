"""The server's resource errors by what they answer: a missing resource (404), a request that conflicts with the
resource's state or limits (409), a kind of resource this server cannot run (503). `app.server.errors` maps each
kind once, so a module declares its own errors by kind alone."""


class NotFound(LookupError):
    """404: a missing resource and one the caller may not see read the same."""

    what = "resource"

    def __init__(self, key: str) -> None:
        super().__init__(f"{self.what} {key} not found")


class Conflict(Exception):
    """409: the resource's state or its owner's limits refuse the request; the message says which."""


class Unavailable(Exception):
    """503: this server cannot run that kind of resource; the message says why (and what to install)."""
