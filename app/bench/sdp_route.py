"""Route a WebRTC connection through a relay by rewriting ICE candidates in SDP: the peer reading the rewritten
description sees one host candidate, the relay's, and never the real one."""

from __future__ import annotations

from app.bench.impair import Address


class NoCandidate(ValueError):
    """The description has no UDP candidate to route."""


def route_candidates(sdp: str, via: Address) -> tuple[str, Address]:
    """`sdp` with its first UDP candidate moved to `via` and every candidate naming another address left out
    (a bundled description repeats the one it uses in each media section); and the address the first candidate
    named (where the relay must forward to)."""
    lines = sdp.splitlines()
    out: list[str] = []
    real: Address | None = None
    for line in lines:
        if not line.startswith("a=candidate:"):
            out.append(line)
            continue
        # a=candidate:<foundation> <component> <transport> <priority> <address> <port> typ <type> ...
        fields = line.split()
        if len(fields) < 8 or fields[2].lower() != "udp":
            continue
        address = (fields[4], int(fields[5]))
        if real is None:
            real = address
        elif address != real:
            continue
        fields[4], fields[5] = via[0], str(via[1])
        out.append(" ".join(fields))
    if real is None:
        raise NoCandidate("the description has no UDP candidate")
    return "\r\n".join(out) + "\r\n", real
