"""The hand-over from the network to the sink: the receiver puts each decoded frame in a one-frame mailbox (a
newer one replaces a frame the sink has not taken), and a thread of its own converts it, reads its stamp and
hands it to the sink, so that neither a slow sink nor the conversion ever holds up the event loop."""

from __future__ import annotations

import threading
import time

import av
import numpy as np

from app.cam.sinks import Sink, fit
from app.cam.stats import CamStats
from app.errors import UserError
from app.media.frame_ids import read_stamp
from app.media.mailbox import Mailbox
from app.pipeline.types import Image


class SinkWorker:
    def __init__(self, sink: Sink, stats: CamStats, *, measure: bool) -> None:
        self.sink = sink
        self.stats = stats
        self.measure = measure
        self.slot: Mailbox[av.VideoFrame] = Mailbox(on_drop=self._superseded)
        self._stop = False
        self._opened = threading.Event()
        self._open_error: str | None = None
        self._thread: threading.Thread | None = None

    def _superseded(self, _reason: str, count: int) -> None:
        self.stats.superseded += count

    def start(self, width: int, height: int, fps: float) -> None:
        """Open the sink on the worker's thread; raises UserError with the sink's reason when it cannot open."""
        self._thread = threading.Thread(target=self._run, args=(width, height, fps), name="cam-sink", daemon=True)
        self._thread.start()
        self._opened.wait()
        if self._open_error is not None:
            self._thread.join()
            raise UserError(self._open_error)

    def put(self, frame: av.VideoFrame) -> None:
        self.slot.put(frame)

    def stop(self) -> None:
        with self.slot.cond:
            self._stop = True
        self.slot.wake()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self, width: int, height: int, fps: float) -> None:
        try:
            self.sink.open(width, height, fps)
        except UserError as exc:
            self._open_error = str(exc)
        finally:
            self._opened.set()
        if self._open_error is not None:
            return
        try:
            while True:
                with self.slot.cond:
                    self.slot.cond.wait_for(lambda: self._stop or self.slot.has_item)
                    if self._stop:
                        return
                frame = self.slot.take()
                if frame is not None:
                    self._show(frame, width, height)
        finally:
            self.sink.close()

    def _show(self, frame: av.VideoFrame, width: int, height: int) -> None:
        image: Image = np.asarray(frame.to_ndarray(format=self.sink.pixel_format), np.uint8)
        frame_id = read_stamp(image) if self.measure else None
        image = fit(image, width, height)
        handed = time.monotonic()
        self.sink.show(image)
        self.stats.note_shown(frame_id, handed)
