"""The canonical face mesh geometry (468 vertices, 898 triangles, texture coordinates) from MediaPipe's
``@mediapipe/face_mesh`` npm package (Apache-2.0).

The package keeps ``geometry_pipeline_metadata_landmarks.binarypb`` inside its packed assets file; the loader
script beside it lists each asset's byte range. The protobuf is ``GeometryPipelineMetadata`` whose field 1 is the
canonical ``Mesh3d``: ``vertex_buffer`` (field 3, five floats per vertex: x, y, z, u, v) and ``index_buffer``
(field 4, three vertex indices per triangle). It is decoded here from the wire format, without MediaPipe's
``.proto`` files. The result is written as JSON (``write_geometry``); the project ships that small derived file
with attribution (NOTICE) so that serving needs neither npm nor the 16 MB package.
"""

from __future__ import annotations

import json
import re
import struct
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from engines.atomic import atomic_path
from engines.errors import ModelError
from engines.importers import npm_package

NPM_PACKAGE = "@mediapipe/face_mesh"
NPM_VERSION = "0.4.1657299874"
ASSET = "geometry_pipeline_metadata_landmarks.binarypb"
VERTICES = 468
TRIANGLES = 898


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def _fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of every field of one protobuf message."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
            yield number, wire, value
        elif wire == 2:
            length, at = _varint(data, at)
            yield number, wire, data[at : at + length]
            at += length
        elif wire == 5:
            yield number, wire, data[at : at + 4]
            at += 4
        elif wire == 1:
            yield number, wire, data[at : at + 8]
            at += 8
        else:
            raise ModelError(f"{ASSET}: unsupported protobuf wire type {wire}")


def decode_geometry(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Vertices [468,5] (x, y, z, u, v) and triangles [898,3] of the canonical mesh in ``data``."""
    meshes = [value for number, wire, value in _fields(data) if number == 1 and wire == 2]
    if len(meshes) != 1 or not isinstance(meshes[0], bytes):
        raise ModelError(f"{ASSET}: expected one canonical mesh, found {len(meshes)}")
    floats: list[float] = []
    indices: list[int] = []
    for number, wire, value in _fields(meshes[0]):
        if number == 3 and wire == 5 and isinstance(value, bytes):
            floats.append(struct.unpack("<f", value)[0])
        elif number == 3 and wire == 2 and isinstance(value, bytes):  # a packed encoding of the same field
            floats.extend(np.frombuffer(value, "<f4").tolist())
        elif number == 4 and wire == 0 and isinstance(value, int):
            indices.append(value)
        elif number == 4 and wire == 2 and isinstance(value, bytes):
            at = 0
            while at < len(value):
                index, at = _varint(value, at)
                indices.append(index)
    vertices = np.asarray(floats, np.float32)
    triangles = np.asarray(indices, np.int64)
    if vertices.size != VERTICES * 5 or triangles.size != TRIANGLES * 3 or triangles.max() >= VERTICES:
        raise ModelError(
            f"{ASSET}: {vertices.size} vertex floats and {triangles.size} indices, expected "
            f"{VERTICES * 5} and {TRIANGLES * 3}"
        )
    return vertices.reshape(VERTICES, 5), triangles.reshape(TRIANGLES, 3)


def asset_from_package(tarball: Path) -> bytes:
    """The geometry asset out of an ``npm pack`` tarball of the package."""
    with tarfile.open(tarball) as tar:

        def member(name: str) -> bytes:
            handle = tar.extractfile(f"package/{name}")
            if handle is None:
                raise ModelError(f"{tarball.name} has no package/{name}")
            return handle.read()

        try:
            loader = member("face_mesh_solution_packed_assets_loader.js").decode("utf-8")
            packed = member("face_mesh_solution_packed_assets.data")
        except KeyError as exc:
            raise ModelError(f"{tarball.name} is not the {NPM_PACKAGE} package ({exc})") from None
    found = re.search(rf'"filename":\s*"[^"]*/{re.escape(ASSET)}",\s*"start":\s*(\d+),\s*"end":\s*(\d+)', loader)
    if found is None:
        raise ModelError(f"{tarball.name}: the asset loader does not list {ASSET}")
    start, end = int(found.group(1)), int(found.group(2))
    return packed[start:end]


def npm_pack(work: Path) -> Path:
    """``npm pack`` the pinned package into ``work`` and return the tarball."""
    return npm_package.npm_pack(NPM_PACKAGE, NPM_VERSION, work)


def geometry_document(vertices: np.ndarray, triangles: np.ndarray) -> dict[str, object]:
    return {
        "source": f"npm {NPM_PACKAGE}@{NPM_VERSION}, {ASSET} (canonical Mesh3d)",
        "licence": "Apache-2.0, Copyright Google LLC (MediaPipe); see NOTICE",
        "vertices": VERTICES,
        "canonical_xyz": np.round(vertices[:, :3].astype(np.float64), 5).tolist(),
        "uv": np.round(vertices[:, 3:].astype(np.float64), 6).tolist(),
        "triangles": triangles.tolist(),
    }


def write_geometry(dest: Path, tarball: Path | None = None) -> Path:
    """Decode the geometry (from ``tarball``, or a fresh ``npm pack``) and write it to ``dest`` as JSON."""
    with tempfile.TemporaryDirectory(prefix="face-geometry-") as tmp:
        source = tarball if tarball is not None else npm_pack(Path(tmp))
        vertices, triangles = decode_geometry(asset_from_package(source))
    text = json.dumps(geometry_document(vertices, triangles), separators=(",", ":"))
    with atomic_path(dest) as path:
        path.write_text(text + "\n", encoding="utf-8")
    return dest
