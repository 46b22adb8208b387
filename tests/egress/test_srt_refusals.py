"""A storm of refused SRT callers from one address, on loopback: the first few refusals are logged and audited
one by one, the rest counted, and the count said in one line when the address's window ends; another address
is logged all the same."""

import ctypes
import logging
from typing import Any

import pytest

from app.egress.srt import lib, listener
from app.egress.srt.listener import REFUSALS_SHOWN, SrtListener
from tests.helpers import wait_for

UNAVAILABLE = lib.unavailable_reason()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"libsrt unavailable: {UNAVAILABLE}")
CALLERS = 30


def caller(srt: Any, port: int) -> int:
    """An SRT caller (non-blocking) asking for a channel the listener does not have."""
    sock = lib.check(srt, srt.srt_create_socket(), "create")
    lib.set_int(srt, sock, lib.SRTO_RCVSYN, 0)
    lib.set_int(srt, sock, lib.SRTO_SNDSYN, 0)
    stream_id = b"nobody-here"
    lib.check(srt, srt.srt_setsockflag(sock, lib.SRTO_STREAMID, stream_id, len(stream_id)), "stream id")
    lib.set_passphrase(srt, sock, "a-guess-at-the-passphrase")
    address = lib.sockaddr("127.0.0.1", port)
    srt.srt_connect.argtypes, srt.srt_connect.restype = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int], ctypes.c_int
    srt.srt_connect(sock, address, len(address))
    return sock


def test_a_storm_of_refused_callers_is_logged_a_few_times_and_counted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(listener, "REFUSAL_WINDOW_S", 8.0)
    caplog.set_level(logging.WARNING, logger="app.egress.srt.listener")
    audited: list[tuple[str, str, str]] = []
    srt_out = SrtListener(0, "127.0.0.1", on_refused=lambda *e: audited.append(e))
    srt_out.start()
    srt = lib.load()
    socks = []
    try:
        socks = [caller(srt, srt_out.port) for _ in range(CALLERS)]
        assert wait_for(lambda: len(audited) + srt_out.refusals_unreported >= CALLERS, 20), audited
        assert len(audited) == REFUSALS_SHOWN and srt_out.refusals_unreported == CALLERS - REFUSALS_SHOWN
        assert all(a == "127.0.0.1" and r == "no channel has that stream id" for a, _, r in audited)
        assert caplog.text.count("refused (stream id 'nobody-here')") == REFUSALS_SHOWN

        srt_out._refused("127.0.0.9", "another", "wrong or missing passphrase")  # another address: its own share
        assert audited[-1][0] == "127.0.0.9"

        summary = f"{CALLERS - REFUSALS_SHOWN} more refusals"
        assert wait_for(lambda: any(summary in reason for _, _, reason in audited), 15), audited[-3:]
        assert caplog.text.count(summary) == 1
    finally:
        for sock in socks:
            srt.srt_close(sock)
        srt_out.stop()
