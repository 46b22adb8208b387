"""A receive-only aiortc peer that POSTs its offer WHEP-style, as OBS's Browser Source page or any WHEP player
does, and hands every decoded video frame to `on_frame`."""

import asyncio
import contextlib
from dataclasses import dataclass, field

import av
import httpx
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack


@dataclass
class WhepReceiver:
    pc: RTCPeerConnection = field(default_factory=lambda: RTCPeerConnection(RTCConfiguration(iceServers=[])))
    location: str | None = None
    _reader: asyncio.Task[None] | None = None

    async def connect(self, http: httpx.AsyncClient, url: str, token: str | None = None) -> httpx.Response:
        """Offer, post, apply the answer (on 201). `token`: a viewer token sent as the bearer credential."""
        self.pc.addTransceiver("video", direction="recvonly")
        remote: asyncio.Future[MediaStreamTrack] = asyncio.get_running_loop().create_future()
        self.pc.on("track", lambda track: remote.done() or remote.set_result(track))
        await self.pc.setLocalDescription(await self.pc.createOffer())
        headers = {"Content-Type": "application/sdp"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        response = await http.post(url, content=self.pc.localDescription.sdp, headers=headers)
        if response.status_code != 201:
            return response
        self.location = response.headers["location"]
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=response.text, type="answer"))
        self._reader = asyncio.ensure_future(self._read(await remote))
        return response

    def on_frame(self, frame: av.VideoFrame) -> None:
        """Each decoded frame, on the event loop."""

    async def _read(self, track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                assert isinstance(frame, av.VideoFrame)
                self.on_frame(frame)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        await self.pc.close()
