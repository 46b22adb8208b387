"""`python -m build` makes a wheel and an sdist; the wheel, installed into a clean environment at the lock's
versions (with the assets and mesh-import extras), serves the page with the mesh engine and knows its version."""

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UV = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("build") is None, reason="no `build` (the dev group installs it)"),
    pytest.mark.skipif(UV is None, reason="no uv (the dev group installs it)"),
]


def run(*command: str | Path, cwd: Path = ROOT, timeout: float = 600) -> str:
    done = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{command}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done.stdout


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def test_the_wheel_serves_from_a_clean_environment(tmp_path: Path) -> None:
    assert UV is not None
    source = tmp_path / "source"  # a copy, so that the build leaves nothing in the working tree
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "NOTICE"):
        shutil.copy2(ROOT / name, source / name)
    for package in ("app", "engines"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "build", "--outdir", dist, source)
    wheels, sdists = sorted(dist.glob("swapcast-*.whl")), sorted(dist.glob("swapcast-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1

    venv = tmp_path / "venv"
    requirements = tmp_path / "requirements.txt"
    run(UV, "venv", "--python", sys.executable, venv)
    extras = ("--extra", "assets", "--extra", "mesh-import")
    run(UV, "export", "--frozen", "--no-default-groups", "--no-emit-project", *extras, "-o", requirements)
    python = venv / "bin" / "python"
    run(UV, "pip", "install", "--python", python, "-r", requirements)
    run(UV, "pip", "install", "--python", python, "--no-deps", wheels[0])
    swapcast = venv / "bin" / "swapcast"
    version = run(swapcast, "--version", cwd=tmp_path)
    assert version.strip() == f"swapcast {wheels[0].name.split('-')[1]}"

    port = free_port()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "SWAPCAST_MODEL_DIR": str(tmp_path / "models"),
        "SWAPCAST_IDENTITY_DIR": str(tmp_path / "identities"),
        "SWAPCAST_KEYS_FILE": str(tmp_path / "keys.json"),
        "SWAPCAST_MARK_REGISTRY": str(tmp_path / "marks.jsonl"),
    }
    for name in ("SSL_CERT_FILE", "PIP_CERT", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):  # the mesh import uses pip
        if name in os.environ:
            env[name] = os.environ[name]
    server = subprocess.Popen(
        [str(swapcast), "serve", "--port", str(port), "--no-rtsp"],
        cwd=tmp_path,  # nothing of the source tree on the path: the wheel's code runs
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        status, body = 0, ""
        while time.monotonic() < deadline and server.poll() is None:
            status, body = get(f"http://127.0.0.1:{port}/readyz")
            if status == 200:
                break
            time.sleep(1)
        assert status == 200, body
        assert '"engine":"mesh"' in body.replace(" ", "")
        status, page = get(f"http://127.0.0.1:{port}/")
        assert status == 200 and "<html" in page.lower()
    finally:
        server.terminate()
        output = server.communicate(timeout=60)[0]
    assert "Traceback" not in output, output[-3000:]
