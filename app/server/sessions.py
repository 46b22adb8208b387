"""The server's WebRTC sessions: admitted against the limit, negotiated, found by id, all closed at shutdown.

What a session does with its media lives in `app.media.webrtc.Session`."""

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import Executor

from app.live.adapter import LiveRequest
from app.media.peer import OfferError
from app.media.webrtc import KIND, PublisherFactory, Session, SessionConfig
from app.observability import Metrics
from app.pipeline.pipeline import FramePipeline
from app.server.admission import Admission
from app.server.output_guards import OutputGuards
from app.server.resource_errors import NotFound

NEGOTIATION_TIMEOUT_S = 10.0


class SessionNotFound(NotFound):
    what = "session"


class SessionManager:
    """Open sessions, admission against the limit, and closing them all at shutdown."""

    def __init__(
        self,
        *,
        pipeline: FramePipeline,
        executor: Executor,
        metrics: Metrics,
        config: SessionConfig,
        publisher_factory: PublisherFactory | None = None,
        rtsp_url: Callable[[str], str] | None = None,
        max_per_owner: int | None = None,
        guards: OutputGuards | None = None,
    ) -> None:
        self.pipeline = pipeline
        self._guards = guards or OutputGuards()
        self.config = config
        self._metrics = metrics
        # What every session of this server is made with; `open` adds its identity and source.
        self._new_session = functools.partial(
            Session,
            pipeline=pipeline,
            executor=executor,
            metrics=metrics,
            config=config,
            on_closed=self._closed,
            publisher_factory=publisher_factory,
            rtsp_url=rtsp_url,
        )
        self._admission: Admission[Session] = Admission(
            kind=KIND,
            capacity=config.max_sessions,
            metrics=metrics,
            active=metrics.sessions_active,
            per_owner=max_per_owner,
            frees_in=Session.frees_in,
        )

    def __len__(self) -> int:
        return len(self._admission)

    def sessions(self) -> list[Session]:
        return self._admission.items()

    def outputs(self) -> list[Session]:  # the name every kind of live output answers to
        return self.sessions()

    def rtsp_paths(self) -> list[str]:
        return [s.rtsp_path for s in self._admission.items() if s.rtsp_url]

    def get(self, session_id: str) -> Session:
        session = self._admission.get(session_id)
        if session is None:
            raise SessionNotFound(session_id)
        return session

    async def open(self, offer: str, request: LiveRequest) -> tuple[Session, str]:
        """Admit (against the global and the owner's capacity), negotiate and register a session; returns it with
        the SDP answer. Its frames carry a mark issued to it and `owner` (and the visible label if `label`, or by
        default when the settings say so). Without `own_rtsp` it gets no RTSP path of its own (it publishes into
        a channel, which has one)."""
        owner = request.owner
        with self._admission.reserve(owner):
            if request.own_rtsp:
                session = self._new_session(identity_id=request.identity_id, source=request.source)
            else:
                session = self._new_session(
                    identity_id=request.identity_id, source=request.source, publisher_factory=None, rtsp_url=None
                )
            try:
                await self._guards.equip(KIND, session, request, _closer(session))
                answer = await asyncio.wait_for(session.negotiate(offer), NEGOTIATION_TIMEOUT_S)
            except TimeoutError:
                await session.close("negotiation failed")
                raise OfferError("negotiation timed out") from None
            except BaseException:
                await session.close("negotiation failed")
                raise
            self._admission.admit(session.id, session, owner)
            return session, answer

    def _closed(self, session: Session) -> None:
        if self._admission.release(session.id) is not None:
            self._metrics.sessions_closed.labels(session.close_reason or "unknown").inc()

    async def close(self, session_id: str, reason: str) -> None:
        await self.get(session_id).close(reason)

    async def close_all(self, reason: str, grace_s: float) -> bool:
        """Refuse new sessions and close all open ones; False if some did not finish within `grace_s`."""
        return await self._admission.close_all(lambda s: s.request_close(reason), grace_s)


def _closer(session: Session) -> Callable[[str], None]:
    """What the content gate calls (from its own thread) to end `session` with a reason: closed on the event loop."""
    loop = asyncio.get_running_loop()

    def close(reason: str) -> None:
        loop.call_soon_threadsafe(session.request_close, reason)

    return close
