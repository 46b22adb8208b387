"""uvicorn's server with a drain on SIGTERM: the first SIGTERM drains (open sessions end or time out, then
the server stops); SIGINT, or a second SIGTERM, stops at once as before."""

import signal
from types import FrameType

import uvicorn

from app.server.drain import Drain


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self._drain = drain
        drain.on_drained = self._drained

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and not self.should_exit and not self._drain.draining:
            self._drain.request()
            return
        super().handle_exit(sig, frame)

    def _drained(self) -> None:
        self.should_exit = True
