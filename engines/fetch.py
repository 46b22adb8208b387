"""Getting published model files into the model directory: download, or copy in a file the user has.

A download goes to ``<file>.part`` next to its final place and resumes from there (HTTP Range) after a
dropped connection, a failed attempt or an earlier run; attempts are retried with exponential backoff
and every mirror is tried in turn. The finished file is checked against the manifest's size and sha256
before it is renamed into place, so the final path only ever holds a verified file. Where the manifest
has no hash, the computed one is printed so the user can pin it, and recorded in the local manifest.
"""

import errno
import hashlib
import http.client
import re
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from tqdm import tqdm

from engines import registry
from engines.atomic import atomic_path, replace_file
from engines.errors import ModelError
from engines.registry import ModelEntry
from engines.store import (
    check_file,
    how_to_get,
    make_record,
    remember_verified,
    sha256_file,
    write_local_record,
)

_CHUNK = 1 << 20
_USER_AGENT = "swapcast-model-fetch/0.1"
# HTTP statuses that will not change on a retry: go straight to the next mirror.
_PERMANENT = {400, 401, 403, 404, 405, 410, 451}

Notify = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


class _Retryable(Exception):
    """An attempt failed in a way a later attempt may not (dropped connection, short body, 5xx)."""


class _Permanent(Exception):
    """This mirror will not serve the file (404 and the like)."""


class _Mismatch(Exception):
    """The body arrived whole but is not the file the manifest describes."""


def _resolve(model: str | ModelEntry) -> ModelEntry:
    return model if isinstance(model, ModelEntry) else registry.get_entry(model)


def manual_instructions(entry: ModelEntry, root: Path) -> str:
    """One line telling the user how to put the file in place by hand."""
    return (
        f"get {registry.describe(entry)} and put it in {root}, or run `swapcast models import {entry.name} --from FILE`"
    )


def _content_range_start(value: str | None) -> int | None:
    match = re.match(r"bytes\s+(\d+)-\d+/(\d+|\*)", value or "")
    return int(match.group(1)) if match else None


def _attempt(url: str, part: Path, entry: ModelEntry, timeout: float, progress: bool) -> None:
    """One request: append to ``part`` from where it stops; raise unless the body arrived whole."""
    have = part.stat().st_size if part.exists() else 0
    if entry.size is not None and have > entry.size:
        part.unlink()
        have = 0
    if entry.size is not None and have == entry.size:
        return
    headers = {"User-Agent": _USER_AGENT}
    if have:
        headers["Range"] = f"bytes={have}-"
    request = urllib.request.Request(url, headers=headers)
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 416 and have:
            # The server has nothing past what we hold: the part is either complete or wrong.
            if entry.size is None:
                return
            part.unlink()
            raise _Retryable(f"HTTP 416 for a resume at byte {have}") from None
        if exc.code in _PERMANENT:
            raise _Permanent(f"HTTP {exc.code} {exc.reason}") from None
        raise _Retryable(f"HTTP {exc.code} {exc.reason}") from None
    with response:
        if have and response.status == 206:
            start = _content_range_start(response.headers.get("Content-Range"))
            if start != have:
                part.unlink()
                raise _Retryable(f"server answered a resume at byte {have} from byte {start}")
            mode = "ab"
        else:
            have, mode = 0, "wb"  # a 200: the server sent the whole file
        length = response.headers.get("Content-Length")
        expected_end = have + int(length) if length is not None and length.isdigit() else entry.size
        got = have
        with (
            part.open(mode) as out,
            tqdm(
                total=expected_end,
                initial=have,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=entry.file,
                disable=None if progress else True,
                leave=False,
            ) as bar,
        ):
            while chunk := response.read(_CHUNK):
                out.write(chunk)
                got += len(chunk)
                bar.update(len(chunk))
    if expected_end is not None and got < expected_end:
        raise _Retryable(f"connection closed after {got:,} of {expected_end:,} bytes")


def _check(part: Path, entry: ModelEntry, url: str) -> str:
    """The part's sha256, after checking size and hash against the manifest (raises _Mismatch)."""
    size = part.stat().st_size
    if entry.size is not None and size != entry.size:
        raise _Mismatch(f"{entry.file} from {url} is {size:,} bytes, expected {entry.size:,}")
    actual = sha256_file(part)
    if entry.sha256 is not None and actual != entry.sha256:
        raise _Mismatch(f"sha256 mismatch for {entry.file} from {url}: expected {entry.sha256}, got {actual}")
    return actual


def _intact(dest: Path, entry: ModelEntry) -> bool:
    """Whether ``dest`` already holds the pinned file (an unpinned file is fetched again)."""
    if entry.sha256 is None or not dest.is_file():
        return False
    if entry.size is not None and dest.stat().st_size != entry.size:
        return False
    return check_file(dest, entry.sha256)


