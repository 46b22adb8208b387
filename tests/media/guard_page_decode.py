"""Decode H.264 access units whose bytes end just before an unmapped page, as a server's receiver would get them,
one placement per forked process; prints what happened as JSON. Run by tests/media/test_padded_packets.py:

    python -m tests.media.guard_page_decode           # the decoder the server's receivers get
    python -m tests.media.guard_page_decode --stock   # aiortc's own, for comparison

Each access unit is a real `bytes` object (what aiortc's jitter buffer hands its decoder) laid out in an `mmap`
region whose last page is made PROT_NONE, ending `gap` bytes before that page (the gap counts from the end of the
object, its terminating NUL included). A decoder that reads past the data without padding faults there: the
forked process dies with SIGSEGV and the placement is counted as a fault. A probe that reads the guard page
itself checks that a fault is seen at all."""

from __future__ import annotations

import ctypes
import functools
import json
import mmap
import os
import signal
import sys
from collections.abc import Callable, Sequence
from fractions import Fraction

import av
import numpy as np
from aiortc import rtcrtpreceiver
from aiortc.jitterbuffer import JitterFrame
from aiortc.rtcrtpparameters import RTCRtpCodecParameters

GAPS = range(9)  # bytes between the object's end and the unmapped page
ACCESS_UNITS = 3  # a keyframe and two predicted frames
H264 = RTCRtpCodecParameters(mimeType="video/H264", clockRate=90000, payloadType=102)
PAGE = mmap.PAGESIZE
PROT_NONE = 0
HEADER = bytes.__basicsize__ - 1  # a bytes object's fields before its data (the 1 is the terminating NUL)
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def access_units(count: int = ACCESS_UNITS, size: tuple[int, int] = (320, 240)) -> list[bytes]:
    """Annex B access units from libx264 (the first with its SPS and PPS), as aiortc's depayloader assembles
    them: noise moving across the picture, so the slices are large and varied."""
    codec = av.CodecContext.create("libx264", "w")
    codec.width, codec.height = size
    codec.pix_fmt = "yuv420p"
    codec.time_base = Fraction(1, 30)
    codec.options = {"tune": "zerolatency", "preset": "ultrafast"}
    rng = np.random.default_rng(7)
    noise = rng.integers(0, 256, (size[1], size[0] * 2, 3), dtype=np.uint8)
    units: list[bytes] = []
    for index in range(count * 4):
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(noise[:, index * 8 : index * 8 + size[0]]), "rgb24")
        frame.pts = index
        units.extend(bytes(p) for p in codec.encode(frame.reformat(format="yuv420p")))
        if len(units) >= count:
            break
    return units[:count]


def bytes_before_guard(data: bytes, gap: int) -> bytes:
    """A `bytes` equal to `data` whose object ends `gap` bytes before a PROT_NONE page (never freed)."""
    total = HEADER + len(data) + 1
    pages = -(-(total + gap) // PAGE) + 1
    region = mmap.mmap(-1, pages * PAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    guard = base + (pages - 1) * PAGE
    if _libc.mprotect(guard, PAGE, PROT_NONE) != 0:
        raise OSError(ctypes.get_errno(), "mprotect")
    address = guard - gap - total
    template = bytes(data)  # a real object of this length: its type, size and hash fields are copied
    ctypes.memmove(address, id(template), total)
    ctypes.c_ssize_t.from_address(address).value = 1 << 40  # its memory is not the allocator's: never freed
    placed = ctypes.cast(ctypes.c_void_p(address), ctypes.py_object).value
    assert type(placed) is bytes and placed == data
    _keep.append(region)
    return placed


_keep: list[mmap.mmap] = []


def _in_child(work: Callable[[], object]) -> int | None:
    """Run `work` in a forked process; the signal that ended it, or None when it exited normally."""
    pid = os.fork()
    if pid == 0:
        try:
            work()
        except Exception as exc:  # a decode error is no fault: aiortc's receiver logs it and goes on
            print(f"decode error: {exc}", file=sys.stderr)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WTERMSIG(status) if os.WIFSIGNALED(status) else None


def _decode(
    get_decoder: Callable[[RTCRtpCodecParameters], object], units: Sequence[bytes], index: int, gap: int
) -> None:
    decoder = get_decoder(H264)
    for number, unit in enumerate(units[: index + 1]):
        data = bytes_before_guard(unit, gap) if number == index else unit
        decoder.decode(JitterFrame(data=data, timestamp=number * 3000))  # type: ignore[attr-defined]


def main(argv: Sequence[str]) -> dict[str, object]:
    get_decoder: Callable[[RTCRtpCodecParameters], object]
    if "--stock" in argv:
        from aiortc.codecs import get_decoder
    else:
        import app.media.peer  # noqa: F401  (the server's peer side: it sets up its receivers' decoders)

        get_decoder = rtcrtpreceiver.get_decoder  # the one a receiver's decoder thread calls
    units = access_units()
    probe = _in_child(lambda: ctypes.string_at(id(bytes_before_guard(units[0], 0)) + HEADER + len(units[0]) + 1, 1))
    faults = []
    for index in range(len(units)):
        for gap in GAPS:
            ended = _in_child(functools.partial(_decode, get_decoder, units, index, gap))
            if ended is not None:
                faults.append({"unit": index, "gap": gap, "signal": signal.Signals(ended).name})
    return {
        "decoder": getattr(get_decoder, "__module__", "?") + "." + getattr(get_decoder, "__name__", "?"),
        "unit_sizes": [len(u) for u in units],
        "probe_signal": None if probe is None else signal.Signals(probe).name,
        "placements": len(units) * len(GAPS),
        "faults": faults,
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
