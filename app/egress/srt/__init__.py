"""SRT output: channels read on one UDP port, each caller naming its channel by stream id and proving the
channel's passphrase (OBS's Media Source: `srt://HOST:PORT?streamid=NAME&passphrase=...`).

* `lib`: libsrt through ctypes, loaded on first use (`unavailable_reason` says what to install);
* `listener`: `SrtListener`, the port: the accept hook that sets each connection's passphrase from its stream
  id, the accept loop, the channels served and refusals reported;
* `fanout`: one channel's callers, each sent every chunk without ever waiting on one;
* `encode`: a channel's one MPEG-TS encode (H.264 + AAC) for all its callers, while it has any.
"""

from app.egress.srt.lib import unavailable_reason
from app.egress.srt.listener import SrtListener, channel_of

__all__ = ["SrtListener", "channel_of", "unavailable_reason"]
