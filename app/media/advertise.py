"""Advertised address for ICE host candidates: behind a NAT that forwards the media ports one to one (a
container on a bridge network publishing a UDP range, a cloud VM with a public IP), the answer must name
the address clients can reach, not the private one the sockets are bound to."""

import ipaddress


def advertise_host_candidates(sdp: str, address: str) -> str:
    """`sdp` with the address of every host candidate of the same IP version (and of the c= lines) replaced
    by `address`."""
    version = ipaddress.ip_address(address).version
    family = "IP6" if version == 6 else "IP4"
    lines = []
    for line in sdp.split("\r\n"):
        if line.startswith("a=candidate:"):
            fields = line.split(" ")
            if len(fields) > 7 and fields[6] == "typ" and fields[7] == "host" and _version(fields[4]) == version:
                fields[4] = address
                line = " ".join(fields)
        elif line.startswith("c=IN "):
            line = f"c=IN {family} {address}"
        lines.append(line)
    return "\r\n".join(lines)


def _version(address: str) -> int | None:
    try:
        return ipaddress.ip_address(address).version
    except ValueError:  # an mDNS .local name
        return None
