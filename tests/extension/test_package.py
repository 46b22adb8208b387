"""The extension as shipped: a Manifest V3 that asks for no site up front, scripts that parse, settings checked
with clear messages, and a zip that is the same bytes on every run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.extension.extension_files import EXTENSION, ROOT, extension_id, manifest

NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="needs Node.js (node) on PATH")
PACK = ROOT / "scripts" / "pack_extension.py"


def test_the_manifest_asks_for_no_site_until_the_user_adds_one() -> None:
    shipped = manifest()
    assert shipped["manifest_version"] == 3
    assert sorted(shipped["permissions"]) == ["scripting", "storage"]
    assert "host_permissions" not in shipped and "content_scripts" not in shipped
    assert sorted(shipped["optional_host_permissions"]) == ["http://*/*", "https://*/*"]
    assert extension_id() == "mglopnodfaidfpongogkalmennppmkic"  # pinned by "key": the id servers allow
    for name in (shipped["background"]["service_worker"], shipped["options_ui"]["page"], "page.js", "bridge.js"):
        assert (EXTENSION / name).is_file(), name


@needs_node
@pytest.mark.parametrize("script", sorted(p.name for p in EXTENSION.glob("*.js")))
def test_every_script_parses(script: str) -> None:
    assert NODE is not None
    result = subprocess.run([NODE, "--check", str(EXTENSION / script)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def validate_all(forms: list[dict[str, object]]) -> list[dict[str, object]]:
    """The options page's check of each form, run by Node (one process for all) on settings.js itself."""
    assert NODE is not None
    program = (
        "const vm = require('vm'); const fs = require('fs'); const context = { URL };"
        f"vm.runInNewContext(fs.readFileSync({json.dumps(str(EXTENSION / 'settings.js'))}, 'utf8'), context);"
        f"const forms = {json.dumps(forms)};"
        "process.stdout.write(JSON.stringify(forms.map((f) => context.SwapcastSettings.validate(f))));"
    )
    result = subprocess.run([NODE, "-e", program], capture_output=True, text=True, check=True)
    return list(json.loads(result.stdout))


GOOD = {
    "server": "https://swap.example.com/",
    "channel": "evening",
    "token": " vt_abc ",
    "sites": "https://meet.google.com\nhttps://discord.com https://meet.google.com",
    "always": True,
    "sound": "channel",
}


@needs_node
def test_good_settings_are_kept_tidied() -> None:
    assert validate_all([GOOD]) == [
        {
            "settings": {
                "server": "https://swap.example.com",
                "channel": "evening",
                "token": "vt_abc",
                "sites": ["https://meet.google.com", "https://discord.com"],
                "always": True,
                "sound": "channel",
            }
        }
    ]


BAD = [  # (what changes, the field refused, what its message says)
    ({"server": ""}, "server", "Enter the server's address"),
    ({"server": "ftp://swap.example.com"}, "server", "must start with https://"),
    ({"server": "https://swap.example.com/?x=1"}, "server", "no ?query"),
    ({"channel": "Evening Show"}, "channel", "lowercase letters"),
    ({"token": ""}, "token", "viewer token"),
    ({"token": "vt_a b"}, "token", "spaces"),
    ({"sites": ""}, "sites", "at least one site"),
    ({"sites": "meet.google.com"}, "sites", "is not a site"),
    ({"sites": "http://meet.example.com"}, "sites", "only to https:// sites"),
    ({"sites": "https://meet.google.com/abc-defg-hij"}, "sites", "without a path"),
    ({"sound": "both"}, "sound", "microphone, channel"),
]


@needs_node
def test_bad_settings_are_refused_with_what_to_fix() -> None:
    results = validate_all([{**GOOD, **change} for change, _, _ in BAD])
    for (change, field, says), result in zip(BAD, results, strict=True):
        assert "settings" not in result, change
        errors = result["errors"]
        assert isinstance(errors, dict) and list(errors) == [field], (change, errors)
        assert says in errors[field], (change, errors[field])


@needs_node
def test_a_site_on_this_computer_may_be_plain_http() -> None:
    (result,) = validate_all([{**GOOD, "server": "http://127.0.0.1:8000", "sites": "http://localhost:5173"}])
    settings = result["settings"]
    assert isinstance(settings, dict) and settings["sites"] == ["http://localhost:5173"]


def pack(out: Path, source: Path | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(PACK), "--out", str(out)]
    if source is not None:  # pack a changed copy: the module's own pack(), on another folder
        code = f"import sys; sys.path.insert(0, {str(PACK.parent)!r}); import pack_extension as p; "
        code += f"p.pack(__import__('pathlib').Path({str(source)!r}), __import__('pathlib').Path({str(out)!r}))"
        command = [sys.executable, "-c", code]
    return subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)


def test_the_zip_is_the_same_bytes_every_time(tmp_path: Path) -> None:
    first, second = pack(tmp_path / "a"), pack(tmp_path / "b")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    name = f"swapcast-extension-{manifest()['version']}.zip"
    assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    with zipfile.ZipFile(tmp_path / "a" / name) as archive:
        assert archive.namelist() == sorted(p.name for p in EXTENSION.iterdir() if p.is_file())
        assert json.loads(archive.read("manifest.json")) == manifest()


def test_a_manifest_naming_a_missing_file_is_not_packed(tmp_path: Path) -> None:
    broken = tmp_path / "extension"
    shutil.copytree(EXTENSION, broken)
    (broken / "background.js").unlink()
    result = pack(tmp_path / "out", broken)
    assert result.returncode == 1 and not (tmp_path / "out").exists()
    assert result.stderr.strip().splitlines()[-1] == (
        "pack-extension: the manifest names files that are not there: background.js"
    )
