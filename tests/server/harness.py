"""A real server on 127.0.0.1 in a background thread, and helpers shared by the server tests."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import cv2
import httpx
import numpy as np
import uvicorn
from fastapi import FastAPI

from app.media.clips import MotionClip, write_clip
from app.pipeline.pipeline import FramePipeline
from app.pipeline.types import Image
from app.server.app import create_app
from app.server.connections import uvicorn_options
from app.server.settings import ServerSettings
from app.server.state import ServerState
from app.settings import PipelineSettings

T = TypeVar("T")


class RunningServer:
    def __init__(self, app: FastAPI, *, ca_file: Path | None = None) -> None:
        """Served over HTTPS, as `swapcast serve` does, when the settings name a TLS certificate; `ca_file`
        is the CA this process trusts for it."""
        self.app = app
        self.state: ServerState = app.state.swapcast
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        access = self.state.settings.access
        scheme = "https" if access.tls else "http"
        self.base_url = f"{scheme}://127.0.0.1:{self.port}"
        self.verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(ca_file)) if ca_file else True
        tls = {"ssl_certfile": str(access.tls_cert), "ssl_keyfile": str(access.tls_key)} if access.tls else {}
        options = uvicorn_options(self.state.settings.connection_limits())
        self.server = uvicorn.Server(
            uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5, **tls, **options)
        )
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def start(self, *, wait_ready: bool = True, timeout: float = 60.0) -> RunningServer:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        if wait_ready:
            self.wait_ready(deadline - time.monotonic())
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while httpx.get(f"{self.base_url}/readyz", verify=self.verify).status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("server did not become ready")
            time.sleep(0.05)

    def stop(self, timeout: float = 20.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self._sock.close()
        if self.thread.is_alive():
            raise RuntimeError("server thread did not stop")

    def call(self, fn: Callable[[], Coroutine[Any, Any, T]], timeout: float = 10.0) -> T:
        """Run a coroutine on the server's own event loop and return its result."""
        loop = self.state.loop
        assert loop is not None
        return asyncio.run_coroutine_threadsafe(fn(), loop).result(timeout)

    def task_names(self) -> list[str]:
        async def names() -> list[str]:
            me = asyncio.current_task()
            return sorted(t.get_name() for t in asyncio.all_tasks() if t is not me)

        return self.call(names)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.thread.is_alive():
            self.stop()


# Pushes (and ingest) to the tests' own servers on loopback, which the destination policy refuses by default; an
# SRT listener push on any port the test picks.
LOOPBACK_DESTINATIONS: dict[str, Any] = {
    "destination_allowed_networks": ["127.0.0.0/8"],
    "push_listener_ports": "1024-65535",
}


def server_settings(identity_dir: Path, **overrides: Any) -> ServerSettings:
    values: dict[str, Any] = {
        "identity_dir": identity_dir,
        "rtsp_enabled": False,
        "max_sessions": 2,
        "media_timeout_s": 4.0,
        "connect_timeout_s": 15.0,
        "pipeline_workers": 2,
        "pipeline": PipelineSettings(engine="classic"),
        # Tests share servers and run faster than any client: the rate-limit tests set their own.
        "rate_uploads": "100000/minute",
        "rate_sessions": "100000/minute",
        "rate_streams": "100000/minute",
        "rate_viewers": "100000/minute",
        "rate_credentials": "100000/minute",
        "rate_per_address": "100000/minute",
        "rate_auth_failures": "100000/minute",
    }
    values.update(overrides)
    return ServerSettings(**values)


def start_server(
    settings: ServerSettings,
    pipeline_factory: Callable[[PipelineSettings], FramePipeline],
    *,
    wait_ready: bool = True,
    ca_file: Path | None = None,
) -> RunningServer:
    return RunningServer(create_app(settings, pipeline_factory), ca_file=ca_file).start(wait_ready=wait_ready)


def encode(image: Image, ext: str = ".png") -> bytes:
    ok, data = cv2.imencode(ext, image)
    assert ok
    return data.tobytes()


def face_crop(image: Image, box: np.ndarray, margin: float = 0.8) -> Image:
    x1, y1, x2, y2 = (float(v) for v in box)
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    half = max(x2 - x1, y2 - y1) * margin
    top, bottom = int(max(0, cy - half)), int(min(image.shape[0], cy + half))
    left, right = int(max(0, cx - half)), int(min(image.shape[1], cx + half))
    return np.ascontiguousarray(image[top:bottom, left:right])


# What the page sends with every request: a form-encoded POST without it is refused (cross-site protection).
PAGE_HEADERS = {"X-Swapcast": "1"}


# The consent statement every upload needs: the photo shows the uploader.
SELF_CONSENT = {"consent": "self"}


def upload(
    base_url: str, data: bytes, filename: str = "face.png", headers: dict[str, str] | None = None, **fields: str
) -> httpx.Response:
    """Upload an identity as the page does, stating `consent=self` unless `fields` say otherwise."""
    return httpx.post(
        f"{base_url}/v1/identities",
        files={"image": (filename, data)},
        data={**SELF_CONSENT, **fields},
        headers=headers if headers is not None else PAGE_HEADERS,
        timeout=60,
    )


def camera_file(directory: Path, clip: MotionClip, frames: int = 15) -> Path:
    """The first `frames` of `clip` as a silent video file in `directory`: a stream's source."""
    video = directory / "camera.mp4"
    write_clip(MotionClip(clip.frames[:frames], clip.matrices[:frames], clip.fps), video, audio_tone_hz=None)
    return video


def start_stream(base_url: str, photo: bytes, source_url: str) -> str:
    """A stream from `source_url` with `photo` as its identity (201 asserted); its id."""
    identity = upload(base_url, photo).json()["id"]
    created = httpx.post(f"{base_url}/v1/streams", json={"source_url": source_url, "identity": identity}, timeout=30)
    assert created.status_code == 201, created.text
    return str(created.json()["id"])
