"""Everything one server instance holds: settings, metrics, the pipeline once loaded, identities, sessions,
streams and the RTSP output; started and stopped by the app's lifespan."""

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

import numpy as np
from prometheus_client import CollectorRegistry

from app.auth.audit import Audit, no_audit
from app.auth.failures import FailureDelay
from app.channels.store import ChannelStoreError
from app.content.check import load_content_check
from app.content.live import ContentService
from app.content.settings import Policy
from app.errors import ModelError
from app.identity.cache import IdentityCache
from app.identity.embedder import REFERENCE, build_embedder, reference_preparer
from app.identity.enrol import re_preparer
from app.identity.eye_state import EyeOpenness, load_eye_openness
from app.identity.images import decode_slots
from app.identity.quota import IdentityQuota
from app.identity.store import IdentityNotFound, IdentityStore, IdentityUnreadable, is_identity_id
from app.identity.upload import IdentityUploads
from app.identity.validate import PreparedSpec
from app.media.encoder import EncoderPolicy
from app.media.ice_bounds import IceBounds
from app.media.peer import PeerConfig, use_host_addresses
from app.media.webrtc import SessionConfig
from app.model_store import open_model_store
from app.observability import Metrics
from app.pipeline.identity_map import FaceEmbedder
from app.pipeline.pipeline import FramePipeline
from app.pipeline.swap import PreparedSource
from app.provenance.service import Provenance
from app.runtime.heap import HeapTrimmer
from app.server.channels import ChannelManager
from app.server.destinations import push_policy
from app.server.ingest_policy import IngestPolicy
from app.server.media_addresses import media_host_addresses
from app.server.output_guards import OutputGuards
from app.server.ratelimit import RATE_ACTIONS, RateLimiter
from app.server.resource_errors import Unavailable
from app.server.rtsp import RtspOutput
from app.server.sessions import SessionManager
from app.server.settings import ServerSettings
from app.server.srt import SrtOutput
from app.server.streams import GiveUp, StreamManager
from app.server.viewers import Viewers
from app.settings import BatchingSettings, PipelineSettings
from engines.store import ModelStore

log = logging.getLogger(__name__)

T = TypeVar("T")
PipelineFactory = Callable[[PipelineSettings], FramePipeline]
StateListener = Callable[["ServerState"], None]
# Background embedding threads for identity maps (dlib runs one face batch at a time anyway).
EMBED_WORKERS = 2
WARMUP_SIZES = ((640, 480), (1280, 720))
# Readiness asks the model tier's server at most this often (a probe costs a gRPC round trip, up to 1 s).
MODEL_TIER_RECHECK_S = 1.0


def shared_pipeline_factory(
    store: ModelStore, batching: BatchingSettings | None, registry: CollectorRegistry
) -> PipelineFactory:
    """The server's own pipeline: every session's model calls go through one dynamic batcher per model
    (unless batching is off), and the batchers report into the server's metrics registry."""

    def build(settings: PipelineSettings) -> FramePipeline:
        from app.pipeline.factory import build_pipeline

        return build_pipeline(settings, store, batching=batching, registry=registry, live=True)

    return build


def warm_up(pipeline: FramePipeline) -> None:
    """Run the detectors (photos', and live frames' at their own size) once per common frame size so the
    first session does not pay for it."""
    tracker = pipeline.new_stream()
    for width, height in WARMUP_SIZES:
        frame = np.full((height, width, 3), 127, np.uint8)
        pipeline.detector.process([frame])
        pipeline.stages.detect.process([frame])
        tracker.reset()


def advertised(settings: ServerSettings) -> str | None:
    return str(settings.advertised_address) if settings.advertised_address is not None else None


def peer_config(settings: ServerSettings) -> PeerConfig:
    """Every peer's ICE servers, candidate cap, ICE bounds and deadline, and advertised address: sessions' and
    WHEP viewers' alike."""
    return PeerConfig(
        ice_servers=tuple(settings.ice_servers),
        max_remote_candidates=settings.max_remote_candidates,
        ice_bounds=IceBounds(
            checks_per_s=settings.ice_checks_per_s, max_peer_reflexive=settings.max_peer_reflexive_candidates
        ),
        ice_timeout_s=settings.ice_timeout_s,
        advertised_address=advertised(settings),
    )


class NotReady(Exception):
    pass


