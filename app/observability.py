"""Prometheus metrics of one server instance, kept in its own registry so several apps can run in one process."""

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from app.pipeline.timing import StageTimer
from app.runtime.torch_graphs import CaptureCollector

STAGE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0)


@dataclass(frozen=True)
class ChannelFigures:
    name: str
    seconds_held: float
    seconds_on_slate: float
    consumers: dict[str, int]  # by transport: rtsp, whep


class ChannelCollector(Collector):
    """Per channel: seconds of held frame and of slate sent while nobody published, and consumers by
    transport; read from the channels when scraped."""

    def __init__(self) -> None:
        self.figures: Callable[[], list[ChannelFigures]] = list

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        held = CounterMetricFamily(
            "swapcast_channel_held_seconds",
            "Seconds a channel sent its last frame held (no publisher).",
            labels=["channel"],
        )
        slate = CounterMetricFamily(
            "swapcast_channel_slate_seconds", "Seconds a channel sent its slate (no publisher).", labels=["channel"]
        )
        consumers = GaugeMetricFamily(
            "swapcast_channel_consumers", "Clients reading a channel, by transport.", labels=["channel", "transport"]
        )
        for figures in self.figures():
            held.add_metric([figures.name], figures.seconds_held)
            slate.add_metric([figures.name], figures.seconds_on_slate)
            for transport, count in sorted(figures.consumers.items()):
                consumers.add_metric([figures.name, transport], count)
        yield held
        yield slate
        yield consumers


class _FunctionCounter(Collector):
    """A counter whose value a function reads from where it is kept (a count that lives in another object)."""

    def __init__(self, name: str, documentation: str, read: Callable[[], int]) -> None:
        self._name, self._documentation, self._read = name, documentation, read

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self._name, self._documentation, value=self._read())


