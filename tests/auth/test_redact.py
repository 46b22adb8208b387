"""Credentials out of log lines: a query is judged as the server reads it, names percent-decoded, and a value
shaped like a key or viewer token is hidden whatever its name; the rest of the line stays as it was."""

import logging

import pytest
from uvicorn.logging import AccessFormatter

from app.auth.redact import REDACTED, RedactCredentials, redact

SECRET = "vt_0123456789abcdef_" + "S" * 43


@pytest.mark.parametrize(
    ("sent", "logged"),
    [
        (f"/view/abc?token={SECRET}&audio=1", f"/view/abc?token={REDACTED}&audio=1"),
        (f"/view/abc?tok%65n={SECRET}", f"/view/abc?tok%65n={REDACTED}"),
        (f"/view/abc?%74%6F%6B%65%6E={SECRET}", f"/view/abc?%74%6F%6B%65%6E={REDACTED}"),
        (f"/view/abc?audio=1&access_%74oken={SECRET}", f"/view/abc?audio=1&access_%74oken={REDACTED}"),
        (f"/view/abc?TOKEN={SECRET}", f"/view/abc?TOKEN={REDACTED}"),
        (f"/view/abc?t={SECRET}", f"/view/abc?t={REDACTED}"),  # a token under another name
        (f"/view/abc?t=%76t_{SECRET[3:]}", f"/view/abc?t={REDACTED}"),  # and percent-encoded
        ("/x?key=sk_abcdef012345_secret", f"/x?key={REDACTED}"),
        ("/view/abc?audio=1&tokens=2", "/view/abc?audio=1&tokens=2"),  # nothing secret: kept as it was
    ],
)
def test_secrets_in_a_query_are_hidden_as_the_server_would_read_it(sent: str, logged: str) -> None:
    assert redact(f'GET {sent} HTTP/1.1" 200') == f'GET {logged} HTTP/1.1" 200'


def test_the_access_log_line_uvicorn_writes_has_no_token() -> None:
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", f"/view/channel/abc?tok%65n={SECRET}&audio=1", "1.1", 200),
        None,
    )
    assert RedactCredentials().filter(record)
    line = AccessFormatter("%(client_addr)s %(request_line)s %(status_code)s", use_colors=False).format(record)
    assert line == f"127.0.0.1:5000 GET /view/channel/abc?tok%65n={REDACTED}&audio=1 HTTP/1.1 200 OK"
    assert "S" * 43 not in line
