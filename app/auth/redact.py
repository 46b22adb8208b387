"""Credentials out of log lines: a viewer token travels in the viewer page's URL (`/view/ID?token=...`), and an
access log would otherwise write it verbatim. Keys and JWTs only ever travel in headers, which no log writes.

A query is judged as the server reads it: each parameter's name percent-decoded (`?tok%65n=` is `token`), and
a value that decodes to a key or viewer token is hidden whatever its name."""

import logging
import re
from urllib.parse import unquote_plus

_QUERY_SECRET = re.compile(r"([?&](?:token|access_token)=)[^&\s\"']+", re.IGNORECASE)
_QUERY = re.compile(r"\?([^\s\"'#]+)")  # a URL's query, as a log line holds it (still percent-encoded)
_SECRET_NAMES = frozenset({"token", "access_token"})
_SECRET_PREFIXES = ("vt_", "sk_")  # viewer tokens and API keys
REDACTED = "[redacted]"
# uvicorn's own loggers: the access log (one line per request, the path with its query) and the error log.
LOGGERS = ("uvicorn.access", "uvicorn.error", "uvicorn")


def redact(text: str) -> str:
    text = _QUERY.sub(lambda m: "?" + _redact_query(m.group(1)), text)
    return _QUERY_SECRET.sub(lambda m: m.group(1) + REDACTED, text)  # `&token=` in text that is not a URL


def _redact_query(query: str) -> str:
    """Each `name=value` with a secret's name or a secret's shape gets its value replaced; the name is kept as
    it was sent, so the line still says what was asked."""
    pairs = []
    for pair in query.split("&"):
        name, equals, value = pair.partition("=")
        decoded = unquote_plus(value).strip()
        if equals and value and (unquote_plus(name).lower() in _SECRET_NAMES or decoded.startswith(_SECRET_PREFIXES)):
            pair = f"{name}={REDACTED}"
        pairs.append(pair)
    return "&".join(pairs)


class RedactCredentials(logging.Filter):
    """Rewrites the message and its string arguments in place (uvicorn's access formatter reads the
    arguments one by one, so they keep their places)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        return True


def install_redaction() -> None:
    """On uvicorn's loggers and their handlers, and on every handler of the root logger (which sees what
    propagates to it); once each."""
    redactor = RedactCredentials()
    loggers = [logging.getLogger(name) for name in LOGGERS]
    handlers = [h for logger in [*loggers, logging.getLogger()] for h in logger.handlers]
    for target in [*loggers, *handlers]:
        if not any(isinstance(f, RedactCredentials) for f in target.filters):
            target.addFilter(redactor)
