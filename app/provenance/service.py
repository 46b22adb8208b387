"""What output paths call: one `Provenance` per process issues a `FrameMarker` per session, stream or file."""

from __future__ import annotations

import asyncio
import functools
import logging

from app.pipeline.types import Image
from app.provenance.code import MarkCode
from app.provenance.embed import Watermarker
from app.provenance.label import draw_label
from app.provenance.registry import MarkRecord, MarkRegistry
from app.provenance.settings import ProvenanceSettings

log = logging.getLogger(__name__)


class FrameMarker:
    """Marks the frames of one output: the invisible watermark (if on), then the visible label (if asked)."""

    def __init__(self, watermarker: Watermarker | None, record: MarkRecord | None, label: bool) -> None:
        self.watermarker = watermarker
        self.record = record
        self.label = label

    def apply(self, image: Image) -> Image:
        """Mark a BGR frame the caller owns (changed in place where it can be) and return the marked frame."""
        if self.watermarker is not None:
            image = self.watermarker.embed(image, inplace=True)
        if self.label:
            image = draw_label(image)
        return image

    @property
    def mark(self) -> str | None:
        """The payload as issued (12 hex digits), None when the watermark is off."""
        return self.record.mark if self.record else None

    def describe(self) -> dict[str, object]:
        return {"watermark": self.mark, "label": self.label}


class Provenance:
    def __init__(self, settings: ProvenanceSettings | None = None) -> None:
        self.settings = settings or ProvenanceSettings()
        self.registry = MarkRegistry(self.settings.mark_registry)
        self.server_id = self.settings.resolved_server_id()

    @functools.cached_property
    def code(self) -> MarkCode:
        return MarkCode(self.settings.watermark_key)

    def marker(
        self, *, kind: str, ref: str, identity: str | None = None, owner: str | None = None, label: bool | None = None
    ) -> FrameMarker:
        """Issue a mark for one output and return what marks its frames."""
        show_label = self.settings.label if label is None else label
        if not self.settings.watermark:
            return FrameMarker(None, None, show_label)
        record = self.registry.issue(server_id=self.server_id, kind=kind, ref=ref, identity=identity, owner=owner)
        log.info("watermark %s issued to %s %s (identity %s)", record.mark, kind, ref, identity)
        watermarker = Watermarker(record.payload(), self.code, self.settings.watermark_strength)
        return FrameMarker(watermarker, record, show_label)

    async def marker_async(
        self, *, kind: str, ref: str, identity: str | None = None, owner: str | None = None, label: bool | None = None
    ) -> FrameMarker:
        """`marker` off the event loop: issuing writes the mark registry and builds the pattern."""
        issue = functools.partial(self.marker, kind=kind, ref=ref, identity=identity, owner=owner, label=label)
        return await asyncio.get_running_loop().run_in_executor(None, issue)
