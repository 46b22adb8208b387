"""GStreamer, GstRtspServer and GstVideo through PyGObject, loaded once on first use.

Without them everything here still imports: `rtsp_unavailable_reason()` says what to install and
`require_bindings()` refuses with that reason.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from app.errors import UserError

APT_PACKAGES = (
    "gir1.2-gst-rtsp-server-1.0 gir1.2-gst-plugins-base-1.0 gstreamer1.0-plugins-base "
    "gstreamer1.0-plugins-good gstreamer1.0-plugins-ugly"
)
PYGOBJECT_HINT = (
    "apt-get install libgirepository1.0-dev libcairo2-dev pkg-config gcc, then pip install 'PyGObject<3.51'"
)

# Elements every published path needs, and the Debian package that ships each.
REQUIRED_ELEMENTS = {
    "appsrc": "gstreamer1.0-plugins-base",
    "rtph264pay": "gstreamer1.0-plugins-good",
    "opusenc": "gstreamer1.0-plugins-base",
    "rtpopuspay": "gstreamer1.0-plugins-good",
}


@dataclass(frozen=True)
class Bindings:
    """The GObject-introspection modules this package uses (untyped, so kept in one place)."""

    Gst: Any
    GLib: Any
    GstRtspServer: Any
    GstVideo: Any


_lock = threading.Lock()
_loaded: tuple[Bindings | None, str | None] | None = None


def _import() -> tuple[Bindings | None, str | None]:
    try:
        import gi
    except ImportError:
        return None, f"PyGObject is not installed: {PYGOBJECT_HINT}"
    try:
        gi.require_version("Gst", "1.0")
        gi.require_version("GstRtspServer", "1.0")
        gi.require_version("GstVideo", "1.0")
        from gi.repository import GLib, Gst, GstRtspServer, GstVideo
    except (ImportError, ValueError) as exc:
        return None, f"GStreamer RTSP bindings not installed ({exc}): apt-get install {APT_PACKAGES}"
    try:
        ok, _argv = Gst.init_check(None)
    except GLib.Error as exc:
        return None, f"GStreamer failed to initialise: {exc.message}"
    if not ok:
        return None, "GStreamer failed to initialise"
    missing = [name for name in REQUIRED_ELEMENTS if Gst.ElementFactory.find(name) is None]
    if missing:
        packages = " ".join(sorted({REQUIRED_ELEMENTS[name] for name in missing}))
        return None, f"GStreamer elements missing ({', '.join(missing)}): apt-get install {packages}"
    return Bindings(Gst=Gst, GLib=GLib, GstRtspServer=GstRtspServer, GstVideo=GstVideo), None


def load_bindings() -> tuple[Bindings | None, str | None]:
    """The bindings, or None and the reason they cannot be used here."""
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _import()
        return _loaded


def rtsp_unavailable_reason() -> str | None:
    """Why RTSP cannot be served on this machine, or None when it can."""
    return load_bindings()[1]


def require_bindings() -> Bindings:
    gst, reason = load_bindings()
    if gst is None:
        raise UserError(f"RTSP is not available: {reason}")
    return gst
