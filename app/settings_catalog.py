"""Every SWAPCAST_ setting in one catalog, read from the settings classes themselves: its environment variable,
type, default and description, and its effective value with where that came from. `swapcast config` prints it,
`swapcast serve` warns about SWAPCAST_ variables it does not know, and docs/reference/settings.md is generated
from it."""

import difflib
import json
import os
import types
import typing
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python
from pydantic_settings import BaseSettings

from app.auth.settings import AccessSettings
from app.content.settings import ContentSettings
from app.provenance.settings import ProvenanceSettings
from app.server.ice import IceSettings
from app.server.settings import ServerSettings
from app.settings import BatchingSettings, EncoderSettings, ModelStoreSettings, PipelineSettings

# Group title, settings class and the ServerSettings field that holds it (None: ServerSettings itself).
GROUPS: tuple[tuple[str, type[BaseSettings], str | None], ...] = (
    ("Server", ServerSettings, None),
    ("TURN", IceSettings, "ice"),
    ("Models", ModelStoreSettings, "models"),
    ("Pipeline", PipelineSettings, "pipeline"),
    ("Encoder", EncoderSettings, "encoder"),
    ("Batching", BatchingSettings, "batching"),
    ("Access", AccessSettings, "access"),
    ("Provenance", ProvenanceSettings, "provenance"),
    ("Content gate", ContentSettings, "content"),
)
# Secrets that are plain strings: the watermark key reads every mark made with it.
SECRET_FIELDS = frozenset({"watermark_key"})
# SWAPCAST_ variables read by the deployment files, scripts and tests, not by the server.
OTHER_VARIABLES = frozenset(
    {
        "SWAPCAST_IMAGE",  # docker-compose.yml
        "SWAPCAST_GPU_IMAGE",
        "SWAPCAST_IMAGE_WORK",  # scripts/check-image.sh
        "SWAPCAST_BUILD_CA",
        "SWAPCAST_ROUTER_BIND",  # deploy/haproxy/haproxy.cfg
        "SWAPCAST_MEDIA_1",
        "SWAPCAST_MEDIA_2",
        "SWAPCAST_TRITON_VENV",  # the Triton backend tests
        "SWAPCAST_ALLOCATOR_REEXEC",  # set by serve for its re-executed self (app/runtime/allocator.py)
    }
)
# Defaults that depend on the machine, as the reference page states them.
MACHINE_DEFAULTS = {"pipeline_workers": "the number of CPU cores"}
MASK = "********"
TYPE_NAMES = {"str": "text", "int": "integer", "float": "number", "AnyHttpUrl": "URL", "IPvAnyAddress": "IP address"}

Source = Literal["default", "environment"]


@dataclass(frozen=True)
class Setting:
    group: str
    owner: type[BaseSettings]
    holder: str | None  # the ServerSettings field holding `owner`'s instance
    name: str
    info: FieldInfo

    @property
    def env(self) -> str:
        return f"{self.owner.model_config.get('env_prefix', '')}{self.name}".upper()

    @property
    def description(self) -> str:
        return self.info.description or ""

    @property
    def secret(self) -> bool:
        return self.name in SECRET_FIELDS or _mentions(self.info.annotation, SecretStr)

    @property
    def type_text(self) -> str:
        return _type_text(self.info.annotation)


@dataclass(frozen=True)
class Effective:
    setting: Setting
    value: str
    source: Source


def _nested(info: FieldInfo) -> bool:
    annotation = info.annotation
    return isinstance(annotation, type) and issubclass(annotation, BaseSettings)


def catalog() -> list[Setting]:
    """Every setting, grouped, in the order the classes declare them (nested settings classes are groups)."""
    return [
        Setting(group, owner, holder, name, info)
        for group, owner, holder in GROUPS
        for name, info in owner.model_fields.items()
        if not _nested(info)
    ]


def _mentions(annotation: Any, wanted: type) -> bool:
    if annotation is wanted:
        return True
    return any(_mentions(arg, wanted) for arg in typing.get_args(annotation))


