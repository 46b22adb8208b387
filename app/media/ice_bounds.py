"""Bounds on what one WebRTC session's ICE agent sends and learns, against a client that uses it as a packet gun.

aioice sends a STUN check (with up to six retransmissions) to every pair of local and remote candidate, starting a
new one every 20 ms, and answers, and then checks back, every authenticated binding request from an address it has
not seen, learning it as a peer-reflexive candidate. One offer with 300 candidates made the server send 1,722
STUN packets to 300 ports of the client's choosing in 20 s; offers are capped at 16 candidates, and these bounds
cap the rest:

* outgoing STUN requests (checks, their retransmissions, nominations, consent checks) per session and per
  second, over a sliding second; a request over the budget is not sent, as if lost, and its transaction's
  retransmission timer sends it again later when there is budget;
* peer-reflexive candidates per session: binding requests from further unknown addresses are dropped without an
  answer (an answer would go to an address the client chose, possibly spoofed).

aioice has no settings for these; they are put on each session's `aioice.Connection` instances (the hooks are
its own methods, shadowed per instance, so other connections in the process are untouched).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aioice import Connection, stun


@dataclass(frozen=True)
class IceBounds:
    # A browser's checks to the server's one or two host candidates take a handful of requests; the remote
    # candidate cap (16) times a few local addresses is under 50 pairs, which aioice would start within a second.
    checks_per_s: int = 20
    max_peer_reflexive: int = 8


class SlidingSecond:
    """At most `limit` events in any one-second window (the timestamps of the last `limit` events are kept)."""

    def __init__(self, limit: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self._clock = clock
        self._times: deque[float] = deque(maxlen=limit)
        self.refused = 0

    def take(self) -> bool:
        now = self._clock()
        if len(self._times) == self.limit and now - self._times[0] < 1.0:
            self.refused += 1
            return False
        self._times.append(now)
        return True


class BoundedIce:
    """The bounds of one session, applied to each of its ICE connections (one with BUNDLE, more without)."""

    def __init__(self, bounds: IceBounds) -> None:
        self.bounds = bounds
        self.requests = SlidingSecond(bounds.checks_per_s)
        self.unknown_dropped = 0
        self._applied: set[int] = set()

    def describe(self) -> dict[str, int]:
        """What the bounds held back so far: STUN requests not sent, binding requests from unknown addresses."""
        return {"requests_held_back": self.requests.refused, "unknown_addresses_dropped": self.unknown_dropped}

    def apply(self, connections: Iterable[Connection]) -> None:
        """Bound these connections (after gathering: their sockets exist; before connecting: no check sent)."""
        for connection in connections:
            if id(connection) in self._applied:
                continue
            self._applied.add(id(connection))
            for protocol in connection._protocols:
                self._bound_sends(protocol)
            self._bound_peer_reflexive(connection)

    def _bound_sends(self, protocol: Any) -> None:
        send_stun = protocol.send_stun

        def bounded_send(message: stun.Message, addr: tuple[str, int]) -> None:
            if message.message_class == stun.Class.REQUEST and not self.requests.take():
                return
            send_stun(message, addr)

        protocol.send_stun = bounded_send

    def _bound_peer_reflexive(self, connection: Connection) -> None:
        request_received = connection.request_received
        check_incoming = connection.check_incoming

        def refused(addr: tuple[str, int]) -> bool:
            """An address that is no remote candidate yet, while the peer-reflexive ones are at their cap."""
            known = connection._remote_candidates
            if any(c._network_host == addr[0] and c.port == addr[1] for c in known):
                return False
            learnt = sum(1 for c in known if c.type == "prflx")
            if learnt < self.bounds.max_peer_reflexive:
                return False
            self.unknown_dropped += 1
            return True

        def bounded_request(message: stun.Message, addr: tuple[str, int], protocol: Any) -> None:
            if not refused(addr):
                request_received(message, addr, protocol)

        def bounded_incoming(message: stun.Message, addr: tuple[str, int], protocol: Any) -> None:
            # Checks that arrived before connect() are handled here, after it: they must meet the cap as well.
            if not refused(addr):
                check_incoming(message, addr, protocol)

        connection.request_received = bounded_request  # type: ignore[method-assign]
        connection.check_incoming = bounded_incoming  # type: ignore[method-assign]


def ice_connections(pc: Any) -> list[Connection]:
    """The aioice connections under an aiortc RTCPeerConnection's transceivers (one per transport)."""
    found: dict[int, Connection] = {}
    for transceiver in pc.getTransceivers():
        dtls = transceiver.receiver.transport
        connection = getattr(getattr(dtls, "transport", None), "_connection", None)
        if isinstance(connection, Connection):
            found[id(connection)] = connection
    return list(found.values())
