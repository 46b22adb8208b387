"""What a push's owner is told when it fails: one of a few classes a streamer can act on. A closed port, a silent
one, one that hangs up and each HTTP status all read alike within their class, so a push's `last_error` cannot
be used to map a network; the full reason (secrets hidden) goes to the server's log, for admins."""

from __future__ import annotations

import errno
import socket
from typing import Literal

from app.destination_policy import DestinationRefused
from app.egress.push_sinks import PushSinkError

FailureClass = Literal["connect", "refused", "timeout", "policy", "internal"]

SHOWN: dict[FailureClass, str] = {
    "connect": "cannot connect to the destination",
    "refused": "the destination refused the stream or its key",
    "timeout": "the destination did not answer in time",
    "policy": "the destination's address is not allowed here",
    "internal": "the push failed on this server",
}
_CONNECT_ERRNOS = {
    errno.ECONNREFUSED,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.EADDRNOTAVAIL,
    errno.EHOSTDOWN,
    errno.ENETDOWN,
}
_TIMEOUT_ERRNOS = {errno.ETIMEDOUT, errno.EAGAIN}
_CONNECT_WORDS = ("connection refused", "unreachable", "resolve", "name or service", "no listener answered")
_TIMEOUT_WORDS = ("timed out", "timeout", "in time", "took nothing", "immediate exit requested")
_INTERNAL_WORDS = ("push process ended", "pushes need")


class PushFailed(PushSinkError):
    """A push attempt that failed, with the class its owner is shown; the message is for the server's log."""

    def __init__(self, message: str, kind: FailureClass) -> None:
        super().__init__(message)
        self.kind: FailureClass = kind


def classify(exc: BaseException) -> FailureClass:
    """The class of a push attempt's failure, from the error FFmpeg, GStreamer or the policy raised."""
    if isinstance(exc, PushFailed):
        return exc.kind
    if isinstance(exc, DestinationRefused):
        return "policy"
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timeout"
    if isinstance(exc, ConnectionRefusedError | socket.gaierror):
        return "connect"
    code = exc.errno if isinstance(exc, OSError) else None
    if code is not None and abs(code) in _CONNECT_ERRNOS:
        return "connect"
    if code is not None and abs(code) in _TIMEOUT_ERRNOS:
        return "timeout"
    text = str(exc).lower()
    if any(word in text for word in _INTERNAL_WORDS):
        return "internal"
    if any(word in text for word in _TIMEOUT_WORDS):  # PyAV's own time-out interrupts FFmpeg: "exit requested"
        return "timeout"
    if any(word in text for word in _CONNECT_WORDS):
        return "connect"
    # An HTTP status, a refused key or passphrase, a peer that hung up or answered in another protocol.
    return "refused"


def shown(kind: FailureClass) -> str:
    return SHOWN[kind]
