"""Server settings from the environment (prefix SWAPCAST_), validated once at start-up."""

import ipaddress
import os
from pathlib import Path
from typing import Any, Literal

from limits import parse
from pydantic import AnyHttpUrl, Field, IPvAnyAddress, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.auth.settings import AccessSettings
from app.content.settings import ContentSettings
from app.egress.push_policy import parse_port_range
from app.provenance.settings import ProvenanceSettings
from app.server.connections import ConnectionLimits
from app.server.ice import IceSettings
from app.settings import BatchingSettings, EncoderSettings, ModelStoreSettings, PipelineSettings

VideoCodec = Literal["H264", "VP8"]
DEFAULT_CODECS: tuple[VideoCodec, ...] = ("H264", "VP8")


def default_identity_dir() -> Path:
    """Identities live under the user's data directory unless SWAPCAST_IDENTITY_DIR says otherwise."""
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "swapcast" / "identities"


def _per_principal_rate(default: str, what: str) -> Any:  # a pydantic field, as `Field` returns
    """A rate setting counted per principal and per client address, described the same way for each."""
    return Field(default, description=f"{what} per principal and per client address (429 beyond).")


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SWAPCAST_", env_nested_delimiter="__", extra="ignore")

    host: str = Field(
        "127.0.0.1",
        description=(
            "Address the HTTP server (and, when it is one address, WebRTC media) binds; 0.0.0.0 "
            "for all. Off loopback, serve needs a key or JWT."
        ),
    )
    port: int = Field(8000, ge=0, le=65535, description="HTTP port; 0 picks a free one.")
    public_host: str | None = Field(
        None, description="Host name put in printed and returned URLs; the bind host when unset."
    )

    rtsp_enabled: bool = Field(True, description="Start the embedded RTSP output (GStreamer's gst-rtsp-server).")
    rtsp_port: int = Field(8554, ge=0, le=65535, description="RTSP output port.")
    srt_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description=(
            "UDP port of the SRT output, where channels are read by stream id (the name) and passphrase (the "
            "channel's RTSP password); 8890 is usual, 0 picks a free one. Unset: no SRT output."
        ),
    )

    max_sessions: int = Field(4, ge=1, description="Live WebRTC sessions at once; beyond it 503 with Retry-After.")
    max_streams: int = Field(4, ge=1, description="RTSP ingest streams at once; beyond it 503 with Retry-After.")
    # What one principal may hold of the above; None = only the global limits (one local owner holds all).
    max_sessions_per_principal: int | None = Field(
        None, ge=1, description="Live sessions one principal may hold; unset: only the global limit."
    )
    max_streams_per_principal: int | None = Field(
        None, ge=1, description="Ingest streams one principal may hold; unset: only the global limit."
    )
    # WHEP viewers of one session or stream: each has its own connection and send queue on the one encode.
    max_viewers_per_output: int = Field(
        8, ge=1, description="WHEP viewers of one session or stream; beyond it 503 with Retry-After."
    )
    retry_after_s: int = Field(
        5, ge=1, description="Retry-After (seconds) of a 503 when no slot is known to free sooner."
    )

    identity_dir: Path = Field(
        default_factory=default_identity_dir,
        description="Where identities (photos, thumbnails, prepared data, consent records) are stored.",
    )
    channel_dir: Path | None = Field(
        None,
        description=(
            "Where channels (named outputs whose URLs never change) and the secret their RTSP passwords come "
            "from are kept; replicas share it. Unset: `channels` beside the identity directory."
        ),
    )
    channel_hold_s: float = Field(
        5.0, ge=0.0, le=600.0, description="Seconds a channel shows its last frame, frozen, before its slate."
    )
    channel_slate: Path | None = Field(
        None, description="Image a channel shows while nobody publishes into it; unset: a plain 'Be right back' card."
    )
    channel_width: int = Field(1280, ge=16, le=3840, multiple_of=2, description="A new channel's picture width.")
    channel_height: int = Field(720, ge=16, le=2160, multiple_of=2, description="A new channel's picture height.")
    channel_fps: int = Field(30, ge=1, le=60, description="A new channel's frame rate.")
    max_channels_per_principal: int = Field(8, ge=1, description="Channels one principal may own (409 beyond).")
    # Each channel encodes its picture for each kind of consumer it has (RTSP, SRT, pushes): what one key may
    # make the server encode is bounded by these and by the channels it may own.
    max_channels: int = Field(64, ge=1, description="Channels on this server, all owners together (409 beyond).")
    max_channel_pixels: int = Field(
        1920 * 1080,
        ge=16 * 16,
        description="Pixels of a channel's picture, width times height: 1920x1080 or 1080x1920 (422 beyond).",
    )
    max_channel_fps: int = Field(60, ge=1, le=60, description="A channel's highest frame rate (422 beyond).")
    pushes_enabled: bool = Field(
        True,
        description=(
            "Run the channels' pushes (to RTMP/RTMPS, SRT and WHIP destinations) in this process. Replicas that "
            "share a channel directory would each push: leave it on in one of them only."
        ),
    )
    max_pushes_per_channel: int = Field(4, ge=1, le=32, description="Pushes one channel may have (409 beyond).")
    push_retry_s: float = Field(
        1.0, gt=0.0, le=60.0, description="Seconds a failed push waits before it connects again; doubles each time."
    )
    push_retry_max_s: float = Field(
        30.0, gt=0.0, le=600.0, description="The longest a failed push waits before it connects again."
    )
    max_push_workers: int = Field(
        16,
        ge=1,
        description=(
            "Pushes running on this server at once, all channels together, each a child process of about 120 MB "
            "while it connects or sends: a new push beyond it gets 503; stored ones beyond it wait their turn."
        ),
    )
    identity_cache_items: int = Field(64, ge=1, description="Prepared identities kept in memory.")
    max_upload_bytes: int = Field(
        10 * 1024 * 1024, ge=1024, description="Size of one identity upload, all its photos together (413 beyond)."
    )
    # Pixels an upload may declare: 16 MP (a 12 MP phone photo fits) keeps the worst decode, an RGBA PNG, near
    # 100 MB above the process's own size (`swapcast bench-upload`); 40 MP cost 973 MB.
    max_image_pixels: int = Field(
        16_000_000,
        ge=64 * 64,
        description=("Pixels an uploaded image may declare in its header, checked before decoding (413 beyond)."),
    )
    max_concurrent_decodes: int = Field(2, ge=1, description="Uploaded images decoded at once.")
    # Per owner: identities kept and their bytes on disk (a stored identity is its photo as PNG, ~1-6 MB, a
    # thumbnail and prepared data).
    max_identities: int = Field(100, ge=1, description="Identities one owner may keep (409 beyond).")
    max_identity_bytes: int = Field(
        500 * 1024 * 1024, ge=1024 * 1024, description="Bytes on disk of one owner's identities (413 beyond)."
    )
    # Creations per minute-window, per principal and per client address (429 with Retry-After beyond them);
    # the `limits` library's notation: "30/minute", "5/second", "100/hour".
    rate_uploads: str = Field(
        "30/minute", description="Identity uploads per principal and per client address, e.g. 30/minute (429 beyond)."
    )
    rate_sessions: str = _per_principal_rate("30/minute", "Sessions created")
    rate_streams: str = _per_principal_rate("10/minute", "Streams created")
    rate_credentials: str = _per_principal_rate("30/minute", "Viewer tokens and TURN logins minted")
    rate_viewers: str = _per_principal_rate("60/minute", "WHEP viewers opened")
    # Per client address, before authentication (app/server/address_limit.py): POST requests to the API, and
    # failed authentications, beyond which the address gets 429 on every API request until the window moves.
    rate_per_address: str = Field(
        "120/minute", description="POST requests to /v1/... per client address, before authentication (429 beyond)."
    )
    rate_auth_failures: str = Field(
        "30/minute",
        description=("Failed authentications per client address; beyond them every /v1/... request from it gets 429."),
    )
    sdp_max_bytes: int = Field(128 * 1024, ge=1024, description="Size of an SDP offer.")
    max_json_bytes: int = Field(64 * 1024, ge=1024, description="Size of a JSON request body.")
    # Counted before anything is parsed; nginx allows 4 x 8 KiB, uvicorn's h11 16 KiB.
    max_header_bytes: int = Field(
        32 * 1024,
        ge=4096,
        le=1024 * 1024,
        description="Size of a request's header block (request line and headers); 431 and closed beyond.",
    )

    video_codecs: list[VideoCodec] = Field(
        default_factory=lambda: list(DEFAULT_CODECS),
        min_length=1,
        description=("Video codecs offered to WebRTC clients, in order of preference (JSON list of H264, VP8)."),
    )
    ice_servers: list[str] = Field(
        default_factory=list,
        description="STUN URLs handed to the page (JSON list); none by default, so no outside calls.",
    )
    connect_timeout_s: float = Field(
        20.0, gt=0, description="From the answered offer until media flows; a session that takes longer ends."
    )
    ice_timeout_s: float = Field(
        5.0,
        gt=0,
        description=("From the answered offer until ICE connects; a client that takes longer frees its slot."),
    )
    max_remote_candidates: int = Field(
        16, ge=1, le=256, description="ICE candidates an offer may carry (400 beyond; none at all is a 400 too)."
    )
    # Per session (app/media/ice_bounds.py): outgoing STUN requests in any one second, and candidates learnt
    # from binding requests of addresses the offer did not list (peer-reflexive).
    ice_checks_per_s: int = Field(
        20,
        ge=1,
        le=1000,
        description="STUN requests one session sends in any one second; more are held back as if lost.",
    )
    max_peer_reflexive_candidates: int = Field(
        8,
        ge=0,
        le=256,
        description=(
            "Candidates one session learns from binding requests of unlisted addresses; further ones are dropped."
        ),
    )
    # Addresses media sockets bind and advertise; empty = the bind host when it is one address, else every
    # interface.
    ice_host_addresses: list[str] = Field(
        default_factory=list,
        description=(
            "Addresses WebRTC media binds and advertises (JSON list); empty: the bind host when "
            "it is one address, else every interface."
        ),
    )
    media_timeout_s: float = Field(
        10.0, gt=0, description="A session whose input delivers no frame for this long ends."
    )
    shutdown_grace_s: float = Field(5.0, gt=0, description="At shutdown, how long sessions and streams get to close.")
    # glibc's malloc fragments across its arenas as clients join and leave; jemalloc far less (measured in
    # docs/operations/benchmarks.md, "Long runs"). It must be in place before the first allocation, so serve
    # re-executes itself (app/runtime/allocator.py).
    allocator: Literal["auto", "system", "jemalloc"] = Field(
        "auto",
        description=(
            "C allocator of `swapcast serve`: auto and jemalloc re-execute it once with libjemalloc preloaded when "
            "that is installed (jemalloc warns when it is not); system keeps glibc's malloc."
        ),
    )
    # HTTP connections (app/server/connections.py): a request's headers must arrive within header_timeout_s, an
    # idle keep-alive connection closes after keep_alive_s, and at most max_connections are open (per client
    # address: max_connections_per_client); beyond those a connection gets 503 and is closed.
    header_timeout_s: float = Field(10.0, gt=0, description="A request's headers must arrive within this many seconds.")
    keep_alive_s: float = Field(5.0, gt=0, description="An idle keep-alive connection closes after this many seconds.")
    max_connections: int = Field(
        512, ge=1, description="Open HTTP connections in total; beyond it 503 and the connection is closed."
    )
    max_connections_per_client: int = Field(
        64, ge=1, description="Open HTTP connections per client address (a reverse proxy counts as one client)."
    )
    # Deployment: SIGTERM or POST /v1/server/drain lets open sessions run this long before the server stops;
    # absolute Location URLs naming this replica; the address ICE host candidates advertise behind a NAT.
    drain_timeout_s: float = Field(
        300.0,
        ge=0,
        description=("After SIGTERM or POST /v1/server/drain, how long open sessions may run before the server stops."),
    )
    public_base_url: AnyHttpUrl | None = Field(
        None, description=("Base of absolute Location URLs naming this replica (several replicas behind HAProxy).")
    )
    advertised_address: IPvAnyAddress | None = Field(
        None,
        description=(
            "The address ICE host candidates advertise behind a NAT (the host's reachable address "
            "in bridge networking)."
        ),
    )
    ice: IceSettings = Field(default_factory=IceSettings, description="TURN credentials (SWAPCAST_TURN_*).")

    allow_file_sources: bool = Field(False, description="Let POST /v1/streams read local files (tests, demos).")
    # Where ingest may connect (see app/server/ingest_policy.py): when set, the only networks a source may be in
    # (e.g. ["192.168.1.0/24"], or ["127.0.0.0/8"] for a camera proxy on this machine); else everything but
    # loopback, link-local, multicast, unspecified, reserved and this server's own ports.
    ingest_allowed_networks: list[str] = Field(
        default_factory=list,
        description=(
            'The only networks an ingest source may be in (JSON list, e.g. ["192.168.1.0/24"]); '
            "empty: all but loopback, link-local, multicast, unspecified, reserved and this "
            "server's ports."
        ),
    )
    ingest_allow_private: bool = Field(True, description="Let ingest connect to private address ranges.")
    # The destination policy (app/destination_policy.py) of every connection made on a user's word, ingest and
    # pushes alike: these networks are allowed although it refuses them by default.
    destination_allowed_networks: list[str] = Field(
        default_factory=list,
        description=(
            "Networks ingest sources and pushes may reach although the destination policy refuses them "
            '(JSON list, e.g. ["192.168.1.0/24"] for a LAN, ["127.0.0.0/8"] for a server on this machine); '
            "this server's own ports stay refused."
        ),
    )
    push_listener_ports: str = Field(
        "10000-10019",
        description=(
            "Ports an SRT listener push may listen on (FIRST-LAST); it binds the server's host and needs a "
            "passphrase (422 otherwise)."
        ),
    )
    # A stream whose source has not delivered a frame for this many attempts, or this long, becomes `failed`
    # and frees its slot (the owner can restart it).
    stream_give_up_attempts: int = Field(
        8, ge=1, description="Attempts without a frame after which a stream becomes failed."
    )
    stream_give_up_s: float = Field(
        60.0, gt=0, description="Seconds without a frame after which a stream becomes failed."
    )
    pipeline_workers: int = Field(
        default_factory=lambda: os.cpu_count() or 1,
        ge=1,
        description="Threads running sessions' pipelines in parallel.",
    )
    warmup: bool = Field(True, description="Run each model once at start-up, before /readyz answers 200.")

    models: ModelStoreSettings = Field(
        default_factory=ModelStoreSettings, description="Model store (SWAPCAST_MODEL_DIR)."
    )
    pipeline: PipelineSettings = Field(default_factory=PipelineSettings, description="The frame pipeline's settings.")
    encoder: EncoderSettings = Field(
        default_factory=EncoderSettings, description="Live H.264 encoding (SWAPCAST_ENCODER_*)."
    )
    # One shared dynamic batcher per model across all sessions. None = on where models run on a GPU, off on
    # CPU: `swapcast bench-batch` on 2 CPU cores measured batching at 0.97x throughput for one session and
    # 0.74-0.83x for 2-8 (the CPU gains nothing per item from a batch, and one worker per model serialises
    # what parallel sessions would overlap); a GPU is where batches pay (app.runtime.gpu.batching_on).
    batching_enabled: bool | None = Field(
        None,
        description=(
            "Share one dynamic batcher per model across sessions; unset: on where models run on a GPU, off on CPU."
        ),
    )
    batching: BatchingSettings = Field(
        default_factory=BatchingSettings, description="The dynamic batchers (SWAPCAST_BATCH_*)."
    )
    access: AccessSettings = Field(
        default_factory=AccessSettings, description="Keys, JWT, hosts, CORS, audit log, TLS."
    )
    provenance: ProvenanceSettings = Field(default_factory=ProvenanceSettings, description="Watermark, label, C2PA.")
    content: ContentSettings = Field(
        default_factory=ContentSettings, description="The content gate (SWAPCAST_CONTENT_*)."
    )

    @model_validator(mode="after")
    def _one_thread_per_model_run(self) -> "ServerSettings":
        """Unless SWAPCAST_THREADS says otherwise, each model run uses one thread: sessions run in parallel on
        `pipeline_workers` threads instead, and the codecs keep their cores (measured on 2 cores: with both per
        model run, one 480p session got 3 fps at p50 730 ms; with one, 11 fps at 290 ms)."""
        if self.pipeline.threads is None:
            self.pipeline = self.pipeline.model_copy(update={"threads": 1})
        # Live video keeps the tracker's smoothing but skips the second landmark pass per face (about two
        # small detector runs per face per frame) unless it is asked for.
        if "refine_landmarks" not in self.pipeline.model_fields_set:
            self.pipeline = self.pipeline.model_copy(update={"refine_landmarks": False})
        return self

    @field_validator("ingest_allowed_networks", "destination_allowed_networks")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for network in value:
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError:
                raise ValueError(f"{network!r} is not a network such as 192.168.1.0/24") from None
        return value

    @field_validator(
        "rate_uploads",
        "rate_sessions",
        "rate_streams",
        "rate_credentials",
        "rate_viewers",
        "rate_per_address",
        "rate_auth_failures",
    )
    @classmethod
    def _rate(cls, value: str) -> str:
        try:
            parse(value)
        except ValueError:
            raise ValueError(f"{value!r} is not a rate such as 30/minute") from None
        return value

    @field_validator("push_listener_ports")
    @classmethod
    def _port_range(cls, value: str) -> str:
        parse_port_range(value)
        return value

    def connection_limits(self) -> ConnectionLimits:
        return ConnectionLimits(
            header_timeout_s=self.header_timeout_s,
            keep_alive_s=self.keep_alive_s,
            max_connections=self.max_connections,
            max_per_client=self.max_connections_per_client,
            max_header_bytes=self.max_header_bytes,
        )

    def channel_store_dir(self) -> Path:
        return self.channel_dir if self.channel_dir is not None else self.identity_dir.parent / "channels"

    def url_host(self) -> str:
        if self.public_host:
            return self.public_host
        if self.host in ("0.0.0.0", "::", ""):
            return "127.0.0.1"
        return self.host
