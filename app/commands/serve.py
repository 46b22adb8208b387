"""`swapcast serve`: the web page, WebRTC sessions, identities and the RTSP output, started with one command."""

import argparse
import faulthandler
import logging
import os
import signal
import socket
import sys
from typing import TYPE_CHECKING

from pydantic import ValidationError

from app.commands.arguments import port, positive_int
from app.commands.options import add_engine_argument, add_serving_arguments
from app.errors import UserError, invalid_setting

if TYPE_CHECKING:
    from app.server.settings import ServerSettings

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
log = logging.getLogger(__name__)


# The content gate's policy in force, as the banner says it (docs/guides/content-gate.md).
CONTENT_NOTES = {
    "off": "off (SWAPCAST_CONTENT_POLICY=blur or stop checks uploads and live outputs)",
    "blur": "blur: explicit uploads refused, live outputs covered while explicit",
    "stop": "stop: explicit uploads refused, live sessions and streams ended",
}


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("serve", help="run the streaming server (web page, WebRTC, RTSP for OBS)")
    add_serving_arguments(p)
    p.add_argument("--rtsp-port", type=port, default=None, help="RTSP port (default 8554)")
    p.add_argument("--no-rtsp", action="store_true", help="do not start the RTSP output")
    p.add_argument("--srt-port", type=port, default=None, help="UDP port of the channels' SRT output (default off)")
    p.add_argument("--public-host", default=None, help="host name to put in printed and returned URLs")
    add_engine_argument(p)
    p.add_argument("--max-sessions", type=positive_int, default=None, help="concurrent WebRTC sessions (default 4)")
    p.add_argument("--allow-file-sources", action="store_true", help="let /v1/streams read local video files")
    p.set_defaults(func=run)


def build_settings(args: argparse.Namespace) -> "ServerSettings":
    """Server settings from the environment and the command line. The server's swap engine defaults to `auto`
    (not the pipeline's `classic`) and is resolved here, so the banner names the engine that runs."""
    from app.model_store import open_model_store, resolve_swap_engine
    from app.server.settings import ServerSettings

    overrides: dict[str, object] = {
        "host": args.host,
        "port": args.port,
        "rtsp_port": args.rtsp_port,
        "srt_port": args.srt_port,
        "public_host": args.public_host,
        "identity_dir": args.identity_dir,
        "max_sessions": args.max_sessions,
    }
    values = {k: v for k, v in overrides.items() if v is not None}
    if args.no_rtsp:
        values["rtsp_enabled"] = False
    if args.allow_file_sources:
        values["allow_file_sources"] = True
    try:
        settings = ServerSettings.model_validate(values)
        pipeline = settings.pipeline
        requested = args.engine or ("auto" if "engine" not in pipeline.model_fields_set else pipeline.engine)
        pipeline = pipeline.model_copy(update={"engine": requested})
        swap_engine = resolve_swap_engine(pipeline, open_model_store(settings.models))
        return settings.model_copy(update={"pipeline": pipeline.model_copy(update={"engine": swap_engine})})
    except ValidationError as exc:
        raise UserError(invalid_setting(exc)) from None


def listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from app.auth.access import Access
    from app.auth.redact import install_redaction
    from app.runtime.allocator import current_allocator
    from app.server.app import create_app
    from app.server.connections import uvicorn_options
    from app.server.draining_server import DrainingServer
    from app.server.state import ServerState
    from app.settings_catalog import unknown_warnings

    use_allocator(allocator_setting())  # may re-execute this process: before any output, socket or model
    # A fault in native code (a codec, a library) then writes every thread's Python stack to the log before the
    # process dies, instead of it vanishing without a word; a supervisor restarts it (docs/operations/faults.md).
    faulthandler.enable(sys.stderr, all_threads=True)
    for line in unknown_warnings():  # a misspelt setting would otherwise be ignored without a word
        print(line, file=sys.stderr)
    settings = build_settings(args)
    check_access(settings)
    sock = listen(settings.host, settings.port)
    port = sock.getsockname()[1]
    scheme = "https" if settings.access.tls else "http"
    base = f"{scheme}://{_url_host(settings.url_host())}:{port}"
    swap_engine = settings.pipeline.engine
    engine_note = {
        "mesh": " (no swap weights: the weightless mesh warp, see `swapcast models`)",
        "classic": " (no swap weights and no landmark model: the texture fallback, see `swapcast models`)",
    }.get(swap_engine, "")
    announced: set[str] = set()

    def announce(state: ServerState) -> None:
        if "started" not in announced:
            announced.add("started")
            rtsp = (
                f"{state.rtsp.base_url()}session/<session id>  (and stream/<stream id>)"
                if state.rtsp.available
                else f"off ({state.rtsp.reason})"
            )
            print(f"swapcast serving on {base}", flush=True)
            print(f"  page        {base}/", flush=True)
            print(f"  API docs    {base}/docs", flush=True)
            print(f"  RTSP        {rtsp}", flush=True)
            if state.srt.available:
                srt = f"{state.srt.base_url()}?streamid=<channel>&passphrase=<its RTSP password>"
                print(f"  SRT         {srt}", flush=True)
            print(f"  engine      {swap_engine}{engine_note}", flush=True)
            print(f"  identities  {settings.identity_dir}", flush=True)
            print(f"  access      {access.describe()}", flush=True)
            if metrics_server is not None:
                metrics_url = f"http://127.0.0.1:{metrics_server.server_port}/metrics"
                print(f"  metrics     {metrics_url} (loopback only, no credentials)", flush=True)
            audit = settings.access.audit_log or "off (SWAPCAST_AUDIT_LOG=stdout or a file)"
            print(f"  audit log   {audit}", flush=True)
            print(f"  content     {CONTENT_NOTES[state.content_policy]}", flush=True)
            print(f"  allocator   {current_allocator()}", flush=True)
            print("  loading models; /readyz answers 200 once they are warm", flush=True)
        if state.ready and "ready" not in announced:
            announced.add("ready")
            print(f"ready: open {base}/ in a browser", flush=True)
        elif state.not_ready_reason.startswith("model load failed") and "failed" not in announced:
            announced.add("failed")
            print(f"swapcast: not ready: {state.not_ready_reason}", file=sys.stderr, flush=True)

    app = create_app(settings, on_change=announce)
    access: Access = app.state.access
    metrics_server = None
    if settings.access.metrics_port is not None:
        from prometheus_client import start_http_server

        try:
            metrics_server, _ = start_http_server(
                settings.access.metrics_port, addr="127.0.0.1", registry=app.state.swapcast.metrics.registry
            )
        except OSError as exc:
            sock.close()
            raise UserError(f"cannot serve metrics on 127.0.0.1:{settings.access.metrics_port}: {exc}") from None
    verbose = logging.getLogger().isEnabledFor(logging.DEBUG)
    tls = settings.access
    config = uvicorn.Config(
        app,
        log_level="debug" if verbose else "warning",
        access_log=verbose,
        timeout_graceful_shutdown=max(1, round(settings.shutdown_grace_s)),
        **uvicorn_options(settings.connection_limits()),
        ssl_certfile=str(tls.tls_cert) if tls.tls_cert else None,
        ssl_keyfile=str(tls.tls_key) if tls.tls_key else None,
    )
    install_redaction()  # after uvicorn.Config, which sets up uvicorn's loggers
    server = DrainingServer(config, app.state.drain)
    stops: list[int] = []
    # uvicorn shuts down gracefully on SIGINT/SIGTERM and then raises the signal again under the handlers
    # that were there before it; these make that second delivery a no-op so a requested stop exits 0.
    previous = {sig: signal.signal(sig, lambda number, _frame: stops.append(number)) for sig in STOP_SIGNALS}
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        if metrics_server is not None:
            metrics_server.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("swapcast: stopped", flush=True)
    return 0


def allocator_setting() -> str:
    """SWAPCAST_ALLOCATOR, read before the full settings (whose errors `build_settings` reports)."""
    from app.server.settings import ServerSettings

    try:
        return ServerSettings().allocator
    except ValidationError:
        return "auto"


def use_allocator(choice: str) -> None:
    """Re-execute this process once with jemalloc preloaded when `choice` asks for it and the library is there
    (app/runtime/allocator.py); otherwise go on with the allocator in place, never failing for it."""
    from app.runtime.allocator import exec_with, reexec_library

    library, why = reexec_library(choice, os.environ)
    if library is None:
        if choice == "jemalloc" and "already loaded" not in why:
            log.warning("SWAPCAST_ALLOCATOR=jemalloc: %s", why)
        else:
            log.info("allocator: %s", why)
        return
    log.info("allocator: %s", why)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        exec_with(library, sys.orig_argv, sys.executable)
    except OSError as exc:  # the process is still this one: go on with glibc's malloc
        log.warning("cannot re-execute with %s (%s); system allocator", library, exc)


def check_access(settings: "ServerSettings") -> None:
    """Refuse to serve a non-loopback address with no credentials configured; warn loudly when told to anyway."""
    from app.auth.access import refusal_to_serve
    from app.auth.keys import KeyStore, KeyStoreError
    from app.auth.settings import is_loopback

    access = settings.access
    keys = KeyStore(access.keys_file)
    try:
        keys.refresh()  # a damaged or unsafe keys file stops the start, on loopback too
        refusal = refusal_to_serve(access, settings.host, keys)
        anonymous = access.allow_anonymous and not is_loopback(settings.host) and not keys.has_active()
    except KeyStoreError as exc:
        raise UserError(str(exc)) from None
    if refusal is not None:
        raise UserError(refusal)
    if anonymous and not access.jwt_configured:
        print(
            f"swapcast: WARNING: SWAPCAST_ALLOW_ANONYMOUS=true: anyone who can reach {settings.host} can use, "
            "watch and delete everything on this server",
            file=sys.stderr,
            flush=True,
        )
    for path in (access.tls_cert, access.tls_key):
        if path is not None and not path.is_file():
            raise UserError(f"TLS file not found: {path}")
    if access.jwt_configured:
        from app.auth.tokens import TokenConfigError, TokenVerifier

        try:
            TokenVerifier(access)
        except (TokenConfigError, OSError) as exc:
            raise UserError(f"JWT settings: {exc}") from None


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


if __name__ == "__main__":  # `python -m app.commands.serve`, before the command is listed in the CLI
    parser = argparse.ArgumentParser(prog="swapcast")
    register(parser.add_subparsers(dest="command", required=True))
    parsed = parser.parse_args(["serve", *sys.argv[1:]])
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        sys.exit(parsed.func(parsed))
    except UserError as exc:
        print(f"swapcast: error: {exc}", file=sys.stderr)
        sys.exit(2)
