"""Domain errors as HTTP answers, registered once: routes raise what went wrong, this module says how it reads.

Every answer keeps FastAPI's `{"detail": "..."}` body; a 503 that will pass (not ready yet, no free slot)
carries `Retry-After`.
"""

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from app.auth.viewer_tokens import TooManyViewerTokens
from app.channels.store import ChannelExists, ChannelNameInvalid, ChannelStoreError
from app.egress.push_destination import DestinationInvalid
from app.errors import StatusError
from app.identity.consent import ConsentInvalid
from app.identity.store import IdentityNotFound, IdentityUnreadable, StoreFull
from app.media.peer import MediaUnavailable, OfferError
from app.server.admission import AdmissionError
from app.server.ingest_policy import SourceRefused
from app.server.ratelimit import RateLimited
from app.server.resource_errors import Conflict, NotFound, Unavailable
from app.server.settings import ServerSettings
from app.server.state import NotReady

log = logging.getLogger(__name__)
# Like the keys file's: the client hears what is wrong, the operator's log has the file and how to fix it.
CHANNEL_STORE_UNUSABLE = (
    "channels cannot be used now: the server's channel or push store is unsafe or damaged (its log says why)"
)
# Errors answered with a fixed status and the error's message as the detail; a subclass of a kind in
# `app.server.resource_errors` is answered as its kind.
STATUS_OF: dict[type[Exception], int] = {
    NotFound: 404,
    Conflict: 409,
    Unavailable: 503,
    IdentityNotFound: 404,
    IdentityUnreadable: 409,
    StoreFull: 507,
    TooManyViewerTokens: 409,
    ConsentInvalid: 422,
    OfferError: 400,
    MediaUnavailable: 503,
    SourceRefused: 422,
    ChannelExists: 409,
    ChannelNameInvalid: 422,
    DestinationInvalid: 422,
}


def retry_after(settings: ServerSettings) -> dict[str, str]:
    """The header that tells a client when a 503 is worth retrying."""
    return {"Retry-After": str(settings.retry_after_s)}


def validation_detail(errors: Sequence[Any]) -> str:
    """FastAPI's validation errors as one line: where and what, never the input itself, cut to 300 characters."""
    parts = []
    for error in errors:
        where = ".".join(str(part) for part in error.get("loc", ()) if part != "body") or "body"
        parts.append(f"{where[:60]}: {str(error.get('msg', 'invalid'))[:120]}")
    text = "; ".join(parts) or "invalid request"
    return text if len(text) <= 300 else text[:297] + "..."


def install_error_handlers(app: FastAPI, settings: ServerSettings) -> None:
    def answer(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse({"detail": detail}, status_code=status, headers=headers)

    def fixed(status: int) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
        async def handle(_request: Request, exc: Exception) -> JSONResponse:
            return answer(status, str(exc))

        return handle

    async def chosen_status(_request: Request, exc: Exception) -> JSONResponse:
        return answer(exc.status if isinstance(exc, StatusError) else 500, str(exc))

    async def not_ready(_request: Request, exc: Exception) -> JSONResponse:
        return answer(503, f"not ready: {exc}", retry_after(settings))

    async def no_room(_request: Request, exc: Exception) -> JSONResponse:
        known = exc.retry_after_s if isinstance(exc, AdmissionError) else None
        if known is None:
            return answer(503, str(exc), retry_after(settings))
        return answer(503, str(exc), {"Retry-After": str(max(1, math.ceil(known)))})

    async def rate_limited(_request: Request, exc: Exception) -> JSONResponse:
        wait = exc.retry_after_s if isinstance(exc, RateLimited) else settings.retry_after_s
        return answer(429, str(exc), {"Retry-After": str(wait)})

    logged: list[str] = []  # the store problem last logged: once per change, not once per request

    async def store_unusable(_request: Request, exc: Exception) -> JSONResponse:
        if logged[-1:] != [str(exc)]:
            logged[:] = [str(exc)]
            log.error("%s; channel and push requests get 503 until it is fixed", exc)
        return answer(503, CHANNEL_STORE_UNUSABLE)

    async def invalid_request(_request: Request, exc: Exception) -> JSONResponse:
        errors = exc.errors() if isinstance(exc, RequestValidationError) else []
        return answer(422, validation_detail(errors))

    app.add_exception_handler(RequestValidationError, invalid_request)
    for error, status in STATUS_OF.items():
        app.add_exception_handler(error, fixed(status))
    app.add_exception_handler(StatusError, chosen_status)  # ImageRejected, QuotaExceeded
    app.add_exception_handler(NotReady, not_ready)
    app.add_exception_handler(AdmissionError, no_room)
    app.add_exception_handler(RateLimited, rate_limited)
    app.add_exception_handler(ChannelStoreError, store_unusable)
