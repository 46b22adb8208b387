"""Identities: upload, list, fetch, delete, survive a restart, and refuse hostile or unusable images."""

import hashlib
import io
import json
import socket
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import cv2
import httpx
import numpy as np
import pytest
from PIL import Image as PilImage

from app.auth.settings import AccessSettings
from app.identity.consent import MAX_ATTESTATION
from app.identity.images import decode_image
from app.identity.store import IdentityStore, prepared_file_name
from app.media.clips import load_sample
from app.pipeline.pipeline import FramePipeline
from app.pipeline.swap import PreparedSource
from app.settings import PipelineSettings
from tests.server.harness import PAGE_HEADERS, RunningServer, encode, server_settings, start_server, upload
from tests.server.images import gif_bytes, gradient, png_claiming


def test_upload_list_get_thumbnail_delete(server: RunningServer, tom_png: bytes) -> None:
    created = upload(server.base_url, tom_png, "tom.png", name="Tom")
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["name"] == "Tom"
    assert body["faces"] == 1
    assert body["face_index"] is None
    assert body["model_key"] == "classic:256"
    identity = body["id"]

    listed = httpx.get(f"{server.base_url}/v1/identities").json()["identities"]
    assert identity in [i["id"] for i in listed]
    assert httpx.get(f"{server.base_url}/v1/identities/{identity}").json()["name"] == "Tom"
    thumb = httpx.get(f"{server.base_url}/v1/identities/{identity}/thumbnail")
    assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/jpeg"
    assert cv2.imdecode(np.frombuffer(thumb.content, np.uint8), cv2.IMREAD_COLOR) is not None

    assert httpx.delete(f"{server.base_url}/v1/identities/{identity}").status_code == 204
    assert httpx.get(f"{server.base_url}/v1/identities/{identity}").status_code == 404
    assert httpx.delete(f"{server.base_url}/v1/identities/{identity}").status_code == 404
    refused = httpx.post(
        f"{server.base_url}/v1/sessions?identity={identity}",
        content="v=0\r\n",
        headers={"Content-Type": "application/sdp"},
    )
    assert refused.status_code == 404


def test_name_defaults_to_the_file_name_and_webp_is_accepted(server: RunningServer) -> None:
    rgb = load_sample("tom_hanks")[:, :, ::-1]
    buffer = io.BytesIO()
    PilImage.fromarray(np.ascontiguousarray(rgb)).save(buffer, format="WEBP", quality=90)
    created = upload(server.base_url, buffer.getvalue(), "Tom Hanks.webp")
    assert created.status_code == 201, created.text
    assert created.json()["name"] == "Tom Hanks"


def test_group_photo_needs_a_face_index(server: RunningServer, t1_jpeg: bytes) -> None:
    ambiguous = upload(server.base_url, t1_jpeg, "group.jpg")
    assert ambiguous.status_code == 422
    assert "found 6 faces" in ambiguous.json()["detail"]
    chosen = upload(server.base_url, t1_jpeg, "group.jpg", face_index="2")
    assert chosen.status_code == 201, chosen.text
    assert chosen.json()["faces"] == 6 and chosen.json()["face_index"] == 2
    missing = upload(server.base_url, t1_jpeg, "group.jpg", face_index="6")
    assert missing.status_code == 422 and "does not exist" in missing.json()["detail"]
    assert upload(server.base_url, t1_jpeg, "group.jpg", face_index="two").status_code == 422
    assert upload(server.base_url, t1_jpeg, "group.jpg", face_index="-1").status_code == 422


