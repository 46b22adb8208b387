"""uvicorn's server with a drain on SIGTERM: the first SIGTERM drains (open sessions end or time out, then
the server stops), also when a drain was already asked for over HTTP (Kubernetes runs the preStop hook, then
sends SIGTERM); SIGINT, or a second SIGTERM, stops at once as before."""

import signal
from types import FrameType

import uvicorn

from app.server.drain import Drain


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self._drain = drain
        self._terms = 0
        drain.on_drained = self._drained

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and not self.should_exit:
            self._terms += 1
            # Already draining: nothing more to do, the drain's end stops the server. Not started yet: stop.
            if self._terms == 1 and self._drain.request():
                return
        super().handle_exit(sig, frame)

    def _drained(self) -> None:
        self.should_exit = True
