"""Hostile uploads: what is stored is a re-encoding of the pixels, decoding is bounded, thin strips and 16-bit
greyscale photos are handled, and error texts carry no internals."""

import io
import threading
from pathlib import Path

import cv2
import httpx
import numpy as np
from PIL import Image as PilImage

from app.identity.images import MAX_SIDE, decode_image, decode_slots
from app.media.clips import load_sample
from tests.server.harness import RunningServer, encode, upload


def _stored_photo(server: RunningServer, identity: str) -> Path:
    (photo,) = (server.state.settings.identity_dir / identity).glob("image.*")
    return photo


def test_the_store_keeps_re_encoded_pixels_never_the_uploaded_bytes(server: RunningServer) -> None:
    """A photo with EXIF and a 1 MB trailer (a polyglot payload) is stored as a plain PNG of its pixels."""
    rgb = np.ascontiguousarray(load_sample("tom_hanks")[:, :, ::-1])
    buffer = io.BytesIO()
    exif = PilImage.Exif()
    exif[0x010F] = "SecretCameraMaker"
    PilImage.fromarray(rgb).save(buffer, format="JPEG", quality=92, exif=exif.tobytes())
    trailer = b"PK\x03\x04" + b"\xab" * 1_000_000
    created = upload(server.base_url, buffer.getvalue() + trailer, "tom.jpg")
    assert created.status_code == 201, created.text
    photo = _stored_photo(server, created.json()["id"])
    stored = photo.read_bytes()
    assert photo.name == "image.png" and stored.startswith(b"\x89PNG\r\n\x1a\n")
    assert trailer[:64] not in stored and b"SecretCameraMaker" not in stored
    assert len(stored) < len(buffer.getvalue()) + len(trailer) // 2
    pixels = cv2.imdecode(np.frombuffer(stored, np.uint8), cv2.IMREAD_COLOR)
    assert pixels.shape == rgb.shape


def test_large_photos_decode_reduced_to_the_long_side_limit() -> None:
    """A 3000x2000 JPEG and PNG come out with a long side of MAX_SIDE; the JPEG decodes reduced in the DCT."""
    face = load_sample("tom_hanks")
    big = cv2.resize(face, (3000, 2000), interpolation=cv2.INTER_LINEAR)
    for ext in (".jpg", ".png"):
        image, info = decode_image(encode(big, ext), 16_000_000)
        assert (info.width, info.height) == (MAX_SIDE, round(2000 * MAX_SIDE / 3000))
        assert image.shape[:2] == (info.height, info.width)
        small = cv2.resize(big, (info.width, info.height), interpolation=cv2.INTER_AREA)
        assert float(np.mean(np.abs(image.astype(np.int16) - small))) < 6.0


def test_thin_strips_are_refused_with_a_reason(server: RunningServer) -> None:
    """A 1280x1 PNG made the detector resize to a width of 0 (a 500): now 422 before decoding."""
    for shape in ((1, 1280, 3), (1280, 1, 3), (40, 1280, 3)):
        strip = np.full(shape, 128, np.uint8)
        response = upload(server.base_url, encode(strip, ".png"), "strip.png")
        assert response.status_code == 422, response.text
        assert "long side may be at most" in response.json()["detail"]


def test_sixteen_bit_greyscale_photos_are_scaled_not_clipped(server: RunningServer) -> None:
    grey = cv2.cvtColor(load_sample("tom_hanks"), cv2.COLOR_BGR2GRAY)
    wide = grey.astype(np.uint16) * 257  # the same picture over the full 16-bit range
    image, _ = decode_image(encode(wide, ".png"), 16_000_000)
    assert float(np.mean(image[:, :, 0] == 255)) < 0.05
    assert int(np.max(np.abs(image[:, :, 0].astype(np.int16) - grey))) <= 1
    created = upload(server.base_url, encode(wide, ".png"), "grey16.png")
    assert created.status_code == 201, created.text


def test_error_texts_show_no_internals_and_cut_what_they_echo(server: RunningServer, tom_png: bytes) -> None:
    broken = upload(server.base_url, b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "broken.png")
    assert broken.status_code == 400
    assert " at 0x" not in broken.text and "BytesIO" not in broken.text
    huge_index = upload(server.base_url, tom_png, "tom.png", face_index="4" * 400)
    assert huge_index.status_code == 422
    assert "4" * 30 not in huge_index.text and len(huge_index.json()["detail"]) < 200
    wordy_index = upload(server.base_url, tom_png, "tom.png", face_index="x" * 400)
    assert wordy_index.status_code == 422 and "x" * 30 not in wordy_index.text


def test_server_info_and_refusal_name_the_lower_pixel_limit(server: RunningServer) -> None:
    limits = httpx.get(f"{server.base_url}/v1/server").json()["limits"]
    assert limits["max_image_pixels"] == 16_000_000
    from tests.server.images import png_claiming

    refused = upload(server.base_url, png_claiming(6300, 6300), "bomb.png")
    assert refused.status_code == 413 and "16000000" in refused.json()["detail"]


def test_decodes_wait_for_a_free_slot() -> None:
    """With every decode slot taken, a decode waits; it runs once a slot frees."""
    data = encode(load_sample("tom_hanks"), ".png")
    decode_slots.resize(1)
    try:
        finished = threading.Event()
        worker = threading.Thread(target=lambda: (decode_image(data, 16_000_000), finished.set()))
        with decode_slots:
            worker.start()
            assert not finished.wait(0.5)
        assert finished.wait(10)
        worker.join()
    finally:
        decode_slots.resize(2)
