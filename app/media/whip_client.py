"""The client's half of a WHIP-style exchange (`POST` the offer, `201` answer + Location) and the frames of the
track that comes back: what every aiortc client of the server (tests, benchmarks, `swapcast cam`) shares."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable

import av
import httpx
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack


def _as_is(sdp: str) -> str:
    return sdp


async def whip_exchange(
    pc: RTCPeerConnection,
    http: httpx.AsyncClient,
    url: str,
    *,
    headers: dict[str, str] | None = None,
    offer_to_post: Callable[[str], str] = _as_is,
    answer_to_apply: Callable[[str], str] = _as_is,
) -> httpx.Response:
    """Offer (after ICE gathering), post it to `url`, apply the answer; the HTTP response. Raises
    `httpx.HTTPStatusError` when the server refuses, `httpx.HTTPError` when it cannot be reached."""
    await pc.setLocalDescription(await pc.createOffer())
    offer = offer_to_post(pc.localDescription.sdp)
    response = await http.post(url, content=offer, headers={**(headers or {}), "Content-Type": "application/sdp"})
    response.raise_for_status()
    await pc.setRemoteDescription(RTCSessionDescription(sdp=answer_to_apply(response.text), type="answer"))
    return response


async def video_frames(track: MediaStreamTrack) -> AsyncIterator[tuple[float, av.VideoFrame]]:
    """The track's video frames with their arrival time (monotonic clock), until the track ends."""
    with contextlib.suppress(MediaStreamError):
        while True:
            frame = await track.recv()
            at = time.monotonic()
            if isinstance(frame, av.VideoFrame):
                yield at, frame
