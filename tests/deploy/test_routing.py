"""Two real `swapcast serve` replicas behind the repository's HAProxy config on loopback: every request of a
session reaches its owner, identities on a shared directory are visible to both, a replica drained with
SIGTERM keeps its open session to the end while new sessions go to the other, and when one is killed new
sessions and the channels made before go to the other at once."""

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.bench.rtc_client import RtcClient
from app.media.clips import MotionClip
from tests.helpers import ServeProcess
from tests.server.harness import upload
from tests.server.test_channel_restart import whep_status

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


class Replica(ServeProcess):
    def __init__(self, name: str, identity_dir: Path, model_root: Path) -> None:
        self.name = name
        args = ["--port", "0", "--no-rtsp", "--identity-dir", str(identity_dir), "--max-sessions", "2"]
        super().__init__(
            "tests.deploy.loopback_serve", args, model_root, stderr=subprocess.DEVNULL, SWAPCAST_DRAIN_TIMEOUT_S="60"
        )

    @property
    def address(self) -> str:
        return self.base_url.removeprefix("http://")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture()
def cluster(tmp_path: Path, model_root: Path) -> Iterator[tuple[str, Replica, Replica]]:
    if shutil.which("haproxy") is None:
        pytest.skip("haproxy is not installed (scripts/setup-dev.sh installs it)")
    shared = tmp_path / "identities"
    replicas = [Replica(name, shared, model_root) for name in ("one", "two")]
    router = None
    try:
        for replica in replicas:
            replica.wait_ready(120)
        bind = f"127.0.0.1:{_free_port()}"
        env = {**os.environ, "SWAPCAST_ROUTER_BIND": bind, "SWAPCAST_MEDIA_1": replicas[0].address,
               "SWAPCAST_MEDIA_2": replicas[1].address}  # fmt: skip
        router = subprocess.Popen(
            ["haproxy", "-f", str(ROOT / "deploy" / "haproxy" / "haproxy.cfg")],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 15
        while True:  # up once both health checks passed
            try:
                if httpx.get(f"http://{bind}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and router.poll() is None, "haproxy did not start"
            time.sleep(0.1)
        time.sleep(4.5)  # rise 2 x inter 2 s: both servers up
        yield f"http://{bind}", replicas[0], replicas[1]
    finally:
        if router is not None:
            router.terminate()
            router.wait(10)
        for replica in replicas:
            replica.stop()


async def owner(http: httpx.AsyncClient, path: str, *replicas: Replica) -> list[str]:
    """The replicas that know the session (each answers 404 for sessions it does not own)."""
    return [r.name for r in replicas if (await http.get(f"http://{r.address}{path}")).status_code == 200]


def test_sessions_stick_to_their_owner_and_a_drained_replica_keeps_its_session(
    cluster: tuple[str, Replica, Replica], tom_png: bytes, clip: MotionClip
) -> None:
    router, one, two = cluster
    identity = upload(router, tom_png, "tom.png").json()["id"]
    for replica in (one, two):  # shared identity directory
        assert httpx.get(f"http://{replica.address}/v1/identities/{identity}").status_code == 200

    async def run() -> tuple[Replica, Replica]:
        async with httpx.AsyncClient(base_url=router, timeout=30) as http:
            first = RtcClient(clip.frames, fps=10)
            await first.connect(http, f"/v1/sessions?identity={identity}")
            assert first.location is not None
            assert await first.wait_frames(2, 60)
            [first_owner] = await owner(http, first.location, one, two)
            for _ in range(30):  # every follow-up call reaches the owner (the other answers 404)
                assert (await http.get(first.location)).status_code == 200

            draining = one if first_owner == "one" else two
            other = two if draining is one else one
            draining.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(1.0)
            assert draining.proc.poll() is None
            assert (await http.get(f"http://{draining.address}/readyz")).status_code == 503

            # New sessions go to the other replica (a 503 from the draining one is retried there).
            for _ in range(2):
                client = RtcClient(clip.frames, fps=10)
                await client.connect(http, f"/v1/sessions?identity={identity}")
                assert client.location is not None
                assert await owner(http, client.location, one, two) == [other.name]
                await http.delete(client.location)
                await client.close()

            # The drained replica's session is still served through the router until it ends.
            assert await first.wait_sent_after(time.monotonic(), 15)
            for _ in range(10):
                assert (await http.get(first.location)).status_code == 200
            assert (await http.delete(first.location)).status_code == 204
            await first.close()
            return draining, other

    draining, other = asyncio.run(run())
    assert draining.proc.wait(30) == 0  # its last session ended: the drain finished and it stopped
    assert other.proc.poll() is None


def test_a_replica_killed_mid_session_leaves_new_sessions_and_channels_to_the_other_within_5_s(
    cluster: tuple[str, Replica, Replica], tom_png: bytes, clip: MotionClip
) -> None:
    router, one, two = cluster
    identity = upload(router, tom_png, "tom.png").json()["id"]
    made = httpx.post(f"{router}/v1/channels", json={"name": "lasting"}, timeout=30)
    assert made.status_code == 201, made.text
    channel = made.json()

    async def run() -> tuple[Replica, float, int]:
        async with httpx.AsyncClient(base_url=router, timeout=30) as http:
            first = RtcClient(clip.frames, fps=10)
            await first.connect(http, f"/v1/sessions?identity={identity}")
            assert first.location is not None and await first.wait_frames(2, 60)
            [first_owner] = await owner(http, first.location, one, two)
            killed = one if first_owner == "one" else two
            survivor = two if killed is one else one

            killed.proc.kill()
            at = time.monotonic()
            while True:  # a new session through the router, as a client would retry it
                client = RtcClient(clip.frames, fps=10)
                try:
                    await client.connect(http, f"/v1/sessions?identity={identity}")
                    break
                except httpx.HTTPStatusError:
                    await client.close()
                    assert time.monotonic() - at < 5.0, "no new session within 5 s of the kill"
                    await asyncio.sleep(0.2)
            took = time.monotonic() - at
            assert client.location is not None
            assert await owner(http, client.location, survivor) == [survivor.name]
            assert await client.wait_frames(2, 30)
            # The killed replica's session is gone with it: answered at once, not left hanging.
            gone = (await http.get(first.location)).status_code
            # The channel made before the kill is served by the survivor, its viewer token still good.
            assert (await http.get("/v1/channels/lasting")).status_code == 200
            assert await whep_status(router, channel["whep_url"], channel["viewer_token"]) == 201
            await http.delete(client.location)
            await client.close()
            await first.close()
            return survivor, took, gone

    survivor, took, gone = asyncio.run(run())
    assert took < 5.0
    assert gone == 404, gone  # retried on the survivor, which does not know it
    assert survivor.proc.poll() is None
