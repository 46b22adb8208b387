"""libsrt (Debian's `libsrt1.5-openssl`) through ctypes, loaded on first use.

Only what the SRT output uses: a listener socket with an accept hook, non-blocking sends, epoll for the accept
loop. ctypes releases Python's lock around every call, so a blocking libsrt call never holds up other threads.
Constants are libsrt 1.5's (`srt.h`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import socket
import struct
import threading
from typing import Any

APT_PACKAGE = "libsrt1.5-openssl"
# The OpenSSL flavour first (what the set-up installs); GnuTLS's (what GStreamer's SRT plugin links) will do.
LIBRARY_NAMES = ("libsrt.so.1.5", "libsrt-gnutls.so.1.5", "libsrt-openssl.so.1.5")

# SRT_SOCKOPT
SRTO_SNDSYN = 1
SRTO_RCVSYN = 2
SRTO_LATENCY = 23
SRTO_PASSPHRASE = 26
SRTO_STREAMID = 46
SRTO_ENFORCEDENCRYPTION = 53
SRTO_PEERIDLETIMEO = 55
# SRT_SOCKSTATUS
SRTS_CONNECTED = 5
SRTS_BROKEN = 6
SRTS_CLOSING = 7
SRTS_CLOSED = 8
SRTS_NONEXIST = 9
GONE_STATES = frozenset({SRTS_BROKEN, SRTS_CLOSING, SRTS_CLOSED, SRTS_NONEXIST})
# SRT_EPOLL_OPT
SRT_EPOLL_IN = 0x1
SRT_EPOLL_ERR = 0x8
# SRT_ERRNO
SRT_EASYNCSND = 6001
SRT_ERROR = -1
SRT_INVALID_SOCK = -1
LOG_CRIT = 2  # syslog's levels
# libsrt's bounds on a passphrase's length
PASSPHRASE_LENGTH = (10, 79)

# int (*)(void* opaque, SRTSOCKET ns, int hsversion, const struct sockaddr* peer, const char* streamid)
ListenHook = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p
)


class EpollEvent(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_int), ("events", ctypes.c_int)]


class SrtError(Exception):
    """libsrt refused a call; the message is libsrt's."""


class SrtUnavailable(Exception):
    """libsrt cannot be loaded here; the message says what to install."""


def _bind(lib: Any) -> Any:
    i, p, pi = ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)
    signatures: dict[str, tuple[Any, list[Any]]] = {
        "srt_startup": (i, []),
        "srt_setloglevel": (None, [i]),
        "srt_cleanup": (i, []),
        "srt_create_socket": (i, []),
        "srt_setsockflag": (i, [i, i, p, i]),
        "srt_bind": (i, [i, p, i]),
        "srt_listen": (i, [i, i]),
        "srt_accept": (i, [i, p, pi]),
        "srt_listen_callback": (i, [i, ListenHook, p]),
        "srt_sendmsg2": (i, [i, ctypes.c_char_p, i, p]),
        "srt_close": (i, [i]),
        "srt_getlasterror": (i, [pi]),
        "srt_getlasterror_str": (ctypes.c_char_p, []),
        "srt_getsockstate": (i, [i]),
        "srt_getsockname": (i, [i, p, pi]),
        "srt_epoll_create": (i, []),
        "srt_epoll_add_usock": (i, [i, i, pi]),
        "srt_epoll_uwait": (i, [i, ctypes.POINTER(EpollEvent), i, ctypes.c_int64]),
        "srt_epoll_release": (i, [i]),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype, function.argtypes = restype, argtypes
    return lib


_lock = threading.Lock()
_lib: Any = None


def load() -> Any:
    """The bound library, started once per process. `SrtUnavailable` when it cannot be loaded."""
    global _lib
    with _lock:
        if _lib is None:
            names = [*LIBRARY_NAMES, ctypes.util.find_library("srt")]
            errors = []
            for name in [n for n in names if n]:
                try:
                    lib = _bind(ctypes.CDLL(name))
                except (OSError, AttributeError) as exc:
                    errors.append(str(exc))
                    continue
                if lib.srt_startup() < 0:
                    raise SrtUnavailable(f"libsrt did not start: {last_error(lib)}")
                # Critical messages only: libsrt writes to stderr, and refusals are logged here, once each.
                lib.srt_setloglevel(LOG_CRIT)
                _lib = lib
                break
            else:
                raise SrtUnavailable(f"the SRT output needs libsrt: apt-get install {APT_PACKAGE} ({errors[0]})")
        return _lib


def unavailable_reason() -> str | None:
    """Why the SRT output cannot run here (None when it can)."""
    try:
        load()
    except SrtUnavailable as exc:
        return str(exc)
    return None


def last_error(lib: Any) -> str:
    message: bytes | None = lib.srt_getlasterror_str()
    return message.decode(errors="replace") if message else "unknown error"


def last_errno(lib: Any) -> int:
    return int(lib.srt_getlasterror(None))


def check(lib: Any, result: int, what: str) -> int:
    if result == SRT_ERROR:
        raise SrtError(f"{what}: {last_error(lib)}")
    return result


def set_int(lib: Any, sock: int, option: int, value: int) -> None:
    number = ctypes.c_int(value)
    check(lib, lib.srt_setsockflag(sock, option, ctypes.byref(number), ctypes.sizeof(number)), f"option {option}")


def set_bool(lib: Any, sock: int, option: int, value: bool) -> None:
    flag = ctypes.c_bool(value)
    check(lib, lib.srt_setsockflag(sock, option, ctypes.byref(flag), ctypes.sizeof(flag)), f"option {option}")


def set_passphrase(lib: Any, sock: int, passphrase: str) -> None:
    data = passphrase.encode()
    check(lib, lib.srt_setsockflag(sock, SRTO_PASSPHRASE, data, len(data)), "passphrase")


def sockaddr(host: str, port: int) -> bytes:
    """`struct sockaddr_in` or `sockaddr_in6` (Linux layout) for `host`, a name or an address."""
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    packed = socket.inet_pton(family, str(address[0]))
    if family == socket.AF_INET6:
        return struct.pack("=H", family) + struct.pack(">HI", port, 0) + packed + bytes(4)
    return struct.pack("=H", family) + struct.pack(">H", port) + packed + bytes(8)


def peer_address(pointer: int | None) -> str:
    """The address in a `struct sockaddr *` libsrt handed over ('unknown' when there is none)."""
    if not pointer:
        return "unknown"
    raw = ctypes.string_at(pointer, 28)
    family = struct.unpack("=H", raw[:2])[0]
    if family == socket.AF_INET6:
        return socket.inet_ntop(family, raw[8:24])
    if family == socket.AF_INET:
        return socket.inet_ntop(family, raw[4:8])
    return "unknown"


def bound_port(lib: Any, sock: int) -> int:
    buffer = ctypes.create_string_buffer(128)
    size = ctypes.c_int(len(buffer))
    check(lib, lib.srt_getsockname(sock, buffer, ctypes.byref(size)), "getsockname")
    return int(struct.unpack(">H", buffer.raw[2:4])[0])