def _type_text(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return " or ".join(_type_text(a) for a in inner)
    if origin is Literal:
        return " \\| ".join(str(a) for a in args)
    if origin is list:
        return "JSON list"
    if origin is dict:
        return "JSON object"
    if annotation is bool:
        return "true \\| false"
    if isinstance(annotation, type) and issubclass(annotation, Path):
        return "path"
    if annotation is SecretStr:
        return "secret"
    name = getattr(annotation, "__name__", str(annotation))
    return TYPE_NAMES.get(name, name)


def show(value: object, secret: bool = False) -> str:
    """A value as it is written in the environment: JSON for lists and objects, plain text otherwise."""
    if value is None:
        return "(unset)"
    if secret or isinstance(value, SecretStr):
        return MASK
    plain = to_jsonable_python(value)
    if isinstance(plain, bool):
        return "true" if plain else "false"
    if isinstance(plain, str):
        return plain
    return json.dumps(plain, separators=(", ", ": "))


def _in_environment(environ: Mapping[str, str]) -> set[str]:
    return {name.upper() for name in environ}


def effective() -> list[Effective]:
    """Every setting with the value `swapcast serve` starts from (before its command-line options) and its
    source, from this process's environment. Raises pydantic's ValidationError for a value the settings refuse."""
    present = _in_environment(os.environ)
    server = ServerSettings()
    rows = []
    for setting in catalog():
        instance = server if setting.holder is None else getattr(server, setting.holder)
        value = getattr(instance, setting.name)
        nested = f"SWAPCAST_{setting.holder}__{setting.name}".upper() if setting.holder else ""
        source: Source = "environment" if setting.env in present or nested in present else "default"
        rows.append(Effective(setting, show(value, setting.secret), source))
    return rows


def known_names() -> set[str]:
    names = {s.env for s in catalog()} | set(OTHER_VARIABLES)
    for _, owner, holder in GROUPS:
        if holder is not None:  # ServerSettings also reads SWAPCAST_<HOLDER>__<FIELD> and SWAPCAST_<HOLDER>
            names.add(f"SWAPCAST_{holder}".upper())
            names |= {f"SWAPCAST_{holder}__{field}".upper() for field in owner.model_fields}
    return names


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """SWAPCAST_ variables no setting reads, each with the closest known name (None when nothing is close)."""
    known = known_names()
    settings = sorted(s.env for s in catalog())
    found = []
    for name in sorted(os.environ if environ is None else environ):
        upper = name.upper()
        if upper.startswith("SWAPCAST_") and upper not in known:
            close = difflib.get_close_matches(upper, settings, n=1, cutoff=0.75)
            found.append((name, close[0] if close else None))
    return found


def unknown_warnings(environ: Mapping[str, str] | None = None) -> list[str]:
    lines = []
    for name, close in unknown_variables(environ):
        hint = f" (did you mean {close}?)" if close else ""
        lines.append(f"swapcast: warning: {name} is not a setting and is ignored{hint}")
    return lines


_HOME = "/home-of-the-user"


@contextmanager
def _neutral_home() -> Iterator[None]:
    """Defaults built from the home and XDG directories, as `~/...` rather than this machine's paths."""
    saved = {k: os.environ.get(k) for k in ("HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME")}
    try:
        os.environ["HOME"] = _HOME
        os.environ.pop("XDG_CACHE_HOME", None)
        os.environ.pop("XDG_DATA_HOME", None)
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def documented_default(setting: Setting) -> str:
    if setting.name in MACHINE_DEFAULTS:
        return MACHINE_DEFAULTS[setting.name]
    if setting.info.default_factory is not None:
        with _neutral_home():
            value = setting.info.default_factory()  # type: ignore[call-arg]
    else:
        value = setting.info.default
    if value is None:
        return "unset"
    return f"`{show(value).replace(_HOME, '~')}`"


def settings_markdown() -> str:
    """docs/reference/settings.md."""
    lines = [
        "# Settings",
        "",
        "<!-- Generated from the settings classes by `python -m app.commands.reference_docs`; do not edit. -->",
        "",
        "Every setting is an environment variable. Lists and objects are written as JSON",
        "(`SWAPCAST_CORS_ORIGINS='[\"https://example.org\"]'`). A variable that starts with `SWAPCAST_` but names no",
        "setting is ignored, with a warning at start-up naming the closest setting. `swapcast config` prints every",
        "setting with its effective value and where it came from (secrets masked); `swapcast config --json` the same",
        "as JSON. Command-line options of `swapcast serve` (`--host`, `--port`, ...) override the environment.",
    ]
    group = ""
    for setting in catalog():
        if setting.group != group:
            group = setting.group
            lines += ["", f"## {group}", "", "| variable | type | default | description |", "|---|---|---|---|"]
        description = setting.description.replace("|", "\\|")
        lines.append(f"| `{setting.env}` | {setting.type_text} | {documented_default(setting)} | {description} |")
    return "\n".join(lines) + "\n"
