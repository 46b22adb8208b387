"""The FastAPI application: `create_app()` wires settings, state, routes and the web page."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from app.auth.access import Access
from app.auth.browser import BrowserGuard
from app.auth.guard import PUBLIC
from app.channels.pushes import PushStore
from app.channels.store import ChannelStore
from app.content.settings import resolve_policy
from app.server.address_limit import AddressLimiter, AddressLimitMiddleware, AddressLimits
from app.server.channels import ChannelManager, ChannelOptions
from app.server.drain import Drain, DrainGate
from app.server.errors import install_error_handlers
from app.server.limits import BodyLimitMiddleware
from app.server.openapi import SWAGGER_UI_FILES, describe_real_bodies, serve_docs
from app.server.public_url import AbsoluteLocation
from app.server.pushes import PushManager, PushOptions
from app.server.revocation import RevocationWatcher, StoredCredentials
from app.server.routes import (
    audio,
    channels,
    health,
    identities,
    operations,
    outputs,
    pushes,
    sessions,
    streams,
    viewer_tokens,
    whep,
)
from app.server.routes.identities import upload_limit
from app.server.settings import ServerSettings
from app.server.state import PipelineFactory, ServerState, StateListener

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"


def create_app(
    settings: ServerSettings | None = None,
    pipeline_factory: PipelineFactory | None = None,
    *,
    on_change: StateListener | None = None,
) -> FastAPI:
    """A server instance. The pipeline loads and warms in the background after start-up: `/healthz` answers
    at once, `/readyz` only once the models are ready. `on_change` hears when the server has started and when
    it became ready (or failed to)."""
    settings = settings or ServerSettings()
    state = ServerState(settings, pipeline_factory, on_change)
    access = Access(settings.access, bind_host=settings.host, public_host=settings.public_host)
    # The content gate: stop by default where others reach the server (off loopback, with credentials).
    state.content_policy = resolve_policy(settings.content, served_to_others=access.configured and not access.loopback)
    state.audit = access.audit.event
    watcher = RevocationWatcher(state, access)
    state.channels = ChannelManager(
        ChannelStore(settings.channel_store_dir()),
        state.rtsp,
        access,
        state.metrics,
        ChannelOptions(
            settings.channel_hold_s,
            settings.channel_slate,
            settings.max_channels_per_principal,
            settings.max_channels,
        ),
        encoder=state.encoder,
        whep_viewers=state.viewers.count,
        pushes=PushManager(
            PushStore(settings.channel_store_dir()),
            state.encoder,
            PushOptions(
                settings.pushes_enabled,
                settings.max_pushes_per_channel,
                settings.push_retry_s,
                settings.push_retry_max_s,
                settings.max_push_workers,
                state.push_policy,
            ),
            credentials=StoredCredentials(access.keys),
            audit=access.audit.event,
        ),
        srt=state.srt,
    )
    state.metrics.channels.figures = lambda: state.channels.figures() if state.channels is not None else []
    drain = Drain(settings.drain_timeout_s, lambda: len(state.sessions or ()) + len(state.streams or ()))
    state.metrics.session_capacity.set_function(
        lambda: float(settings.max_sessions) if state.ready and not drain.draining else 0.0
    )
    state.metrics.draining.set_function(lambda: float(drain.draining))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        drain.bind(asyncio.get_running_loop())
        await state.start()
        watcher.start()
        try:
            yield
        finally:
            await watcher.stop()
            await state.stop()
            access.close()

    # FastAPI's own /docs and /redoc load their scripts from a CDN: `serve_docs` serves /docs from this server.
    app = FastAPI(title="swapcast", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.swapcast = state
    app.state.access = access
    app.state.revocation = watcher
    app.state.drain = drain

    def limit_for(path: str) -> int:
        if path.startswith("/v1/identities"):
            return upload_limit(settings.max_upload_bytes)
        if (path.startswith("/v1/sessions") and path.rstrip("/") == "/v1/sessions") or path.endswith("/whep"):
            return settings.sdp_max_bytes
        return settings.max_json_bytes

    app.add_middleware(BodyLimitMiddleware, limit_for=limit_for)
    app.add_middleware(
        DrainGate,
        drain=drain,
        retry_after_s=settings.retry_after_s,
        on_refused=lambda resource: state.metrics.admission_rejections.labels(resource, "draining").inc(),
    )
    if settings.public_base_url is not None:
        app.add_middleware(AbsoluteLocation, base_url=str(settings.public_base_url))
    install_error_handlers(app, settings)
    describe_real_bodies(app)
    if settings.access.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.access.cors_origins,
            allow_methods=["GET", "POST", "PATCH", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "X-Swapcast"],
            expose_headers=["Location", "X-RTSP-URL", "X-Channel"],
        )
    # Before authentication and before any body is read: per client address (app/server/address_limit.py).
    address_limits = AddressLimits(posts=settings.rate_per_address, auth_failures=settings.rate_auth_failures)
    app.add_middleware(AddressLimitMiddleware, limiter=AddressLimiter(address_limits))
    # Outermost: a request with a foreign Host or from a foreign page goes no further.
    app.add_middleware(BrowserGuard, allowed_hosts=access.hosts, allowed_origins=settings.access.cors_origins)
    app.include_router(health.router)
    app.include_router(identities.router)
    app.include_router(sessions.router)
    app.include_router(streams.router)
    app.include_router(outputs.router)
    app.include_router(operations.router)
    app.include_router(whep.router)
    app.include_router(viewer_tokens.router)
    app.include_router(audio.router)
    app.include_router(channels.router)
    app.include_router(pushes.router)

    @app.get("/", include_in_schema=False, dependencies=PUBLIC)
    async def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/view/{session_id}", include_in_schema=False, dependencies=PUBLIC)
    async def viewer_page(session_id: str) -> FileResponse:
        """The page OBS's Browser Source shows: the session's swapped video over WHEP (`app/static/view.js`),
        with a viewer token in `?token=`."""
        return FileResponse(STATIC_DIR / "view.html", headers={"Cache-Control": "no-cache"})

    @app.get("/view/stream/{stream_id}", include_in_schema=False, dependencies=PUBLIC)
    async def stream_viewer_page(stream_id: str) -> FileResponse:
        """The same page for an ingest stream's output."""
        return FileResponse(STATIC_DIR / "view.html", headers={"Cache-Control": "no-cache"})

    @app.get("/view/channel/{name}", include_in_schema=False, dependencies=PUBLIC)
    async def channel_viewer_page(name: str) -> FileResponse:
        """The same page for a channel: its address never changes, whoever publishes into it."""
        return FileResponse(STATIC_DIR / "view.html", headers={"Cache-Control": "no-cache"})

    serve_docs(app, STATIC_DIR / "docs.html")
    app.mount("/static", StaticFiles(directory=STATIC_DIR, packages=[SWAGGER_UI_FILES]), name="static")
    return app
