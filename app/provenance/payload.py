"""The 48 bits a watermark carries, and the 64 it protects (the 48 plus a CRC-16 that confirms a read; `fec`
codes these 64 into the 140 that are embedded).

Layout, most significant first: server id (16 bits), mark id (24 bits, drawn per session or file), hour of issue
modulo 256 (8 bits, about ten and a half days; with the registry's full time it tells two issues of one mark id
apart)."""

from __future__ import annotations

import binascii
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

SERVER_BITS = 16
MARK_BITS = 24
HOUR_BITS = 8
DATA_BITS = SERVER_BITS + MARK_BITS + HOUR_BITS  # 48
CRC_BITS = 16
CODE_BITS = DATA_BITS + CRC_BITS  # 64

Bits = npt.NDArray[np.uint8]


@dataclass(frozen=True)
class Payload:
    server_id: int
    mark_id: int
    hour: int  # hours since the Unix epoch, modulo 256

    def __post_init__(self) -> None:
        for name, value, bits in (
            ("server_id", self.server_id, SERVER_BITS),
            ("mark_id", self.mark_id, MARK_BITS),
            ("hour", self.hour, HOUR_BITS),
        ):
            if not 0 <= value < 1 << bits:
                raise ValueError(f"{name} must be within 0..{(1 << bits) - 1}, got {value}")

    @classmethod
    def at(cls, server_id: int, mark_id: int, unix_time: float) -> Payload:
        return cls(server_id, mark_id, int(unix_time // 3600) % (1 << HOUR_BITS))

    def value(self) -> int:
        """The 48 data bits as one integer."""
        return (self.server_id << (MARK_BITS + HOUR_BITS)) | (self.mark_id << HOUR_BITS) | self.hour

    def hex(self) -> str:
        return f"{self.value():012x}"

    def to_bits(self) -> Bits:
        """The 64 protected bits: the data, then its CRC-16 (CCITT)."""
        data = self.value().to_bytes(DATA_BITS // 8, "big")
        word = data + binascii.crc_hqx(data, 0).to_bytes(2, "big")
        return np.unpackbits(np.frombuffer(word, np.uint8))

    @classmethod
    def from_bits(cls, bits: npt.ArrayLike) -> Payload | None:
        """The payload of 64 read bits, or None when their CRC does not match (a wrong read)."""
        arr = np.asarray(bits, dtype=np.uint8).reshape(-1)
        if arr.size != CODE_BITS:
            raise ValueError(f"expected {CODE_BITS} bits, got {arr.size}")
        word = np.packbits(arr).tobytes()
        data, crc = word[: DATA_BITS // 8], int.from_bytes(word[DATA_BITS // 8 :], "big")
        if binascii.crc_hqx(data, 0) != crc:
            return None
        value = int.from_bytes(data, "big")
        return cls(
            server_id=value >> (MARK_BITS + HOUR_BITS),
            mark_id=(value >> HOUR_BITS) & ((1 << MARK_BITS) - 1),
            hour=value & ((1 << HOUR_BITS) - 1),
        )


def crc_syndrome(bits: npt.ArrayLike) -> int:
    """CRC of the 48 data bits XOR the 16 CRC bits read: 0 when the read passes."""
    word = np.packbits(np.asarray(bits, dtype=np.uint8).reshape(-1)).tobytes()
    return binascii.crc_hqx(word[: DATA_BITS // 8], 0) ^ int.from_bytes(word[DATA_BITS // 8 :], "big")
