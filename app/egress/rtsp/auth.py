"""Per-path logins for the RTSP server, checked by gst-rtsp-server itself with Digest authentication (the
password never crosses the network). Each login's token carries a role named after its user; a path's media
factory grants access to that one role, so a client without a login is asked to authenticate (401) and one
with another path's login does not even learn the path exists (404).

A path nobody publishes is sent to a factory that grants nobody anything (`guarded_mount_points`), so it is
refused with the same 401 and challenge as a published one: the answer does not say which paths exist."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.egress.rtsp.bindings import Bindings


def new_auth(gst: Bindings) -> Any:
    import gi

    gi.require_version("GstRtsp", "1.0")
    from gi.repository import GstRtsp

    auth = gst.GstRtspServer.RTSPAuth.new()
    auth.set_supported_methods(GstRtsp.RTSPAuthMethod.DIGEST)
    auth.set_realm("swapcast")
    return auth


def add_login(gst: Bindings, auth: Any, user: str, password: str) -> None:
    token = gst.GstRtspServer.RTSPToken()
    token.set_string("media.factory.role", user)
    auth.add_digest(user, password, token)


def remove_login(auth: Any, user: str) -> None:
    auth.remove_digest(user)


def allow_only(gst: Bindings, factory: Any, user: str) -> None:
    """Only the login named `user` may see and play this factory's media."""
    structure, _ = gst.Gst.Structure.from_string(
        f"{user}, media.factory.access=(boolean)true, media.factory.construct=(boolean)true"
    )
    factory.add_role_from_structure(structure)


DENIED_PATH = "/-"  # not a path `normalise_path` accepts for publishing, so never a real one


def guarded_mount_points(gst: Bindings, published: Callable[[str], bool]) -> Any:
    """Mount points that send every request for an unpublished path (`published(path)` false) to a factory no
    role may access."""

    class GuardedMountPoints(gst.GstRtspServer.RTSPMountPoints):  # type: ignore[name-defined]
        def do_make_path(self, url: Any) -> str:
            path = str(url.abspath)
            return path if published(path) else DENIED_PATH

    mounts = GuardedMountPoints()
    mounts.add_factory(DENIED_PATH, gst.GstRtspServer.RTSPMediaFactory.new())
    return mounts


def is_unauthorized(response: Any) -> bool:
    """Whether an RTSP response message is a 401."""
    import gi

    gi.require_version("GstRtsp", "1.0")
    from gi.repository import GstRtsp

    parsed = response.parse_response()
    return bool(parsed[0] == GstRtsp.RTSPResult.OK and parsed[1] == GstRtsp.RTSPStatusCode.UNAUTHORIZED)
