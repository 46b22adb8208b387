"""The server's own frame counters as `swapcast bench egress` reads them: every numeric figure about frames or
packets in the channel's, the session's and the pushes' JSON and in `/metrics`, flattened to dotted names, so
that servers of different versions (which expose different figures) are read alike, a missing one as null."""

from __future__ import annotations

import fnmatch
import re
from typing import Any

COUNTED = re.compile(r"frames|packets|encoded", re.I)
METRIC = re.compile(r"^(swapcast_\w*(?:frames|encoded)\w*_total)(\{[^}]*\})?\s+([0-9.eE+-]+)$", re.M)

# Each encoder the server may expose, by the dotted name(s) of its "frames encoded" figure (a pattern sums its
# matches). Older servers lack some: those are null.
ENCODERS = {
    "channel_shared_encode": ("channel.egress.encode.frames_encoded",),
    "channel_whep_hub": ("channel_whep.frames_encoded",),
    "channel_rtsp_feed": ("channel.egress.rtsp.frames_encoded", "channel.rtsp.frames_encoded"),
    "channel_srt": ("channel.egress.srt.frames_encoded", "channel.srt.frames_encoded"),
    "pushes": ("pushes.pushes.*.frames_encoded",),
    "session_return": ("session.egress.return_frames_encoded",),
    "session_path_encode": ("session.egress.encode.frames_encoded",),
    "session_whep_hub": ("session_whep.frames_encoded",),
}
# What the outputs passed on, where no encoder figure exists (not encodes: a push sends the shared encode's
# frames, a session's return encodes what it outputs).
OUTPUTS = {
    "channel_rtsp_feed_sent": ("channel.egress.rtsp.frames_sent", "channel.rtsp.frames_sent"),
    "pushes_sent": ("pushes.pushes.*.frames_sent",),
    "session_out": ("session.frames_out",),
}


def _walk(value: Any, prefix: str, out: dict[str, float]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _walk(item, f"{prefix}.{key}" if prefix else str(key), out)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _walk(item, f"{prefix}.{index}", out)
    elif isinstance(value, int | float) and not isinstance(value, bool) and COUNTED.search(prefix.rsplit(".", 1)[-1]):
        out[prefix] = float(value)


def flatten_counters(snapshot: dict[str, Any]) -> dict[str, float]:
    """Dotted name -> value of every frame or packet figure in a snapshot (JSON parts and the metrics text)."""
    out: dict[str, float] = {}
    for part, value in snapshot.items():
        if part == "metrics":
            for name, labels, number in METRIC.findall(value or ""):
                out[f"metrics.{name}{labels}"] = float(number)
        elif value is not None:
            _walk(value, part, out)
    return out


def window_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """How much each figure grew over the window (a figure that appeared in it counts from 0)."""
    return {name: round(value - before.get(name, 0.0), 3) for name, value in sorted(after.items())}


def _encoded(deltas: dict[str, float], patterns: tuple[str, ...]) -> float | None:
    for pattern in patterns:
        found = [value for name, value in deltas.items() if fnmatch.fnmatchcase(name, pattern)]
        if found:
            return sum(found)
    return None


def per_frame(deltas: dict[str, float], published: float, figures: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    """Each figure's growth over the window per frame published into the channel (null: the server does not
    expose it)."""
    out: dict[str, float | None] = {}
    for name, patterns in figures.items():
        frames = _encoded(deltas, patterns)
        out[name] = round(frames / published, 3) if frames is not None and published > 0 else None
    return out


def encodes_per_frame(deltas: dict[str, float], published: float) -> dict[str, Any]:
    """Frames each encoder produced over the window per frame published into the channel, and, where the server
    counts every encode of its outputs in one metric (`swapcast_egress_frames_encoded_total`, by kind: the return,
    channels' and paths' shared encodes), their sum per published frame: the encodes a frame meets."""
    out = per_frame(deltas, published, ENCODERS)
    metric = _encoded(deltas, ("metrics.swapcast_egress_frames_encoded_total*",))
    out["total_from_metric"] = round(metric / published, 3) if metric is not None and published > 0 else None
    return out
