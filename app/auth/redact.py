"""Credentials out of log lines: a viewer token travels in the viewer page's URL (`/view/ID?token=...`), and an
access log would otherwise write it verbatim. Keys and JWTs only ever travel in headers, which no log writes."""

import logging
import re

_QUERY_SECRET = re.compile(r"([?&](?:token|access_token)=)[^&\s\"']+", re.IGNORECASE)
REDACTED = "[redacted]"
# uvicorn's own loggers: the access log (one line per request, the path with its query) and the error log.
LOGGERS = ("uvicorn.access", "uvicorn.error", "uvicorn")


def redact(text: str) -> str:
    return _QUERY_SECRET.sub(lambda m: m.group(1) + REDACTED, text)


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
