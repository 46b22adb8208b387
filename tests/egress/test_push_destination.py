"""Destinations as users type them: each kind parsed, its secrets kept apart from the address, and every text
the API or the logs show (the URL, an FFmpeg or GStreamer error quoting it) with the secrets hidden."""

import pytest

from app.egress.push_destination import Destination, DestinationInvalid

KEY = "live_123_SeCrEtKey/with+chars"


def test_an_rtmp_key_in_the_url_or_apart_is_the_same_destination_and_never_shown() -> None:
    inline = Destination.parse(f"rtmp://ingest.example.com/app/{KEY}")
    apart = Destination.parse("rtmp://ingest.example.com/app", key=KEY)
    assert inline == apart and inline.key == KEY
    assert inline.target == f"rtmp://ingest.example.com/app/{KEY}"
    assert inline.shown == "rtmp://ingest.example.com/app/***"
    error = f"Cannot open '{inline.target}': refused (key {KEY}, quoted live_123_SeCrEtKey%2Fwith%2Bchars)"
    redacted = inline.redact(error)
    assert "SeCrEt" not in redacted and "rtmp://ingest.example.com/app/***" in redacted


def test_srt_options_come_from_the_query_or_the_fields_and_the_passphrase_is_hidden() -> None:
    found = Destination.parse("srt://relay.example.net:9000?latency=300&passphrase=SeCrEt-phrase&streamid=SeCrEtId")
    assert (found.mode, found.latency_ms, found.passphrase, found.streamid) == (
        "caller",
        300,
        "SeCrEt-phrase",
        "SeCrEtId",
    )
    assert "SeCrEt" not in found.shown and "SeCrEt" not in str(found.describe())
    assert "passphrase=SeCrEt-phrase" in found.target
    listener = Destination.parse("srt://:9001", mode="listener", passphrase="SeCrEt-phrase")
    assert listener.mode == "listener" and listener.target.startswith("srt://:9001?mode=listener")
    assert Destination.from_json(found.to_json()) == found


def test_a_whip_token_in_the_query_is_hidden_like_the_bearer_token() -> None:
    found = Destination.parse("https://whip.example.com/ingest?room=42&token=SeCrEt", key="SeCrEt-bearer")
    assert found.shown == "https://whip.example.com/ingest?room=***&token=***"
    assert "SeCrEt" not in found.redact(f"401 from {found.target} with Bearer SeCrEt-bearer")


def test_a_whip_key_in_the_path_or_under_any_query_name_is_never_shown_or_logged() -> None:
    url = "https://customer-7f3a.cloudflarestream.com/c0ffee12deadbeef/webRTC/publish?x-stream=QwErTy&s=9z"
    found = Destination.parse(url)
    assert found.shown == "https://customer-7f3a.cloudflarestream.com/***/webRTC/publish?x-stream=***&s=***"
    assert found.describe()["url"] == found.shown
    error = f"Server returned 403 for {found.target}: c0ffee12deadbeef QwErTy (quoted c0ffee12deadbeef%2F)"
    redacted = found.redact(error)
    assert not any(secret in redacted for secret in ("c0ffee12deadbeef", "QwErTy", "9z")), redacted


@pytest.mark.parametrize("kind", ["rtmp", "whip"])
def test_a_short_secret_is_hidden_as_a_whole_component_never_inside_words(kind: str) -> None:
    """A one-letter key `d` hides `d` where it stands alone, and leaves "refused" and "denied" as they are."""
    url = "rtmp://h.example.com/live/d" if kind == "rtmp" else "https://h.example.com/whip?t=d"
    found = Destination.parse(url, key=None if kind == "rtmp" else "d")
    text = f"the destination refused {found.target} and denied the key d: 'd'"
    redacted = found.redact(text)
    assert redacted.startswith("the destination refused ") and "denied the key ***: '***'" in redacted, redacted
    assert "/d" not in redacted and "=d" not in redacted


@pytest.mark.parametrize(
    "url",
    [
        "rtmp://h",
        "srt://h",
        "srt://h:1/path",
        "rtmps://u:p@h/app",
        "gopher://h/x",
        "rtmp://h:99999/app",
        "https://h/#x",
    ],
)
def test_unusable_urls_are_refused(url: str) -> None:
    with pytest.raises(DestinationInvalid):
        Destination.parse(url)