class Metrics:
    """Everything `/metrics` exports. `kind` labels say whether a frame belongs to a WebRTC session or an RTSP
    stream; drop `reason`s are fixed words (superseded, output_superseded, error, ...)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        r.register(CaptureCollector())  # CUDA-graph captures of the torch backend (process-wide counts)
        self.ready = Gauge("swapcast_ready", "1 once models are loaded and warmed, else 0.", registry=r)
        self.sessions_active = Gauge("swapcast_sessions_active", "Open WebRTC sessions.", registry=r)
        self.session_capacity = Gauge(
            "swapcast_session_capacity",
            "Sessions this replica admits at most: 0 when not ready or draining.",
            registry=r,
        )
        self.draining = Gauge("swapcast_draining", "1 while draining (no new sessions or streams).", registry=r)
        self.streams_active = Gauge("swapcast_streams_active", "Running RTSP ingest streams.", registry=r)
        self.sessions_closed = Counter(
            "swapcast_sessions_closed", "WebRTC sessions ended, by why.", ["reason"], registry=r
        )
        self.frames_in = Counter("swapcast_frames_in", "Decoded input frames received.", ["kind"], registry=r)
        self.frames_out = Counter("swapcast_frames_out", "Processed frames handed on.", ["kind"], registry=r)
        self.frames_dropped = Counter(
            "swapcast_frames_dropped", "Frames dropped instead of queued, by reason.", ["kind", "reason"], registry=r
        )
        self.stage_seconds = Histogram(
            "swapcast_stage_seconds", "Pipeline stage wall time per call.", ["stage"], buckets=STAGE_BUCKETS, registry=r
        )
        self.frame_latency = Histogram(
            "swapcast_frame_latency_seconds",
            "From a decoded input frame to its processed frame handed to the encoder.",
            ["kind"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.hop_seconds = Histogram(
            "swapcast_hop_seconds",
            "Per frame, each hop from decoded input to encoded output: queue, each pipeline stage, output_wait,"
            " encode, total (app.live.hops).",
            ["kind", "hop"],
            buckets=STAGE_BUCKETS,
            registry=r,
        )
        self.admission_rejections = Counter(
            "swapcast_admission_rejections",
            "Requests refused for capacity or readiness.",
            ["resource", "reason"],
            registry=r,
        )
        self.store_full = Counter(
            "swapcast_store_full",
            "Writes refused (507) because a store's disk had no room; nothing half-written is kept.",
            ["store"],
            registry=r,
        )
        self.model_files_changed = Gauge(
            "swapcast_model_files_changed",
            "Model files changed or removed on disk since they were loaded (the loaded copies keep serving).",
            registry=r,
        )
        self.model_files_changed.set_function(lambda: 0.0)
        self.worker_restarts = Counter(
            "swapcast_worker_restarts",
            "Worker processes started again after they died (the log says how each ended), by worker.",
            ["worker"],
            registry=r,
        )
        self._covered_for_model_errors: Callable[[], int] = lambda: 0
        covered = _FunctionCounter(
            "swapcast_frames_covered_for_model_errors",
            "Live frames handed on with every face covered because a model could not run (its server away).",
            lambda: self._covered_for_model_errors(),
        )
        r.register(covered)
        self.rtsp_available = Gauge(
            "swapcast_rtsp_available",
            "1 while the RTSP output serves, 0 when it is off (disabled, or it could not start: /v1/server says why).",
            registry=r,
        )
        self.rtsp_clients = Gauge("swapcast_rtsp_clients", "Clients reading our RTSP outputs.", registry=r)
        self.channel_publisher_changes = Counter(
            "swapcast_channel_publisher_changes",
            "Sessions or streams that started publishing into a channel.",
            ["channel"],
            registry=r,
        )
        self.content_checks = Counter(
            "swapcast_content_checks",
            "Images the content check scored, by kind (session, stream, upload) and side (input, output).",
            ["kind", "side"],
            registry=r,
        )
        self.content_hits = Counter(
            "swapcast_content_hits",
            "Images the content check flagged (at or above SWAPCAST_CONTENT_THRESHOLD), by kind and side.",
            ["kind", "side"],
            registry=r,
        )
        self.content_seconds = Histogram(
            "swapcast_content_check_seconds",
            "Wall time of one content check run (a batch of live frames, or an upload's photos).",
            ["where"],
            buckets=STAGE_BUCKETS,
            registry=r,
        )
        self.channels = ChannelCollector()
        r.register(self.channels)
        self.rtsp_clients.set_function(lambda: 0.0)
        self.event_loop_tasks = Gauge(
            "swapcast_event_loop_tasks", "Tasks alive on the server's event loop (flat when nothing leaks).", registry=r
        )
        self.event_loop_tasks.set_function(lambda: 0.0)
        self.egress_frames_encoded = Counter(
            "swapcast_egress_frames_encoded",
            "Frames encoded for outputs, by encoder: `return` (a session's own WebRTC return), `channel` and `path` "
            "(a channel's or a session's or stream's own shared encode, one for all its readers).",
            ["kind"],
            registry=r,
        )
        self.egress_reader_errors = Counter(
            "swapcast_egress_reader_errors",
            "Outputs detached because they failed on a frame or a packet (a live output's listeners, a shared encode's "
            "readers), by output kind.",
            ["kind"],
            registry=r,
        )
        self.whep_viewers = Gauge("swapcast_whep_viewers", "WHEP viewers connected, all outputs together.", registry=r)
        self.whep_viewers.set_function(lambda: 0.0)
        self.store_full.labels("identities")
        self.worker_restarts.labels("dlib_embedder")
        for kind in ("session", "stream"):
            self.frames_in.labels(kind)
            self.frames_out.labels(kind)
        self.ready.set(0)

    def observe_stages(self, timer: StageTimer) -> None:
        for stage, values in timer.samples.items():
            child = self.stage_seconds.labels(stage)
            for seconds in values:
                child.observe(seconds)

    def count_covered_for_model_errors_with(self, count: Callable[[], int]) -> None:
        self._covered_for_model_errors = count

    def count_changed_models_with(self, count: Callable[[], int]) -> None:
        self.model_files_changed.set_function(lambda: float(count()))

    def count_rtsp_clients_with(self, count: Callable[[], int]) -> None:
        self.rtsp_clients.set_function(lambda: float(count()))

    def count_loop_tasks_with(self, count: Callable[[], int]) -> None:
        self.event_loop_tasks.set_function(lambda: float(count()))

    def count_whep_viewers_with(self, count: Callable[[], int]) -> None:
        self.whep_viewers.set_function(lambda: float(count()))

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