@pytest.mark.parametrize(
    ("make", "status", "reason"),
    [
        (lambda png, jpeg: jpeg[: len(jpeg) // 2], 400, "truncated"),
        (lambda png, jpeg: png_claiming(100_000, 100_000), 413, "limit"),
        (lambda png, jpeg: png_claiming(7000, 7000), 413, "limit"),
        (lambda png, jpeg: encode(gradient(), ".png"), 422, "no face"),
        (lambda png, jpeg: gif_bytes(), 415, "JPEG, PNG or WebP"),
        (lambda png, jpeg: b"this is not an image, just text pretending to be one\n" * 20, 415, "JPEG, PNG or WebP"),
        (lambda png, jpeg: b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, 400, "PNG"),
        (lambda png, jpeg: b"", 422, "empty"),
    ],
    ids=[
        "truncated-jpeg",
        "png-claims-100000x100000",
        "png-over-40mp",
        "no-face",
        "gif",
        "text",
        "broken-png",
        "empty",
    ],
)
def test_hostile_images_get_a_4xx_with_a_reason(
    server: RunningServer, tom_png: bytes, make: Callable[[bytes, bytes], bytes], status: int, reason: str
) -> None:
    data = make(tom_png, encode(load_sample("tom_hanks"), ".jpg"))
    response = upload(server.base_url, data, "face.png")
    assert response.status_code == status, response.text
    assert reason in response.json()["detail"]


def test_wrong_form_gets_4xx(server: RunningServer, tom_png: bytes) -> None:
    base = server.base_url
    as_json = httpx.post(f"{base}/v1/identities", json={"image": "x"})
    assert as_json.status_code == 415
    no_image = httpx.post(f"{base}/v1/identities", files={"photo": ("a.png", tom_png)}, headers=PAGE_HEADERS)
    assert no_image.status_code == 422 and "image" in no_image.json()["detail"]
    as_field = httpx.post(
        f"{base}/v1/identities", data={"image": "not a file"}, files={"x": ("a", b"b")}, headers=PAGE_HEADERS
    )
    assert as_field.status_code == 422
    no_boundary = httpx.post(
        f"{base}/v1/identities", content=b"--x--", headers={"Content-Type": "multipart/form-data", **PAGE_HEADERS}
    )
    assert no_boundary.status_code == 400
    long_name = upload(base, tom_png, "tom.png", name="x" * 500)
    assert long_name.status_code == 422
    assert httpx.get(f"{base}/v1/identities/not-an-id").status_code == 404
    assert httpx.get(f"{base}/v1/identities/{'0' * 32}").status_code == 404


def test_oversized_upload_is_refused_from_its_header_before_the_body_is_read(server: RunningServer) -> None:
    """Only the headers are sent, announcing 50 MB: the answer comes without the server waiting for a body."""
    request = (
        b"POST /v1/identities HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Swapcast: 1\r\n"
        b"Content-Type: multipart/form-data; boundary=xyz\r\nContent-Length: 52428800\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
        conn.sendall(request)
        reply = conn.recv(4096).decode()
    assert reply.startswith("HTTP/1.1 413"), reply
    assert "over the limit" in reply

    chunked = (
        b"POST /v1/identities HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Swapcast: 1\r\n"
        b"Content-Type: multipart/form-data; boundary=xyz\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
        conn.sendall(chunked)
        reply = conn.recv(4096).decode()
    assert reply.startswith("HTTP/1.1 411"), reply


def test_identities_survive_a_restart_and_are_prepared_again_for_another_engine(
    identity_dir: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], tom_png: bytes
) -> None:
    with start_server(server_settings(identity_dir), pipeline_factory) as first:
        identity = upload(first.base_url, tom_png, "tom.png", name="Tom").json()["id"]

    other = server_settings(identity_dir, pipeline=PipelineSettings(engine="passthrough", threads=1))
    with start_server(other, pipeline_factory) as second:
        listed = httpx.get(f"{second.base_url}/v1/identities").json()["identities"]
        assert [(i["id"], i["name"], i["model_key"]) for i in listed] == [(identity, "Tom", "passthrough:128")]
        state = second.state
        source = second.call(lambda: state.load_source(identity))
        assert source.model_key == "passthrough:128"
    prepared = identity_dir / identity / "prepared"
    assert (prepared / prepared_file_name("classic:256")).is_file()
    assert (prepared / prepared_file_name("passthrough:128")).is_file()


def test_a_stored_identity_is_prepared_again_with_its_own_face_and_never_a_guess(
    identity_dir: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], t1_jpeg: bytes
) -> None:
    t1 = decode_image(t1_jpeg, 10**8)[0]
    passthrough = server_settings(identity_dir, pipeline=PipelineSettings(engine="passthrough", threads=1))
    with start_server(passthrough, pipeline_factory) as first:
        chosen = upload(first.base_url, t1_jpeg, "group.jpg", face_index="2").json()["id"]
    # An identity stored without a face_index (it had one face when it was enrolled) whose photo now shows
    # several, as when another detector finds more: preparing it again must refuse, not take the largest.
    unchosen = (
        IdentityStore(identity_dir)
        .create(
            name="group",
            photo=t1_jpeg,
            format="jpeg",
            width=t1.shape[1],
            height=t1.shape[0],
            faces=1,
            face_index=None,
            thumbnail=b"",
            prepared=PreparedSource("passthrough", "passthrough:128", np.zeros(0, np.float32)),
        )
        .id
    )

    with start_server(server_settings(identity_dir), pipeline_factory) as second:  # the classic engine
        state = second.state
        source = second.call(lambda: state.load_source(chosen))
        assert state.pipeline is not None
        expected = state.pipeline.prepare_source(t1, 2)
        assert source.model_key == expected.model_key == "classic:256"
        assert np.array_equal(source.data, expected.data)
        assert not np.array_equal(source.data, state.pipeline.prepare_source(t1, "largest").data)
        session = httpx.post(
            f"{second.base_url}/v1/sessions?identity={unchosen}",
            content=b"v=0\r\n",
            headers={"Content-Type": "application/sdp"},
        )
        assert session.status_code == 409
        assert "found 6 faces" in session.json()["detail"]


def test_an_upload_without_a_valid_consent_statement_is_refused_with_the_reason(
    server: RunningServer, tom_png: bytes
) -> None:
    base = server.base_url
    before = len(httpx.get(f"{base}/v1/identities").json()["identities"])
    refused = {
        "missing": upload(base, tom_png, consent=""),
        "unknown": upload(base, tom_png, consent="sure"),
        "no attestation": upload(base, tom_png, consent="obtained"),
        "long attestation": upload(base, tom_png, consent="obtained", attestation="x" * (MAX_ATTESTATION + 1)),
    }
    reasons = {what: (r.status_code, r.json()["detail"]) for what, r in refused.items()}
    assert reasons["missing"][0] == 422 and "consent is required" in reasons["missing"][1]
    assert reasons["unknown"][0] == 422 and "`self` or `obtained`" in reasons["unknown"][1]
    assert reasons["no attestation"][0] == 422 and "attestation" in reasons["no attestation"][1]
    assert reasons["long attestation"][0] == 422 and "longer than" in reasons["long attestation"][1]
    assert len(httpx.get(f"{base}/v1/identities").json()["identities"]) == before


def test_consent_is_shown_with_the_identity_and_every_trace_goes_with_its_deletion(
    identity_dir: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], tom_png: bytes, tmp_path: Path
) -> None:
    audit = tmp_path / "audit.log"
    settings = server_settings(
        identity_dir, access=AccessSettings(keys_file=tmp_path / "none.json", audit_log=str(audit))
    )
    with start_server(settings, pipeline_factory) as server:
        base, state = server.base_url, server.state
        kept = upload(base, tom_png, "tom.png").json()["id"]
        created = upload(base, tom_png, "ann.png", consent="obtained", attestation="Ann Lee, my colleague: in writing")
        assert created.status_code == 201, created.text
        body = created.json()
        identity = body["id"]
        consent = body["consent"]
        assert consent == {
            "statement": "obtained",
            "attestation": "Ann Lee, my colleague: in writing",
            "photo_sha256": hashlib.sha256(tom_png).hexdigest(),
            "owner": "local",
            "time": consent["time"],
        }
        assert abs(datetime.fromisoformat(consent["time"]) - datetime.fromisoformat(body["created"])) < timedelta(
            seconds=5
        )
        assert httpx.get(f"{base}/v1/identities/{identity}").json()["consent"] == consent
        listed = {i["id"]: i["consent"] for i in httpx.get(f"{base}/v1/identities").json()["identities"]}
        assert listed[identity] == consent and listed[kept]["statement"] == "self"

        # Prepared for a second model too, and cached: every one of those goes with the identity.
        other = PreparedSource("passthrough", "passthrough:128", np.zeros(4, np.float32))
        state.store.load_prepared(identity, other.model_key, "passthrough", lambda image, index: other)
        state.cache.put(identity, other.model_key, other)
        server.call(lambda: state.load_source(identity))
        cached = state.cache.keys()
        assert sum(key[0] == identity for key in cached) == 2
        assert len(list((identity_dir / identity / "prepared").iterdir())) == 2

        assert httpx.delete(f"{base}/v1/identities/{identity}").status_code == 204
        leftovers = [str(p.relative_to(identity_dir)) for p in identity_dir.rglob("*")]
        assert not any(identity in path or path.startswith((".trash", ".tmp")) for path in leftovers), leftovers
        assert kept in leftovers
        cached = state.cache.keys()
        assert all(key[0] != identity for key in cached)
        assert httpx.get(f"{base}/v1/identities/{identity}/thumbnail").status_code == 404
    events = {e["event"]: e for e in map(json.loads, audit.read_text().splitlines()) if e.get("identity") == identity}
    assert events["identity_created"]["consent"] == consent
    deleted = events["identity_deleted"]
    assert (deleted["by"], deleted["owner"], deleted["photo_sha256"]) == ("local", "local", consent["photo_sha256"])


def test_an_identity_stored_before_consent_existed_lists_without_one_and_stays_usable(
    server: RunningServer, tom_png: bytes
) -> None:
    state = server.state
    template = state.store.get(upload(server.base_url, tom_png, "tom.png").json()["id"])
    assert state.pipeline is not None
    legacy = state.store.create(
        name="from before consent",
        photo=tom_png,
        format=template.format,
        width=template.width,
        height=template.height,
        faces=1,
        face_index=None,
        thumbnail=state.store.thumbnail(template.id),
        prepared=state.pipeline.prepare_source(decode_image(tom_png, 10**8)[0], "largest"),
        owner="local",
    )
    meta = state.store.root / legacy.id / "meta.json"
    raw = json.loads(meta.read_text())
    del raw["consent"]  # written before the field existed
    meta.write_text(json.dumps(raw))
    listed = {i["id"]: i for i in httpx.get(f"{server.base_url}/v1/identities").json()["identities"]}
    assert listed[legacy.id]["consent"] is None
    assert httpx.get(f"{server.base_url}/v1/identities/{legacy.id}").json()["consent"] is None
    source = server.call(lambda: state.load_source(legacy.id))
    assert source.model_key == "classic:256"
    assert httpx.delete(f"{server.base_url}/v1/identities/{legacy.id}").status_code == 204


def test_an_upload_with_closed_eyes_is_answered_with_the_reason(
    identity_dir: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], t1_jpeg: bytes
) -> None:
    """The mesh engine's server judges the eyes of each upload: t1.jpg's right-most face has them shut, its
    left-most has them open; both are stored all the same."""
    mesh = server_settings(identity_dir, pipeline=PipelineSettings(engine="mesh", threads=1))
    with start_server(mesh, pipeline_factory) as running:
        state = running.state
        assert state.pipeline is not None and state.eyes is not None
        faces = state.pipeline.detector.process([decode_image(t1_jpeg, 10**8)[0]])[0]
        by_x = sorted(range(len(faces)), key=lambda i: float(faces[i].box[0]))
        shut = upload(running.base_url, t1_jpeg, "group.jpg", face_index=str(by_x[-1]))
        assert shut.status_code == 201, shut.text
        assert [w for w in shut.json()["warnings"] if w.startswith("the eyes are closed in this photo")]
        open_eyes = upload(running.base_url, t1_jpeg, "group.jpg", face_index=str(by_x[0]))
        assert open_eyes.status_code == 201, open_eyes.text
        assert open_eyes.json()["warnings"] == []
