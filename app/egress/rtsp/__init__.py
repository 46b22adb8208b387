"""RTSP output that OBS, ffmpeg or VLC can pull: an embedded gst-rtsp-server.

Three parts, each knowing only the one below it:

* `server`: `RtspServer`, the listening server, its GLib loop, the published paths and which client
  plays which;
* `publisher`: `RtspPublisher`, one published path: its shared media factory and the media it keeps
  prepared between clients;
* `packet_feed`: `PacketFeed`, the thread that hands a `SharedEncode`'s H.264 (a channel's, or the path's own,
  `app.egress.path`) as it is to the path's appsrc → rtph264pay, the path a reader of the encode only while it
  is played;
* `audio_feed`: `AudioFeed`, the same for a path's optional Opus stream (appsrc → opusenc → rtpopuspay),
  stamped to play in sync with the frames pushed beside it.

GStreamer and PyGObject are loaded on first use (`bindings`): without them the package still imports,
`RtspServer.available` is False and `RtspServer.unavailable_reason` says what to install.
"""

from app.egress.rtsp.bindings import APT_PACKAGES, rtsp_unavailable_reason
from app.egress.rtsp.publisher import RtspPublisher
from app.egress.rtsp.server import RtspServer, normalise_path

__all__ = [
    "APT_PACKAGES",
    "RtspPublisher",
    "RtspServer",
    "normalise_path",
    "rtsp_unavailable_reason",
]