def _is_offline(exc: BaseException) -> bool:
    """No route to the mirror at all (as opposed to a transfer that failed part-way)."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, socket.gaierror | ConnectionRefusedError):
        return True
    return isinstance(reason, OSError) and reason.errno in {errno.ENETUNREACH, errno.EHOSTUNREACH}


def fetch_entry(
    entry: ModelEntry,
    root: Path,
    *,
    urls: Sequence[str] | None = None,
    retries: int = 4,
    backoff: float = 1.0,
    timeout: float = 30.0,
    progress: bool = True,
    notify: Notify = _stderr,
) -> Path:
    """Download ``entry`` into the model directory ``root`` and return its verified path.

    Each mirror gets ``1 + retries`` attempts, waiting ``backoff * 2**k`` seconds between them.
    """
    dest = root / entry.file
    if _intact(dest, entry):
        return dest
    sources = tuple(urls if urls is not None else entry.urls)
    if not sources:
        raise ModelError(f"model {entry.name} has no download address: {manual_instructions(entry, root)}")
    root.mkdir(parents=True, exist_ok=True)
    part = root / f"{entry.file}.part"
    errors: list[str] = []
    mismatch: str | None = None
    offline = True
    for url in sources:
        restarted = False
        for attempt in range(retries + 1):
            if attempt:
                time.sleep(backoff * 2 ** (attempt - 1))
            resumed = part.exists() and part.stat().st_size > 0
            try:
                _attempt(url, part, entry, timeout, progress)
                actual = _check(part, entry, url)
            except _Mismatch as exc:
                part.unlink(missing_ok=True)
                mismatch, offline = str(exc), False
                if resumed and not restarted:
                    restarted = True  # the kept part may be what was wrong: once more from byte 0
                    continue
                break  # this mirror serves something else; try the next
            except _Permanent as exc:
                errors.append(f"{url}: {exc}")
                offline = False
                break
            except _Retryable as exc:
                errors.append(f"{url}: {exc}")
                offline = False
                continue
            except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
                errors.append(f"{url}: {getattr(exc, 'reason', exc)}")
                if _is_offline(exc):
                    break  # no name resolution or nobody listening: retrying this mirror will not help
                offline = False
                continue
            replace_file(part, dest)
            remember_verified(dest, actual)
            if entry.sha256 is None:
                write_local_record(root, make_record(entry, dest, actual))
                notify(
                    f"{entry.name}: no published sha256 to compare with; downloaded {dest} has sha256 {actual} "
                    f"(pin it if you trust this copy)"
                )
            return dest
    if mismatch is not None:
        raise ModelError(f"{mismatch}; the partial download was deleted")
    last = errors[-1] if errors else "no mirror answered"
    what = "cannot reach any mirror (offline?)" if offline else "download failed"
    raise ModelError(f"{what} for model {entry.name} ({last}): {manual_instructions(entry, root)}")


def fetch(
    name: str,
    root: Path,
    *,
    retries: int = 4,
    backoff: float = 1.0,
    timeout: float = 30.0,
    progress: bool = True,
    notify: Notify = _stderr,
) -> Path:
    """Download the registry model ``name`` unless it is already present and verified."""
    entry = registry.get_entry(name)
    if entry.source != "download":
        raise ModelError(f"model {name} is made locally, not downloaded: {how_to_get(entry)}")
    return fetch_entry(entry, root, retries=retries, backoff=backoff, timeout=timeout, progress=progress, notify=notify)


def import_file(model: str | ModelEntry, src: Path, root: Path) -> Path:
    """Copy a user-supplied file into the model directory after checking its size and sha256.

    Only models with a known hash are accepted (every download entry, and imports whose hash is
    pinned), so a wrong or damaged file never lands under a model's name.
    """
    entry = _resolve(model)
    if entry.sha256 is None:
        instead = f"run `swapcast models fetch {entry.name}`" if entry.source == "download" else how_to_get(entry)
        raise ModelError(f"model {entry.name} has no published sha256 to check {src} against: {instead}")
    if not src.is_file():
        raise ModelError(f"{src} is not a file")
    size = src.stat().st_size
    if entry.size is not None and size != entry.size:
        raise ModelError(
            f"{src} is {size:,} bytes, but {entry.file} for model {entry.name} is {entry.size:,} bytes: wrong file"
        )
    dest = root / entry.file
    if dest.exists() and src.resolve() == dest.resolve():
        actual = sha256_file(src)
        if actual != entry.sha256:
            raise ModelError(f"{src} has sha256 {actual}, expected {entry.sha256} for model {entry.name}")
        remember_verified(dest, actual)
        return dest
    digest = hashlib.sha256()
    with atomic_path(dest, suffix=".import") as tmp:
        with tmp.open("wb") as out, src.open("rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
        actual = digest.hexdigest()
        if actual != entry.sha256:
            raise ModelError(
                f"{src} has sha256 {actual}, expected {entry.sha256} for model {entry.name}: wrong or damaged file"
            )
    remember_verified(dest, actual)
    return dest
