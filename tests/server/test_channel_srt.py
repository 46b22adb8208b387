"""Channels read over SRT on the server's one SRT port, with FFmpeg as the caller (OBS's Media Source is built on
it): the stream id picks the channel, the channel's passphrase is required, many callers read one channel and
others another at once, each channel encoded once; a wrong passphrase, an unknown stream id and a rotated
channel's old passphrase are refused, and each refusal is audited without the passphrase."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import httpx
import pytest

from app.auth.keys import KeyStore
from app.auth.settings import AccessSettings
from app.egress.srt import channel_of, unavailable_reason
from app.pipeline.pipeline import FramePipeline
from app.server.srt import SrtOutput
from app.settings import PipelineSettings
from tests.helpers import wait_for
from tests.server.credentials import USER_SCOPES, bearer
from tests.server.harness import RunningServer, server_settings, start_server


def _ffmpeg_srt_reason() -> str | None:
    try:
        protocols = subprocess.run(["ffmpeg", "-hide_banner", "-protocols"], capture_output=True, text=True).stdout
    except OSError:
        return "ffmpeg is not installed"
    return None if "\n  srt\n" in protocols.split("Output:")[0] else "this ffmpeg has no SRT protocol"


SRT_MISSING = unavailable_reason() or _ffmpeg_srt_reason()
needs_srt = pytest.mark.skipif(SRT_MISSING is not None, reason=f"SRT cannot run here: {SRT_MISSING}")

SIZE = {"width": 320, "height": 240, "fps": 15}
READ_S = 3


@dataclass
class Server:
    running: RunningServer
    key: str
    audit: Path

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        url = f"{self.running.base_url}{path}"
        return httpx.request(method, url, headers=bearer(self.key), timeout=30, **kwargs)

    def channel(self, name: str) -> dict[str, Any]:
        response = self.call("GET", f"/v1/channels/{name}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def audited(self, event: str) -> list[dict[str, Any]]:
        lines = self.audit.read_text().splitlines() if self.audit.exists() else []
        return [e for e in map(json.loads, lines) if e["event"] == event]


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, pipeline_factory: Callable[[PipelineSettings], FramePipeline]
) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("srt")
    key = KeyStore(root / "keys.json").create("alice", USER_SCOPES)[1]
    audit = root / "audit.jsonl"
    access = AccessSettings(keys_file=root / "keys.json", auth_failure_delay_s=0.0, audit_log=str(audit))
    settings = server_settings(root / "identities", access=access, srt_port=0)
    with start_server(settings, pipeline_factory) as running:
        yield Server(running, key, audit)


def read(url: str, out: Path, seconds: float = READ_S) -> subprocess.Popen[str]:
    """FFmpeg as the SRT caller, copying what it receives into an MPEG-TS file for `seconds`."""
    command = ["ffmpeg", "-v", "error", "-y", "-i", url, "-t", str(seconds), "-c", "copy", "-flush_packets", "1"]
    command += ["-f", "mpegts", str(out)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finished(process: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    _, err = process.communicate(timeout=timeout)
    return process.returncode, err


def decoded(path: Path) -> tuple[int, tuple[int, int], list[str]]:
    """Video frames decoded from a received file, their size, and the codecs of its streams."""
    with av.open(str(path)) as container:
        codecs = sorted(s.codec_context.name for s in container.streams)
        frames = list(container.decode(video=0))
    return len(frames), (frames[0].width, frames[0].height) if frames else (0, 0), codecs


def with_query(url: str, **changes: str) -> str:
    parts = urllib.parse.urlsplit(url)
    query = dict(urllib.parse.parse_qsl(parts.query))
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode({**query, **changes})))


def encode_threads(name: str) -> int:
    """The channel's shared encodes running (its one, whatever reads it)."""
    return sum(1 for t in threading.enumerate() if t.name == f"shared-encode-{name}")


def test_stream_ids_name_a_channel_plainly_or_in_srts_access_control_form() -> None:
    assert channel_of("studio") == "studio"
    assert channel_of("#!::r=studio,m=request") == "studio"
    assert channel_of("#!::u=obs,r=studio") == "studio"
    assert channel_of("#!::r=studio,m=publish") is None  # the port only serves reading
    assert channel_of("#!::m=request") is None
    assert channel_of("") is None


def test_without_a_port_there_is_no_srt_output() -> None:
    output = SrtOutput(port=None, host="127.0.0.1", public_host="127.0.0.1")
    output.start()
    assert not output.available and output.reason is not None and "SWAPCAST_SRT_PORT" in output.reason


