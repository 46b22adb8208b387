"""A WebRTC client run as its own process so a test can kill it mid-stream (SIGKILL: no goodbye at all)."""

import asyncio
import sys

import httpx

from app.bench.rtc_client import RtcClient
from app.media.clips import load_sample, make_motion_clip
from app.media.peer import use_host_addresses


async def main(base_url: str, identity: str) -> None:
    use_host_addresses(["127.0.0.1"])
    clip = make_motion_clip(load_sample("astronaut"), size=(640, 480), frames=15, focus=(225.0, 118.0))
    client = RtcClient(clip.frames, fps=15)
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        response = await client.connect(http, f"/v1/sessions?identity={identity}")
        print(response.headers["location"], flush=True)
        if await client.wait_frames(3, 60):
            print("STREAMING", flush=True)
        await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
