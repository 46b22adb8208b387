"""RTSP output that OBS, ffmpeg or VLC can pull: an embedded gst-rtsp-server.

Three parts, each knowing only the one below it:

* `server`: `RtspServer`, the listening server, its GLib loop, the published paths and which client
  plays which;
* `publisher`: `RtspPublisher`, one published path: its shared media factory and the media it keeps
  prepared between clients;
* `feed`: `EncoderFeed`, the thread that hands the newest pushed frame, as I420, to the path's
  appsrc → x264enc → rtph264pay;
* `audio_feed`: `AudioFeed`, the same for a path's optional Opus stream (appsrc → opusenc → rtpopuspay),
  stamped to play in sync with the frames pushed beside it.

GStreamer and PyGObject are loaded on first use (`bindings`): without them the package still imports,
`RtspServer.available` is False and `RtspServer.unavailable_reason` says what to install.
"""

from app.media.rtsp_out.bindings import APT_PACKAGES, rtsp_unavailable_reason
from app.media.rtsp_out.publisher import RtspPublisher
from app.media.rtsp_out.server import RtspServer, normalise_path

__all__ = [
    "APT_PACKAGES",
    "RtspPublisher",
    "RtspServer",
    "normalise_path",
    "rtsp_unavailable_reason",
]
