"""Domain errors as HTTP answers, registered once: routes raise what went wrong, this module says how it reads.

Every answer keeps FastAPI's `{"detail": "..."}` body; a 503 that will pass (not ready yet, no free slot)
carries `Retry-After`.
"""

from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from app.identity.consent import ConsentInvalid
from app.identity.images import ImageRejected
from app.identity.store import IdentityNotFound, IdentityUnreadable
from app.media.webrtc import OfferError
from app.server.admission import AdmissionError
from app.server.sessions import SessionNotFound
from app.server.settings import ServerSettings
from app.server.state import NotReady
from app.server.streams import StreamNotFound, StreamsUnavailable

# Errors answered with a fixed status and the error's message as the detail.
STATUS_OF: dict[type[Exception], int] = {
    IdentityNotFound: 404,
    SessionNotFound: 404,
    StreamNotFound: 404,
    IdentityUnreadable: 409,
    ConsentInvalid: 422,
    OfferError: 400,
    StreamsUnavailable: 503,
}


def retry_after(settings: ServerSettings) -> dict[str, str]:
    """The header that tells a client when a 503 is worth retrying."""
    return {"Retry-After": str(settings.retry_after_s)}


def install_error_handlers(app: FastAPI, settings: ServerSettings) -> None:
    def answer(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse({"detail": detail}, status_code=status, headers=headers)

    def fixed(status: int) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
        async def handle(_request: Request, exc: Exception) -> JSONResponse:
            return answer(status, str(exc))

        return handle

    async def image_rejected(_request: Request, exc: Exception) -> JSONResponse:
        status = exc.status if isinstance(exc, ImageRejected) else 422
        return answer(status, str(exc))

    async def not_ready(_request: Request, exc: Exception) -> JSONResponse:
        return answer(503, f"not ready: {exc}", retry_after(settings))

    async def no_room(_request: Request, exc: Exception) -> JSONResponse:
        return answer(503, str(exc), retry_after(settings))

    for error, status in STATUS_OF.items():
        app.add_exception_handler(error, fixed(status))
    app.add_exception_handler(ImageRejected, image_rejected)
    app.add_exception_handler(NotReady, not_ready)
    app.add_exception_handler(AdmissionError, no_room)
