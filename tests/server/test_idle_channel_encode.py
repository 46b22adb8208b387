"""A channel nobody reads costs no encode: a listener SRT push whose caller has not come (or has gone) leaves
the channel's push encode, which then makes no frame at all; when a caller comes, the encode starts, the caller
gets the channel from a keyframe, and a caller that comes later still gets a stream it can play."""

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from app.egress.push_sinks import srt_unavailable_reason
from app.pipeline.pipeline import FramePipeline
from app.server.channels import Channel
from app.settings import PipelineSettings
from tests.helpers import wait_for
from tests.server.harness import LOOPBACK_DESTINATIONS, RunningServer, server_settings, start_server
from tests.server.push_servers import Reader, SrtTransmit, free_port, srt_tools_unavailable
from tests.server.test_push_delivery import SIZE, add_push, make_channel, push_stats

SRT_MISSING = srt_unavailable_reason() or srt_tools_unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(SRT_MISSING is not None, reason=f"no SRT: {SRT_MISSING}")]
PASSPHRASE = "idle-SeCrEt-passphrase"


def channel_of(server: RunningServer, name: str) -> Channel:
    channels = server.state.channels
    assert channels is not None
    return next(c for c in channels.outputs() if c.id == name)


def encoded(server: RunningServer, name: str) -> int:
    channels = server.state.channels
    assert channels is not None and channels.pushes is not None
    return channels.pushes.frames_encoded(channel_of(server, name))


def test_a_listener_push_nobody_calls_encodes_nothing_until_a_caller_comes(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline]
) -> None:
    settings = server_settings(tmp_path / "identities", push_retry_s=0.2, push_retry_max_s=1.0, **LOOPBACK_DESTINATIONS)
    with start_server(settings, pipeline_factory) as server:
        make_channel(server, "idle")
        port = free_port()
        push = add_push(server, "idle", {"url": f"srt://:{port}?mode=listener", "passphrase": PASSPHRASE})
        assert wait_for(lambda: push_stats(server, "idle", push["id"])["state"] == "waiting", 30)
        time.sleep(3.0)
        assert push_stats(server, "idle", push["id"])["state"] == "waiting"
        assert encoded(server, "idle") == 0  # nobody reads: no frame encoded

        for n in range(2):  # a caller, and after it left, another
            caller = SrtTransmit(f"srt://127.0.0.1:{port}?mode=caller&passphrase={PASSPHRASE}", tmp_path / f"{n}.ts")
            try:
                assert wait_for(lambda: push_stats(server, "idle", push["id"])["state"] == "live", 30)
                before = encoded(server, "idle")
                time.sleep(3.0)
                assert encoded(server, "idle") >= before + 2 * SIZE["fps"]
            finally:
                said = caller.stop()
            # The caller went: the push waits again, and the encode stops.
            assert wait_for(lambda: push_stats(server, "idle", push["id"])["state"] == "waiting", 30)
            time.sleep(1.0)
            stopped_at = encoded(server, "idle")
            time.sleep(2.0)
            assert encoded(server, "idle") == stopped_at
            reader = Reader(str(tmp_path / f"{n}.ts"))
            reader._thread.join(60)
            assert len(reader.seen.frames) >= 2 * SIZE["fps"], (n, len(reader.seen.frames), reader.seen.errors, said)
