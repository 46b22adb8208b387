"""Identities enrolled from several photos over HTTP: stored photo by photo with a consent hash for each, prepared
from the chosen photo (classic) or the mean embedding (inswapper) again after a restart, audited like one-photo
identities; too many photos or a photo without a face is refused with the reason and nothing is stored."""

import hashlib
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.identity.images import decode_image
from app.identity.photo_choice import SourcePhoto, prepare_from_photos
from app.pipeline.pipeline import FramePipeline
from app.pipeline.swap import InswapperEngine
from app.pipeline.types import Image
from app.settings import PipelineSettings
from tests.identity.test_photo_choice import darker, turned
from tests.server.harness import PAGE_HEADERS, SELF_CONSENT, RunningServer, encode, server_settings, start_server

Factory = Callable[[PipelineSettings], FramePipeline]
INSWAPPER = PipelineSettings(
    engine="inswapper", swapper_model="reference_swapper_narrow", recognizer_model="reference_recognizer"
)


def upload_photos(base_url: str, photos: list[tuple[str, bytes]], **fields: str) -> httpx.Response:
    return httpx.post(
        f"{base_url}/v1/identities",
        files=[("image", (name, data)) for name, data in photos],
        data={**SELF_CONSENT, **fields},
        headers=PAGE_HEADERS,
        timeout=60,
    )


@pytest.fixture(scope="module")
def three_photos(astronaut: Image, local_pipeline: FramePipeline) -> list[tuple[str, bytes]]:
    """The same person turned, dark, and frontal and well lit (the one the texture engines should use)."""
    (faces,) = local_pipeline.detector.process([astronaut])
    nose_x = float(max(faces, key=lambda f: f.area).landmarks[2][0])
    images = [turned(astronaut, nose_x), darker(astronaut), astronaut]
    return [(f"{name}.png", encode(image)) for name, image in zip(("turned", "dark", "good"), images, strict=True)]


def source_photos(pipeline: FramePipeline, photos: list[tuple[str, bytes]]) -> list[SourcePhoto]:
    images = [decode_image(data, 10**8)[0] for _, data in photos]
    return [SourcePhoto(image, pipeline.detector.process([image])[0][0]) for image in images]


def prepared_now(server: RunningServer, identity: str) -> np.ndarray:
    async def load() -> np.ndarray:
        return (await server.state.load_source(identity)).data

    return server.call(load, timeout=60)


def forget_preparations(identity_dir: Path, identity: str) -> None:
    """Drop what was prepared at upload, so a restart prepares again from the stored photos."""
    for path in (identity_dir / identity / "prepared").glob("*.npy"):
        path.unlink()


def test_three_photos_are_stored_and_the_chosen_one_is_prepared_again_after_a_restart(
    identity_dir: Path, pipeline_factory: Factory, three_photos: list[tuple[str, bytes]]
) -> None:
    settings = server_settings(identity_dir)
    with start_server(settings, pipeline_factory) as server:
        created = upload_photos(server.base_url, three_photos, name="astronaut")
        assert created.status_code == 201, created.text
        body = created.json()
        assert (body["photos"], body["photo_used"]) == (3, 2)
        assert body["consent"]["photos_sha256"] == [hashlib.sha256(data).hexdigest() for _, data in three_photos]
        assert body["consent"]["photo_sha256"] == hashlib.sha256(three_photos[0][1]).hexdigest()
        identity = body["id"]
        assert sorted(p.name for p in (identity_dir / identity).glob("image*")) == [
            "image-2.png",
            "image-3.png",
            "image.png",
        ]
        pipeline = server.state.pipeline
        assert pipeline is not None
        expected, used = prepare_from_photos(pipeline.engine, source_photos(pipeline, three_photos))
        assert used == 2
        assert np.array_equal(prepared_now(server, identity), expected.data)

    forget_preparations(identity_dir, identity)
    with start_server(settings, pipeline_factory) as server:
        assert server.state.damaged == {}
        again = httpx.get(f"{server.base_url}/v1/identities/{identity}").json()
        assert again["photos"] == 3
        assert np.array_equal(prepared_now(server, identity), expected.data)

    (identity_dir / identity / "image-2.png").unlink()
    with start_server(settings, pipeline_factory) as server:
        assert server.state.damaged == {identity: "photo 2 of 3 is missing or empty"}
        refused = httpx.get(f"{server.base_url}/v1/identities/{identity}")
        assert refused.status_code == 409 and "photo 2 of 3" in refused.json()["detail"]


def test_inswapper_uses_the_mean_embedding_of_the_photos_after_a_restart(
    identity_dir: Path, pipeline_factory: Factory, three_photos: list[tuple[str, bytes]]
) -> None:
    settings = server_settings(identity_dir, pipeline=INSWAPPER)
    with start_server(settings, pipeline_factory) as server:
        created = upload_photos(server.base_url, three_photos)
        assert created.status_code == 201, created.text
        assert (created.json()["photos"], created.json()["photo_used"]) == (3, None)
        identity = created.json()["id"]
        pipeline = server.state.pipeline
        assert pipeline is not None
        photos = source_photos(pipeline, three_photos)
        engine = pipeline.engine
        assert isinstance(engine, InswapperEngine)
        mean = np.mean([engine.recognizer.embed(p.image, p.face) for p in photos], axis=0)
        expected = engine.latent(mean / np.linalg.norm(mean))
        np.testing.assert_allclose(prepared_now(server, identity), expected, atol=1e-6)

    forget_preparations(identity_dir, identity)
    with start_server(settings, pipeline_factory) as server:
        np.testing.assert_allclose(prepared_now(server, identity), expected, atol=1e-6)


def test_eleven_photos_or_one_without_a_face_are_refused_with_the_reason_and_nothing_is_stored(
    server: RunningServer, three_photos: list[tuple[str, bytes]]
) -> None:
    before = len(httpx.get(f"{server.base_url}/v1/identities").json()["identities"])
    good = three_photos[2][1]

    too_many = upload_photos(server.base_url, [(f"p{n}.png", good) for n in range(11)])
    assert too_many.status_code == 422, too_many.text
    assert "at most 10 photos" in too_many.json()["detail"]

    blank = encode(np.full((240, 320, 3), 128, np.uint8))
    no_face = upload_photos(server.base_url, [("good.png", good), ("wall.png", blank), ("good2.png", good)])
    assert no_face.status_code == 422, no_face.text
    assert "photo 2 (wall.png)" in no_face.json()["detail"] and "no face" in no_face.json()["detail"]

    not_an_image = upload_photos(server.base_url, [("good.png", good), ("notes.txt", b"hello")])
    assert not_an_image.status_code == 415 and "photo 2 (notes.txt)" in not_an_image.json()["detail"]

    assert len(httpx.get(f"{server.base_url}/v1/identities").json()["identities"]) == before
    ten = upload_photos(server.base_url, [(f"p{n}.png", good) for n in range(10)])
    assert ten.status_code == 201 and ten.json()["photos"] == 10
    assert httpx.delete(f"{server.base_url}/v1/identities/{ten.json()['id']}").status_code == 204
