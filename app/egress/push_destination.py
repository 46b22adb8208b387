"""Where a push goes: a platform's RTMP(S) ingest, an SRT listener or caller, or a WHIP endpoint, and the secrets
that come with it (a stream key, a Bearer token, an SRT passphrase), which are never shown or logged.

`Destination.parse` checks what a user typed and keeps the secrets apart from the address: an RTMP URL's stream
key (everything after the application, `rtmp://HOST/APP/KEY`) may come in the URL or as `key`; an SRT URL's
`passphrase` and `streamid` in its query or as fields; a WHIP endpoint's Bearer token as `key`, and whatever
its URL may carry one in (platforms put the key in the path, `/<key>/webRTC/publish`, or in the query under
names of their own): every query value and every path segment but plain words. `shown` is the URL with each
secret replaced by `***`, and `redact` does the same to any text (an FFmpeg or GStreamer error that quotes the
URL), a whole component at a time: a short secret `d` leaves "refused" alone.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

Kind = Literal["rtmp", "srt", "whip"]
SrtMode = Literal["caller", "listener"]
HIDDEN = "***"
KINDS: dict[str, Kind] = {"rtmp": "rtmp", "rtmps": "rtmp", "srt": "srt", "http": "whip", "https": "whip"}
SRT_LATENCY_MS = 120  # libsrt's default receive latency
SRT_PASSPHRASE = (10, 79)  # libsrt's bounds on a passphrase's length
URL_MAX = 2048
# A WHIP path segment shown as it is: a plain word such as `whip`, `webRTC` or `publish`; any other (digits,
# long, mixed) may be a key.
PLAIN_SEGMENT = re.compile(r"[A-Za-z][A-Za-z_-]{0,23}")
# Characters that continue a URL component: a secret is replaced only where none of them touch it.
_COMPONENT_CHARS = r"A-Za-z0-9._~%+\-"


class DestinationInvalid(ValueError):
    """What the user gave is not a destination a push can use; the message says why (no secret in it)."""


@dataclass(frozen=True)
class Destination:
    kind: Kind
    url: str  # without the secrets (the RTMP key, the SRT passphrase and stream id are apart)
    key: str | None = None  # RTMP stream key / WHIP Bearer token
    passphrase: str | None = None  # SRT
    streamid: str | None = None  # SRT
    mode: SrtMode = "caller"  # SRT
    latency_ms: int = SRT_LATENCY_MS  # SRT
    secrets: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def parse(
        cls,
        url: str,
        *,
        key: str | None = None,
        passphrase: str | None = None,
        streamid: str | None = None,
        mode: str | None = None,
        latency_ms: int | None = None,
    ) -> Destination:
        if len(url) > URL_MAX or any(ord(c) < 33 for c in url):
            raise DestinationInvalid(f"the URL must be at most {URL_MAX} printable characters without spaces")
        parts = urllib.parse.urlsplit(url)
        kind = KINDS.get(parts.scheme.lower())
        if kind is None:
            raise DestinationInvalid("the URL must start with rtmp://, rtmps://, srt://, http:// or https:// (WHIP)")
        if not parts.hostname and not (kind == "srt" and (mode == "listener" or "mode=listener" in parts.query)):
            raise DestinationInvalid("the URL names no host")
        try:
            parts.port  # noqa: B018 - raises on a port that is not a number
        except ValueError:
            raise DestinationInvalid("the URL's port is not a number from 0 to 65535") from None
        if parts.username or parts.password:
            raise DestinationInvalid("put credentials in `key` (or the SRT `passphrase`), not in the URL")
        if kind == "srt":
            return _srt(parts, passphrase, streamid, mode, latency_ms)
        if mode is not None or latency_ms is not None or passphrase is not None or streamid is not None:
            raise DestinationInvalid("`mode`, `latency_ms`, `passphrase` and `streamid` are for srt:// URLs")
        if kind == "rtmp":
            return _rtmp(parts, key)
        return _whip(parts, key)

    def address(self, hide: bool) -> str:
        """The full address the muxer or element opens (`hide`: every secret as `***`, as the API shows it)."""
        if self.kind == "rtmp":
            return f"{self.url.rstrip('/')}/{HIDDEN if hide else self.key}" if self.key else self.url
        if self.kind == "srt":
            return _with_query(self.url, self.public_query(hide))
        return _whip_shown(self.url) if hide else self.url

    @property
    def shown(self) -> str:
        """The URL as the API shows it: every secret replaced by `***`."""
        return self.address(hide=True)

    def redact_values(self, text: str) -> str:
        """`text` with every secret replaced by `***` where it stands as a whole component (between `/`, `=`,
        `&`, spaces, quotes...), never inside a longer word."""
        for secret in sorted(set(self.secrets), key=len, reverse=True):
            if secret:
                for form in dict.fromkeys((secret, urllib.parse.quote(secret, safe=""))):
                    text = _whole(form).sub(HIDDEN, text)
        return text

    def public_query(self, hide: bool) -> dict[str, str]:
        """The SRT options as URL query parameters (`hide`: secrets as `***`)."""
        query = {"mode": self.mode, "latency": str(self.latency_ms)}
        if self.passphrase:
            query["passphrase"] = HIDDEN if hide else self.passphrase
        if self.streamid:
            query["streamid"] = HIDDEN if hide else self.streamid
        return query

    @property
    def target(self) -> str:
        """The full address, secrets included (never shown or logged)."""
        return self.address(hide=False)

    def redact(self, text: str) -> str:
        """`text` with every secret of this destination (and the full address) replaced."""
        return self.redact_values(text.replace(self.target, self.shown))

    def describe(self) -> dict[str, Any]:
        """What the API shows of it."""
        shown: dict[str, Any] = {"kind": self.kind, "url": self.shown, "has_key": bool(self.key)}
        if self.kind == "srt":
            shown |= {"mode": self.mode, "latency_ms": self.latency_ms, "has_passphrase": bool(self.passphrase)}
        return shown

    def to_json(self) -> dict[str, Any]:
        """The stored form, secrets included (the store keeps it in a private file); `secrets` is derived from the
        rest, so not stored."""
        return {name: value for name, value in asdict(self).items() if name != "secrets"}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Destination:
        kind = raw["kind"]
        if kind == "srt":
            return cls.parse(
                raw["url"],
                passphrase=raw.get("passphrase"),
                streamid=raw.get("streamid"),
                mode=raw.get("mode"),
                latency_ms=raw.get("latency_ms"),
            )
        return cls.parse(raw["url"], key=raw.get("key"))


def _whole(secret: str) -> re.Pattern[str]:
    """`secret` between component boundaries (an escape such as `%2F` is one too)."""
    before = f"(?:(?<=%[0-9A-Fa-f]{{2}})|(?<![{_COMPONENT_CHARS}]))"
    after = f"(?=%[0-9A-Fa-f]{{2}}|[^{_COMPONENT_CHARS}]|$)"
    return re.compile(before + re.escape(secret) + after)


def _secret_segments(path: str) -> list[str]:
    return [segment for segment in path.split("/") if segment and not PLAIN_SEGMENT.fullmatch(segment)]


def _whip_shown(url: str) -> str:
    """A WHIP URL with every path segment but plain words, and every query value, as `***`."""
    parts = urllib.parse.urlsplit(url)
    path = "/".join(s if not s or PLAIN_SEGMENT.fullmatch(s) else HIDDEN for s in parts.path.split("/"))
    query = [(name, HIDDEN if value else "") for name, value in urllib.parse.parse_qsl(parts.query, True)]
    return urllib.parse.urlunsplit(parts._replace(path=path, query=urllib.parse.urlencode(query, safe="*")))


def _with_query(url: str, query: dict[str, str]) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query, safe="*")))


def _check_secret(name: str, value: str | None) -> str | None:
    if value is None or value == "":
        return None
    if len(value) > 512 or any(ord(c) < 32 or c == "\x7f" for c in value):
        raise DestinationInvalid(f"`{name}` must be at most 512 printable characters")
    return value


def _rtmp(parts: urllib.parse.SplitResult, key: str | None) -> Destination:
    if parts.query or parts.fragment:
        raise DestinationInvalid("an RTMP URL has no query or fragment: rtmp://HOST/APP/STREAM_KEY")
    segments = [s for s in parts.path.split("/") if s]
    if not segments:
        raise DestinationInvalid("an RTMP URL names the application: rtmp://HOST/APP/STREAM_KEY")
    key = _check_secret("key", key)
    if len(segments) > 1:
        if key is not None:
            raise DestinationInvalid("the stream key is in the URL and in `key`: give it once")
        key = "/".join(segments[1:])
    base = urllib.parse.urlunsplit((parts.scheme.lower(), parts.netloc, f"/{segments[0]}", "", ""))
    return Destination("rtmp", base, key=key, secrets=(key,) if key else ())


def _whip(parts: urllib.parse.SplitResult, key: str | None) -> Destination:
    if parts.fragment:
        raise DestinationInvalid("a WHIP endpoint's URL has no fragment")
    key = _check_secret("key", key)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    # Whatever may carry a token is hidden: every query value, whatever its name, and the path's non-words.
    segments = _secret_segments(parts.path)
    secrets = (*(v for _, v in query if v), *segments, *(urllib.parse.unquote(s) for s in segments))
    url = urllib.parse.urlunsplit(parts._replace(scheme=parts.scheme.lower()))
    return Destination("whip", url, key=key, secrets=(*secrets, *((key,) if key else ())))


def _srt(
    parts: urllib.parse.SplitResult,
    passphrase: str | None,
    streamid: str | None,
    mode: str | None,
    latency_ms: int | None,
) -> Destination:
    if parts.path not in ("", "/") or parts.fragment:
        raise DestinationInvalid("an SRT URL is srt://HOST:PORT with options in the query")
    if parts.port is None:
        raise DestinationInvalid("an SRT URL names its port: srt://HOST:PORT")
    query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    unknown = set(query) - {"mode", "latency", "passphrase", "streamid"}
    if unknown:
        raise DestinationInvalid(f"unsupported SRT options: {', '.join(sorted(unknown))}")
    chosen: dict[str, Any] = {"passphrase": passphrase, "streamid": streamid, "mode": mode, "latency": latency_ms}
    for name, value in query.items():
        if chosen[name] is not None:
            raise DestinationInvalid(f"`{name}` is in the URL and in the request: give it once")
        chosen[name] = value
    if chosen["mode"] not in (None, "caller", "listener"):
        raise DestinationInvalid("the SRT mode is caller or listener")
    try:
        latency = int(chosen["latency"]) if chosen["latency"] is not None else SRT_LATENCY_MS
    except ValueError:
        raise DestinationInvalid("the SRT latency is a whole number of milliseconds") from None
    if not 20 <= latency <= 10000:
        raise DestinationInvalid("the SRT latency is 20-10000 ms")
    secret = _check_secret("passphrase", chosen["passphrase"])
    if secret is not None and not SRT_PASSPHRASE[0] <= len(secret) <= SRT_PASSPHRASE[1]:
        raise DestinationInvalid(f"an SRT passphrase has {SRT_PASSPHRASE[0]}-{SRT_PASSPHRASE[1]} characters")
    stream = _check_secret("streamid", chosen["streamid"])
    url = urllib.parse.urlunsplit(("srt", parts.netloc, "", "", ""))
    hidden = tuple(s for s in (secret, stream) if s)
    found = Destination("srt", url, passphrase=secret, streamid=stream, latency_ms=latency, secrets=hidden)
    return replace(found, mode=chosen["mode"] or "caller")
