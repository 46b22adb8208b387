"""The deploy check (scripts/check-deploy.sh) passes on the repository, and each of its validators rejects
a broken file: a misspelt compose key, an unknown Kubernetes field, a misspelt Triton config field, a
broken HAProxy config."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engines.errors import ModelError
from engines.triton.config import parse_config

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(BIN))
    if found is None:
        pytest.skip(f"{name} is not installed (scripts/setup-dev.sh installs it)")
    return found


def _run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.mark.slow
def test_check_deploy_script_passes() -> None:
    _tool("haproxy")
    env = {**os.environ, "VENV": str(BIN.parent), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        ["bash", "scripts/check-deploy.sh"], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for what in ("Dockerfile.gpu", "docker-compose.bridge.yml", "overlays/gpu", "config.pbtxt", "haproxy.cfg"):
        assert what in done.stdout


def test_compose_schema_rejects_a_misspelt_key(tmp_path: Path) -> None:
    broken = tmp_path / "compose.yml"
    text = (ROOT / "docker-compose.yml").read_text().replace("stop_grace_period:", "stop_grace_periods:", 1)
    broken.write_text(text)
    done = _run(_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(broken))
    assert done.returncode != 0
    assert "stop_grace_periods" in done.stdout + done.stderr


def test_kubernetes_validate_rejects_an_unknown_field() -> None:
    rendered = _run(_tool("kubectl"), "kustomize", "deploy/k8s/overlays/cpu")
    assert rendered.returncode == 0, rendered.stderr
    broken = rendered.stdout.replace("terminationGracePeriodSeconds:", "terminationGraceSeconds:", 1)
    assert broken != rendered.stdout
    done = _run(_tool("kubernetes-validate"), "--strict", "-", stdin=broken)
    assert done.returncode != 0
    assert "terminationGraceSeconds" in done.stdout + done.stderr


def test_triton_config_parse_rejects_a_misspelt_field() -> None:
    text = (ROOT / "deploy" / "triton" / "retinaface_mnet025" / "config.pbtxt").read_text()
    assert parse_config(text).name == "retinaface_mnet025"
    with pytest.raises(ModelError, match="max_queue_delay_microsecond"):
        parse_config(text.replace("max_queue_delay_microseconds", "max_queue_delay_microsecond"))


def test_haproxy_check_rejects_a_broken_config(tmp_path: Path) -> None:
    broken = tmp_path / "haproxy.cfg"
    broken.write_text(
        (ROOT / "deploy" / "haproxy" / "haproxy.cfg").read_text().replace("balance leastconn", "balance x")
    )
    done = _run(_tool("haproxy"), "-c", "-f", str(broken))
    assert done.returncode != 0


def test_hadolint_rejects_a_bad_dockerfile(tmp_path: Path) -> None:
    broken = tmp_path / "Dockerfile"
    broken.write_text((ROOT / "Dockerfile").read_text().replace("USER 10001:10001", "USER root"))
    done = _run(_tool("hadolint"), str(broken))
    assert done.returncode != 0
    assert "DL3002" in done.stdout  # the last USER must not be root
