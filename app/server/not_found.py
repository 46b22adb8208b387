"""The server's "not found" errors (404): a missing resource and one the caller may not see read the same."""


class NotFound(LookupError):
    what = "resource"

    def __init__(self, key: str) -> None:
        super().__init__(f"{self.what} {key} not found")
