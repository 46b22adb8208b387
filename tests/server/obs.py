"""OBS Studio itself, as a streamer runs it: Debian's OBS 29 under Xvfb, driven over obs-websocket 5 (its JSON
protocol over a WebSocket: Hello, Identify, then requests), with a profile of its own in a temporary home.

`obs_unavailable()` says what is missing (the binary, Xvfb); `Obs.start` raises `ObsDidNotStart` with OBS's
own log when it cannot come up (no OpenGL, a crash), which the tests turn into a skip with that reason."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import websockets

from app.pipeline.types import Image
from tests.server.push_servers import free_port


def obs_unavailable() -> str | None:
    if shutil.which("obs") is None:
        return "OBS Studio is not installed (apt-get install obs-studio)"
    if shutil.which("Xvfb") is None:
        return "Xvfb is not installed (apt-get install xvfb)"
    return None


class ObsDidNotStart(Exception):
    pass


class Obs:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_port()
        self.display = f":{100 + os.getpid() % 400}"
        self._xvfb: subprocess.Popen[bytes] | None = None
        self._obs: subprocess.Popen[bytes] | None = None
        config = home / ".config" / "obs-studio"
        (config / "plugin_config" / "obs-websocket").mkdir(parents=True, exist_ok=True)
        # Not a first run (no set-up wizard); the WebSocket server on, without a password, on a free port.
        (config / "global.ini").write_text(
            "[General]\nFirstRun=true\nLastVersion=486539266\nEnableAutoUpdates=false\n"
            "[OBSWebSocket]\nServerEnabled=true\nAuthRequired=false\n"
            f"ServerPort={self.port}\nFirstLoad=false\nAlertsEnabled=false\n"
        )
        (config / "plugin_config" / "obs-websocket" / "config.json").write_text(
            json.dumps({"server_enabled": True, "auth_required": False, "server_port": self.port, "first_load": False})
        )

    def start(self, timeout: float = 60.0) -> Obs:
        self._xvfb = subprocess.Popen(
            ["Xvfb", self.display, "-screen", "0", "1280x800x24", "-nolisten", "tcp"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        env = {**os.environ, "HOME": str(self.home), "DISPLAY": self.display, "LIBGL_ALWAYS_SOFTWARE": "1"}
        self._log = (self.home / "obs.log").open("wb")
        self._obs = subprocess.Popen(
            ["obs", "--disable-updater", "--disable-shutdown-check", "--minimize-to-tray", "--multi"],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.home,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._obs.poll() is not None:
                raise ObsDidNotStart(f"OBS exited ({self._obs.returncode}): {self.log()[-600:]}")
            try:
                asyncio.run(self._call("GetVersion", {}))
                return self
            except OSError:
                time.sleep(0.5)
        raise ObsDidNotStart(f"OBS's WebSocket did not answer in {timeout:.0f} s: {self.log()[-600:]}")

    def log(self) -> str:
        path = self.home / "obs.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        for process in (self._obs, self._xvfb):
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(5)

    def call(self, request: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
        return asyncio.run(self._call(request, data or {}))

    async def _call(self, request: str, data: dict[str, Any]) -> dict[str, Any]:
        async with websockets.connect(f"ws://127.0.0.1:{self.port}", subprotocols=["obswebsocket.json"]) as ws:
            hello = json.loads(await ws.recv())
            assert hello["op"] == 0, hello
            await ws.send(json.dumps({"op": 1, "d": {"rpcVersion": 1}}))
            identified = json.loads(await ws.recv())
            assert identified["op"] == 2, identified
            request_id = uuid.uuid4().hex
            await ws.send(
                json.dumps({"op": 6, "d": {"requestType": request, "requestId": request_id, "requestData": data}})
            )
            while True:
                message = json.loads(await ws.recv())
                if message["op"] == 7 and message["d"]["requestId"] == request_id:
                    status = message["d"]["requestStatus"]
                    if not status["result"]:
                        raise RuntimeError(f"OBS refused {request}: {status}")
                    return dict(message["d"].get("responseData") or {})

    def screenshot(self, source: str, width: int) -> Image | None:
        """What the source shows now, as OBS renders it; None while it has nothing to show (OBS answers that
        it failed to render)."""
        try:
            shot = self.call("GetSourceScreenshot", {"sourceName": source, "imageFormat": "png", "imageWidth": width})
        except RuntimeError as exc:
            if "Failed to render" in str(exc):
                return None
            raise
        data = base64.b64decode(shot["imageData"].split(",", 1)[1])
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        assert image is not None
        return np.asarray(image, np.uint8)

    def __enter__(self) -> Obs:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
