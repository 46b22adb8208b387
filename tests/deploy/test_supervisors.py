"""Every shipped way of running the server restarts it after a crash: the systemd unit (valid for systemd, and
restarting a second after any exit it did not ask for, a signal included) and every compose service that
runs `swapcast serve`. Kubernetes restarts a pod's containers by itself."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "systemd" / "swapcast.service"
RESTARTS_AFTER_A_CRASH = {"always", "on-failure", "on-abnormal"}  # systemd's values that cover a fatal signal


def _service_settings(text: str) -> dict[str, list[str]]:
    """The [Service] section's keys and values (a key may repeat, as Environment= does)."""
    settings: dict[str, list[str]] = {}
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            settings.setdefault(key, []).append(value)
    return settings


def _verify(unit_text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """systemd-analyze on a copy that runs /bin/true (the install prefix is not on this machine)."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed")
    copy = tmp_path / "swapcast.service"
    copy.write_text(re.sub(r"^ExecStart=\S+", "ExecStart=/bin/true", unit_text, flags=re.MULTILINE))
    return subprocess.run([tool, "verify", "--man=no", str(copy)], capture_output=True, text=True, timeout=60)


def test_the_systemd_unit_is_valid_and_a_misspelt_key_is_reported(tmp_path: Path) -> None:
    text = UNIT.read_text()
    done = _verify(text, tmp_path)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")
    broken = _verify(text.replace("RestartSec=", "RestartSecs="), tmp_path)
    assert "RestartSecs" in broken.stdout + broken.stderr


def test_the_systemd_unit_restarts_the_server_a_second_after_a_crash() -> None:
    service = _service_settings(UNIT.read_text())
    assert service["ExecStart"] == ["/opt/swapcast/.venv/bin/swapcast serve"]  # scripts/setup.sh's .venv
    assert service["Restart"][0] in RESTARTS_AFTER_A_CRASH
    assert service["RestartSec"] == ["1s"]
    # A stop drains (SIGTERM) for up to SWAPCAST_DRAIN_TIMEOUT_S, as compose's stop_grace_period allows.
    assert service["KillSignal"] == ["SIGTERM"] and service["TimeoutStopSec"] == ["330s"]


@pytest.mark.parametrize("compose_file", ["docker-compose.yml", "docker-compose.bridge.yml"])
def test_every_compose_service_that_serves_restarts_after_a_crash(compose_file: str) -> None:
    services = yaml.safe_load((ROOT / compose_file).read_text())["services"]
    # swapcast's images run `serve` unless a command says otherwise (the GPU profile's one-off engine build)
    serving = {n: s for n, s in services.items() if "SWAPCAST" in s.get("image", "") and "command" not in s}
    assert "swapcast" in serving
    for name, service in serving.items():
        assert service.get("restart") in ("always", "unless-stopped", "on-failure"), (compose_file, name)
