"""Which local addresses WebRTC media binds and advertises: the explicit list, else the HTTP bind host when it
is one address, else every interface (aioice's default). A server bound to 127.0.0.1 must not open media sockets
on the machine's LAN addresses nor advertise them."""

import ipaddress

from app.server.settings import ServerSettings

_EVERY_INTERFACE = ("", "0.0.0.0", "::")


def media_host_addresses(settings: ServerSettings) -> list[str] | None:
    """The addresses to use, or None for every interface."""
    if settings.ice_host_addresses:
        return list(settings.ice_host_addresses)
    host = settings.host.strip("[]")
    if host in _EVERY_INTERFACE:
        return None
    if host == "localhost":
        return ["127.0.0.1"]
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:  # a host name: let aioice find the interfaces
        return None