@needs_srt
@pytest.mark.slow
def test_callers_read_their_channels_by_stream_id_and_passphrase(server: Server, tmp_path: Path) -> None:
    for name in ("studio", "stage"):
        assert server.call("POST", "/v1/channels", json={"name": name, **SIZE}).status_code == 201
    studio, stage = server.channel("studio"), server.channel("stage")
    assert server.call("GET", "/v1/server").json()["srt"] == {"available": True, "reason": None}
    url = studio["srt_url"]
    assert url.startswith("srt://127.0.0.1:") and "streamid=studio" in url
    rtsp_password = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["passphrase"][0]
    assert len(rtsp_password) >= 10
    listed = {c["name"]: c for c in server.call("GET", "/v1/channels").json()["channels"]}
    assert listed["studio"]["srt_url"] == url

    # Two callers on one channel (one in the access-control form), one on another, all at once.
    # As SRT's documents write it: this FFmpeg (5.1) takes the stream id as it stands in the URL.
    access_form = url.replace("streamid=studio", "streamid=#!::r=studio,m=request")
    outs = [tmp_path / f"{n}.ts" for n in ("a", "b", "c")]
    readers = [read(url, outs[0], 6), read(access_form, outs[1], 6), read(stage["srt_url"], outs[2], 6)]
    try:
        assert wait_for(lambda: server.channel("studio")["consumers"].get("srt") == 2, 30)
        assert wait_for(lambda: server.channel("stage")["consumers"].get("srt") == 1, 10)
        assert encode_threads("studio") == 1 and encode_threads("stage") == 1  # one encode per channel
    finally:
        results = [finished(r) for r in readers]
    for (code, err), out in zip(results, outs, strict=True):
        assert code == 0, err
        frames, size, codecs = decoded(out)
        assert frames >= 10 and size == (320, 240), (out.name, frames, size)
        assert codecs == ["aac", "h264"]
    # The callers gone, their channels' encodes stop.
    assert wait_for(lambda: encode_threads("studio") == 0 and encode_threads("stage") == 0, 20)


@needs_srt
@pytest.mark.slow
def test_a_wrong_passphrase_or_an_unknown_stream_id_is_refused_and_audited(server: Server, tmp_path: Path) -> None:
    assert server.call("POST", "/v1/channels", json={"name": "locked", **SIZE}).status_code == 201
    url = server.channel("locked")["srt_url"]
    attempts = {
        "wrong": with_query(url, passphrase="not-the-passphrase"),
        "unknown": with_query(url, streamid="nobody-here"),
    }
    for label, attempt in attempts.items():
        out = tmp_path / f"{label}.ts"
        code, _ = finished(read(attempt, out))
        assert code != 0, label
        assert not out.exists() or out.stat().st_size == 0, label

    def refusals() -> list[dict[str, Any]]:
        return [e for e in server.audited("srt_refused") if e["stream_id"] in ("locked", "nobody-here")]

    assert wait_for(lambda: {e["stream_id"] for e in refusals()} == {"locked", "nobody-here"}, 20)
    reasons = {e["stream_id"]: e["reason"] for e in refusals()}
    assert reasons == {"locked": "wrong or missing passphrase", "nobody-here": "no channel has that stream id"}
    assert all(e["client"] == "127.0.0.1" for e in refusals())
    passphrase = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["passphrase"][0]
    assert passphrase not in server.audit.read_text() and "not-the-passphrase" not in server.audit.read_text()
    assert server.channel("locked")["consumers"]["srt"] == 0


@needs_srt
@pytest.mark.slow
def test_rotating_a_channel_disconnects_its_callers_and_refuses_the_old_passphrase(
    server: Server, tmp_path: Path
) -> None:
    assert server.call("POST", "/v1/channels", json={"name": "rotating", **SIZE}).status_code == 201
    old = server.channel("rotating")["srt_url"]
    before = tmp_path / "before.ts"
    long_read = read(old, before, 120)
    try:
        assert wait_for(lambda: server.channel("rotating")["consumers"].get("srt") == 1, 30)
        assert wait_for(lambda: before.exists() and before.stat().st_size > 0, 30)  # FFmpeg is past probing
        rotated = server.call("POST", "/v1/channels/rotating/rotate")
        assert rotated.status_code == 200, rotated.text
        new = rotated.json()["srt_url"]
        assert new != old and server.channel("rotating")["srt_url"] == new
        finished(long_read, timeout=40)  # cut off long before its 120 s
    finally:
        if long_read.poll() is None:
            long_read.kill()
    assert decoded(before)[0] > 0

    code, _ = finished(read(old, tmp_path / "old.ts"))
    assert code != 0
    assert wait_for(lambda: any(e["stream_id"] == "rotating" for e in server.audited("srt_refused")), 20)
    code, err = finished(read(new, tmp_path / "new.ts"))
    assert code == 0, err
    assert decoded(tmp_path / "new.ts")[0] >= 10


@needs_srt
@pytest.mark.slow
def test_a_caller_that_stops_reading_neither_stalls_the_others_nor_stays(server: Server, tmp_path: Path) -> None:
    assert server.call("POST", "/v1/channels", json={"name": "shared", **SIZE}).status_code == 201
    url = server.channel("shared")["srt_url"]
    moving, stuck = tmp_path / "moving.ts", tmp_path / "stuck.ts"
    readers = [read(url, moving, 120), read(url, stuck, 120)]
    try:
        assert wait_for(lambda: server.channel("shared")["consumers"].get("srt") == 2, 30)
        os.kill(readers[1].pid, signal.SIGSTOP)  # takes nothing more, answers nothing
        assert wait_for(lambda: moving.exists() and moving.stat().st_size > 0, 30)
        size = moving.stat().st_size
        # The other caller keeps receiving, through the stopped one's last seconds and after it is dropped.
        assert wait_for(lambda: moving.stat().st_size > size, 20)
        assert wait_for(lambda: server.channel("shared")["consumers"]["srt"] == 1, 40)
        size = moving.stat().st_size
        assert wait_for(lambda: moving.stat().st_size > size, 20)
    finally:
        for reader in readers:
            os.kill(reader.pid, signal.SIGCONT)
            reader.kill()
            reader.wait(10)