class ServerState:
    def __init__(
        self,
        settings: ServerSettings,
        pipeline_factory: PipelineFactory | None = None,
        on_change: StateListener | None = None,
    ) -> None:
        self.settings = settings
        self._on_change = on_change
        self.metrics = Metrics()
        # The store the models were loaded from, watched for files changed under the loaded copies (not known
        # when the caller builds the pipeline itself).
        self.model_store: ModelStore | None = None
        self._changed_models_logged: set[str] = set()
        # The Triton backend's server, asked at most once a second by readiness: (asked at, problem or None).
        self._model_tier: tuple[float, str | None] = (-1e9, None)
        if pipeline_factory is None:
            from app.runtime.gpu import batching_on

            batching = settings.batching if batching_on(settings.batching_enabled) else None
            self.model_store = open_model_store(settings.models)
            pipeline_factory = shared_pipeline_factory(self.model_store, batching, self.metrics.registry)
        self.metrics.count_changed_models_with(lambda: len(self.models_changed_on_disk()))
        self._pipeline_factory = pipeline_factory
        # Video frames run on `executor`; identity work (decode, detect, prepare) on `control_executor`, so an
        # upload or an identity switch never waits behind video.
        self.executor = ThreadPoolExecutor(settings.pipeline_workers, thread_name_prefix="swapcast-pipeline")
        self.control_executor = ThreadPoolExecutor(2, thread_name_prefix="swapcast-control")
        # Identity maps embed new faces here, off the frame's path (one job at a time per session or stream).
        self.embed_executor = ThreadPoolExecutor(EMBED_WORKERS, thread_name_prefix="swapcast-embed")
        decode_slots.resize(settings.max_concurrent_decodes)
        self.store = IdentityStore(settings.identity_dir)
        # Uploads within each principal's quota (in local mode, the local principal's).
        self.uploads = IdentityUploads(
            self.store, IdentityQuota(settings.max_identities, settings.max_identity_bytes), settings.max_image_pixels
        )
        own_ports = (settings.port, settings.rtsp_port, settings.access.metrics_port or 0, settings.srt_port or 0)
        self.ingest_policy = IngestPolicy.from_settings(
            settings.ingest_allowed_networks,
            settings.ingest_allow_private,
            own_ports,
            extra_networks=settings.destination_allowed_networks,
        )
        # Pushes: the same policy without private ranges (a platform's ingest is public; a LAN relay is named).
        self.push_policy = push_policy(settings, own_ports)
        # Each action's limit is its SWAPCAST_RATE_<ACTION> setting.
        self.rate_limiter = RateLimiter({action: getattr(settings, f"rate_{action}") for action in RATE_ACTIONS})
        self.provenance = Provenance(settings.provenance)
        # Every H.264 encode: sessions' (through aiortc), WHEP viewers' and the RTSP output's.
        self.encoder = EncoderPolicy(settings.encoder)
        self.rtsp = RtspOutput(
            enabled=settings.rtsp_enabled,
            port=settings.rtsp_port,
            host=settings.host,
            public_host=settings.url_host(),
            authenticate=settings.access.rtsp_auth,
            # Failed RTSP logins wait as failed HTTP authentications do, per client address.
            on_auth_failure=FailureDelay(
                settings.access.auth_failure_delay_s, settings.access.auth_failure_delay_max_s
            ).record,
            encoder=self.encoder,
            metrics=self.metrics,
        )
        # Channels read over SRT on one port (`SWAPCAST_SRT_PORT`); refusals go to the audit log.
        self.srt = SrtOutput(
            port=settings.srt_port,
            host=settings.host,
            public_host=settings.url_host(),
            on_refused=self._srt_refused,
        )
        self.cache: IdentityCache[PreparedSource] = IdentityCache(
            self._load_identity, max_items=settings.identity_cache_items, registry=self.metrics.registry
        )
        self.pipeline: FramePipeline | None = None
        # Who a face is, for identity maps: loaded on the first map (app.identity.embedder).
        self._embedder: FaceEmbedder | None = None
        self._embedder_lock = asyncio.Lock()
        # Judges the eyes of uploaded photos (app.identity.photo_check): with the mesh engine, whose prepared
        # sources carry the landmarks it needs; None otherwise, or when its model cannot be had.
        self.eyes: EyeOpenness | None = None
        # The content gate (app.content): the policy is set by the app once it knows whether others reach this
        # server; the service is loaded with the pipeline unless the policy is off.
        self.content_policy: Policy = "off"
        self.content: ContentService | None = None
        self.audit: Audit = no_audit
        self.prepared_spec: PreparedSpec | None = None
        # Stored identities found damaged (id -> reason): left out of lists, refused with 409, deletable.
        self.damaged: dict[str, str] = {}
        # Set by the app (it needs the access control's owners and viewer tokens); None once it failed to start.
        self.channels: ChannelManager | None = None
        self.channels_problem: str | None = None
        self.sessions: SessionManager | None = None
        self.streams: StreamManager | None = None
        self.peer_config = peer_config(settings)
        # Freed memory goes back to the system when outputs and their viewers end (glibc keeps it otherwise).
        self.heap = HeapTrimmer()
        self.viewers = Viewers(
            self.peer_config, settings.max_viewers_per_output, self.encoder, on_hub_closed=self.heap.soon
        )
        self.ready = False
        self.not_ready_reason: str = "starting"
        self._load_task: asyncio.Task[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        loop = self.loop = asyncio.get_running_loop()
        addresses = media_host_addresses(self.settings)
        if addresses is not None:
            use_host_addresses(addresses)
        self.encoder.install()
        await loop.run_in_executor(self.control_executor, self.store.open)
        await self._audit_store()
        await loop.run_in_executor(self.control_executor, self.rtsp.start)
        self.metrics.rtsp_available.set(1 if self.rtsp.available else 0)
        await loop.run_in_executor(self.control_executor, self.srt.start)
        self.metrics.count_rtsp_clients_with(self._rtsp_clients)
        self.metrics.count_loop_tasks_with(lambda: len(asyncio.all_tasks(loop)))
        self.metrics.count_whep_viewers_with(lambda: len(self.viewers.all()))
        await self._start_channels()
        self._load_task = loop.create_task(self._load())
        self._announce()

    async def _start_channels(self) -> None:
        """Channels serve from start-up (their consumers see the slate while models load); a store that cannot
        be used turns channels off, with the reason, and the rest of the server runs."""
        channels = self.channels
        if channels is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(self.control_executor, channels.start)
        except (ChannelStoreError, OSError, ValueError) as exc:
            self.channels = None
            self.channels_problem = f"channels are off: {exc}"
            log.error("%s", self.channels_problem)

    async def run_control(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the control pool (identity and channel work: never on the event loop)."""
        return await asyncio.get_running_loop().run_in_executor(self.control_executor, fn, *args)

    def require_channels(self) -> ChannelManager:
        if self.channels is None:
            raise Unavailable(self.channels_problem or "channels are off")
        return self.channels

    async def _load(self) -> None:
        loop = asyncio.get_running_loop()
        self.not_ready_reason = "loading models"
        try:
            pipeline = await loop.run_in_executor(self.control_executor, self._pipeline_factory, self.settings.pipeline)
            if self.settings.warmup:
                self.not_ready_reason = "warming up"
                await loop.run_in_executor(self.control_executor, warm_up, pipeline)
            self.prepared_spec = await loop.run_in_executor(
                self.control_executor, PreparedSpec.of_engine, pipeline.engine
            )
            if pipeline.engine.name == "mesh":
                self.eyes = await loop.run_in_executor(self.control_executor, self._load_eyes)
            if self.content_policy != "off":
                self.not_ready_reason = "loading the content check"
                self.content = await loop.run_in_executor(self.control_executor, self._load_content)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the server stays alive and says why it is not ready
            self.not_ready_reason = f"model load failed: {exc}"
            log.exception("pipeline did not load")
            self._announce()
            return
        self.pipeline = pipeline
        await self._audit_store()
        s, peer = self.settings, self.peer_config
        guards = OutputGuards(self.provenance, self.content)
        self.sessions = SessionManager(
            pipeline=pipeline,
            executor=self.executor,
            metrics=self.metrics,
            config=SessionConfig(
                max_sessions=s.max_sessions,
                codecs=tuple(s.video_codecs),
                connect_timeout_s=s.connect_timeout_s,
                media_timeout_s=s.media_timeout_s,
                peer=peer,
            ),
            max_per_owner=s.max_sessions_per_principal,
            publisher_factory=self.rtsp.publish if self.rtsp.available else None,
            rtsp_url=self.rtsp.url if self.rtsp.available else None,
            guards=guards,
        )
        self.streams = StreamManager(
            pipeline=pipeline,
            metrics=self.metrics,
            rtsp=self.rtsp,
            max_streams=s.max_streams,
            max_per_owner=s.max_streams_per_principal,
            give_up=GiveUp(attempts=s.stream_give_up_attempts, seconds=s.stream_give_up_s),
            guards=guards,
            source_check=self.ingest_policy.check_and_probe,
        )
        self.ready = True
        self.not_ready_reason = ""
        self.metrics.ready.set(1)
        self.metrics.count_covered_for_model_errors_with(lambda: pipeline.covered_for_model_errors)
        log.info("ready: engine %s (%s)", pipeline.engine.name, pipeline.engine.model_key)
        self._announce()

    def _load_content(self) -> ContentService:
        """The content gate is a duty where its policy is on: without its model the server is not ready."""
        settings = self.settings.content
        try:
            check = load_content_check(
                open_model_store(self.settings.models), settings.threshold, settings.threads, settings.model_file
            )
        except Exception as exc:
            raise ModelError(
                f"the content check (SWAPCAST_CONTENT_POLICY={self.content_policy}) could not load: {exc}"
            ) from exc
        return ContentService(
            check, self.content_policy, settings.interval_s, self.metrics, self.audit, unchanged_s=settings.unchanged_s
        )

    def _load_eyes(self) -> EyeOpenness | None:
        """The closed-eye check is advice, not a duty: without its model, uploads go on without it."""
        try:
            return load_eye_openness(open_model_store(self.settings.models), self.settings.pipeline.threads)
        except Exception as exc:  # any failure to get or load the model: the server serves all the same
            log.warning("uploads get no closed-eye warning: the eye model did not load (%s)", exc)
            return None

    def models_changed_on_disk(self) -> dict[str, str]:
        """Model files changed or removed since they were loaded (name -> "changed" or "removed"). The loaded
        copies keep serving; each change is logged once. The next start checks the files again and refuses a
        corrupt one."""
        store = self.model_store
        changed = store.changed_on_disk() if store is not None else {}
        for name, what in changed.items():
            if store is not None and name not in self._changed_models_logged:
                self._changed_models_logged.add(name)
                log.warning(
                    "model %s: %s was %s after it was loaded; serving the copy loaded at start-up (a restart checks "
                    "the file again and refuses it unless it matches its sha256)",
                    name,
                    store.file_path(name),
                    what,
                )
        return changed

    async def model_tier_problem(self) -> str | None:
        """Why the model tier (the Triton server of backend triton) cannot run models now, else None; a change is
        logged. While it is away live faces are covered (`FramePipeline.process_live`); they swap again when it
        returns."""
        pipeline = self.settings.pipeline
        if pipeline.backend != "triton":
            return None
        asked_at, before = self._model_tier
        now = time.monotonic()
        if now - asked_at < MODEL_TIER_RECHECK_S:
            return before
        from app.runtime.triton import triton_problem

        problem = await asyncio.to_thread(triton_problem, pipeline.triton_url)
        self._model_tier = (time.monotonic(), problem)
        if problem is not None and before is None:
            log.warning("the model tier is away: %s; live faces are covered until it returns", problem)
        elif problem is None and before is not None:
            log.info("the model tier is back: live faces are swapped again")
        return problem

    def _announce(self) -> None:
        if self._on_change is not None:
            try:
                self._on_change(self)
            except Exception:  # a listener must not take the server down
                log.exception("state listener failed")

    async def stop(self) -> None:
        self.ready = False
        self.not_ready_reason = "shutting down"
        self.metrics.ready.set(0)
        if self._load_task is not None and not self._load_task.done():
            self._load_task.cancel()
            await asyncio.gather(self._load_task, return_exceptions=True)
        grace = self.settings.shutdown_grace_s
        closers = []
        if self.sessions is not None:
            closers.append(self.sessions.close_all("shutdown", grace))
        if self.streams is not None:
            closers.append(self.streams.close_all(grace))
        results = await asyncio.gather(*closers, return_exceptions=True)
        await self.viewers.close_all()
        self.heap.cancel()
        if self.channels is not None:
            await self.channels.stop()
        if not all(r is True for r in results):
            log.warning("some sessions or streams did not close within %.1f s", grace)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.control_executor, self.rtsp.stop)
        await loop.run_in_executor(self.control_executor, self.srt.stop)
        if self._embedder is not None:
            self._embedder.close()
        if self.eyes is not None:
            self.eyes.close()
        if self.content is not None:
            self.content.close()
        if self.pipeline is not None:  # a pipeline with batchers stops their threads
            try:
                await loop.run_in_executor(self.control_executor, self.pipeline.close)
            except Exception:
                log.exception("pipeline did not close cleanly")
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.control_executor.shutdown(wait=False, cancel_futures=True)
        self.embed_executor.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------------------ identities

    async def _audit_store(self) -> None:
        """Check every stored identity (and, once the engine is known, its prepared data) and say which are
        damaged, so one bad directory neither breaks the list nor starts a session that shows nothing."""
        loop = asyncio.get_running_loop()
        model_key = self.pipeline.engine.model_key if self.pipeline is not None else None
        found = await loop.run_in_executor(self.control_executor, self.store.audit, self.prepared_spec, model_key)
        for identity_id, reason in found.items():
            if identity_id not in self.damaged:
                log.warning("stored identity %s is damaged and will be refused: %s", identity_id, reason)
        self.damaged = found
        if found:
            log.warning("%d damaged stored identities: %s", len(found), ", ".join(sorted(found)))

    def check_usable(self, identity_id: str) -> None:
        """`IdentityUnreadable` (409) with the reason when the identity was found damaged."""
        reason = self.damaged.get(identity_id)
        if reason is not None:
            raise IdentityUnreadable(f"identity {identity_id} is damaged: {reason}")

    def forget_damaged(self, identity_id: str) -> None:
        self.damaged.pop(identity_id, None)

    def _load_identity(self, identity_id: str, model_key: str) -> PreparedSource:
        pipeline = self.pipeline
        if pipeline is None:
            raise NotReady(self.not_ready_reason)
        embedder = self._embedder
        if embedder is not None and model_key == embedder.key:  # a person's reference for identity maps
            prepare = reference_preparer(pipeline.detector, embedder)
            return self.store.load_prepared(identity_id, model_key, REFERENCE, prepare)
        return self.store.load_prepared(
            identity_id, model_key, pipeline.engine.name, re_preparer(pipeline), self.prepared_spec
        )

    async def load_source(self, identity_id: str) -> PreparedSource:
        """The identity prepared for the loaded engine (cached); IdentityNotFound if there is none."""
        pipeline = self.pipeline
        if pipeline is None:
            raise NotReady(self.not_ready_reason)
        if not is_identity_id(identity_id):
            raise IdentityNotFound(identity_id)
        self.check_usable(identity_id)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.control_executor, self.cache.get, identity_id, pipeline.engine.model_key)

    async def embedder(self) -> FaceEmbedder:
        """The face embedder identity maps match with, loaded once (off the event loop)."""
        pipeline = self.pipeline
        if pipeline is None:
            raise NotReady(self.not_ready_reason)
        async with self._embedder_lock:
            if self._embedder is None:
                store = open_model_store(self.settings.models)
                # dlib in a process of its own: in a thread it would hold the GIL, and every frame, ~0.1 s a face.
                build = partial(
                    build_embedder,
                    pipeline.engine,
                    self.settings.pipeline,
                    store,
                    own_process=True,
                    on_restart=self._embedder_restarted,
                )
                self._embedder = await asyncio.get_running_loop().run_in_executor(self.control_executor, build)
        return self._embedder

    def _embedder_restarted(self, why: str) -> None:
        self.metrics.worker_restarts.labels("dlib_embedder").inc()

    async def load_reference(self, identity_id: str) -> np.ndarray:
        """The identity's photos as a person's reference embedding (cached and stored like a preparation)."""
        embedder = await self.embedder()
        if not is_identity_id(identity_id):
            raise IdentityNotFound(identity_id)
        self.check_usable(identity_id)
        loop = asyncio.get_running_loop()
        prepared = await loop.run_in_executor(self.control_executor, self.cache.get, identity_id, embedder.key)
        return prepared.data

    def _srt_refused(self, address: str, stream_id: str, reason: str) -> None:
        """An SRT caller refused (libsrt's thread): audited with the stream id asked for, never a passphrase."""
        self.audit("srt_refused", client=address, stream_id=stream_id, reason=reason)

    def _rtsp_clients(self) -> int:
        paths: list[str] = []
        if self.sessions is not None:
            paths += self.sessions.rtsp_paths()
        if self.streams is not None:
            paths += self.streams.rtsp_paths()
        if self.channels is not None:
            paths += self.channels.rtsp_paths()
        return self.rtsp.client_count(paths)
