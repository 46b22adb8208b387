"""What every new live output (a WebRTC session, an RTSP ingest stream) is given before its first frame, written
once for both: the watermark issued to it (and its visible label) and, when the content policy is on, its
content gate."""

from collections.abc import Callable
from dataclasses import dataclass

from app.content.live import ContentService
from app.live.adapter import LiveOutput, LiveRequest
from app.provenance.service import Provenance


@dataclass(frozen=True)
class OutputGuards:
    provenance: Provenance | None = None
    content: ContentService | None = None

    async def equip(self, kind: str, output: LiveOutput, request: LiveRequest, end: Callable[[str], None]) -> None:
        """Mark `output` as issued to it and its owner; gate it, `end(reason)` stopping it (from the gate's
        thread) when the policy says stop."""
        if self.provenance is not None:
            output.marker = await self.provenance.marker_async(
                kind=kind, ref=output.id, identity=request.identity_id, owner=request.owner or None, label=request.label
            )
        if self.content is not None:
            output.core.content = self.content.gate(kind, output.id, request.owner, end)
