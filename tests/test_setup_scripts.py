"""The two set-ups, CI and the README agree: serving installs only what serving needs, the dev set-up everything
the tests use, both from the lock, and CI runs the README's test command after the dev set-up."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def sync_options(script: str, option: str) -> set[str]:
    return set(re.findall(rf"--{option} ([\w-]+)", (ROOT / "scripts" / script).read_text()))


def test_the_serving_set_up_is_lean() -> None:
    extras = sync_options("setup.sh", "extra")
    assert extras == {"assets", "rtsp", "mesh-import", "match"}
    assert sync_options("setup.sh", "group") == set()
    text = (ROOT / "scripts" / "setup.sh").read_text()
    assert "--no-dev" in text and "--frozen" in text
    for absent in ("docker", "haproxy", "coturn", "prometheus", "chromium", "setup-triton"):
        assert absent not in text


def test_the_serving_set_up_imports_every_model_the_defaults_use() -> None:
    """A new server keeps hands in front (SWAPCAST_OCCLUSION=auto needs the hand model imported) and needs no
    import on its first session: npm comes from Debian where the machine has none (Debian's npm cannot go beside a
    Node.js from another repository, which brings its own), and the set-up imports the defaults' models."""
    from app.settings import PipelineSettings

    common = (ROOT / "scripts" / "setup-common.sh").read_text()
    assert re.search(r"^if ! command -v npm .*; then SERVING_APT\+=\(npm\); fi$", common, re.MULTILINE)
    text = (ROOT / "scripts" / "setup.sh").read_text()
    loop = re.search(r"for model in (.+); do\n\s+\.venv/bin/swapcast models fetch", text)
    assert loop is not None
    defaults = PipelineSettings()
    assert defaults.occlusion == "auto"
    wanted = {defaults.detector_model, defaults.landmark_model, f'"${{SWAPCAST_HAND_MODEL:-{defaults.hand_model}}}"'}
    assert wanted <= set(loop.group(1).split())


def test_the_dev_set_up_is_a_superset_and_every_name_exists() -> None:
    extras, groups = sync_options("setup-dev.sh", "extra"), sync_options("setup-dev.sh", "group")
    assert sync_options("setup.sh", "extra") <= extras
    assert {"torch", "quality", "triton"} <= extras and {"test", "dev"} <= groups
    assert extras <= set(PYPROJECT["project"]["optional-dependencies"])
    assert groups <= set(PYPROJECT["dependency-groups"])
    assert "test" not in PYPROJECT["project"]["optional-dependencies"]  # a dependency group, not an extra
    assert "--frozen" in (ROOT / "scripts" / "setup-dev.sh").read_text()


def test_ci_runs_the_readme_commands_and_checks_the_lock() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("```bash\n", 1)[1].split("```", 1)[0]
    assert "bash scripts/setup.sh && .venv/bin/swapcast serve" in block
    assert "bash scripts/setup-dev.sh && .venv/bin/python -m pytest -q" in block
    assert len(readme.splitlines()) <= 120
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/setup-dev.sh" in ci and ".venv/bin/python -m pytest -q" in ci
    assert ".venv/bin/uv lock --check" in ci and "mkdocs build --strict" in ci


def test_the_images_install_from_the_lock() -> None:
    for dockerfile in ("Dockerfile", "Dockerfile.gpu"):
        text = (ROOT / dockerfile).read_text()
        assert "uv export --frozen" in text and "--require-hashes" in text
        assert "tomllib" not in text  # no requirement list made from pyproject's ranges
    assert "!uv.lock" in (ROOT / ".dockerignore").read_text()
