"""The identity upload use-case: checked photos in, a stored identity out, within its owner's quota. Blocking: run
it once on the control pool."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.identity.consent import Consent, ConsentStatement
from app.identity.enrol import Enrolment, Upload, enrol_photos
from app.identity.eye_state import EyeOpenness
from app.identity.quota import IdentityQuota, Usage
from app.identity.store import Identity, IdentityStore
from app.pipeline.pipeline import FramePipeline
from app.pipeline.types import Image


@dataclass(frozen=True)
class IdentityUpload:
    """What the uploader sent, parsed: 1-10 photos of one person and what they said about them."""

    owner: str
    name: str
    photos: Sequence[Upload]
    face_index: int | None
    consent: ConsentStatement


@dataclass(frozen=True)
class Created:
    identity: Identity
    enrolment: Enrolment


class IdentityUploads:
    """The upload use-case of one server: its store, its per-owner quota and its photo size limit, fixed at
    start-up, so that a request hands over only what it brings (the photos) and what loads later (the eye judge,
    the content gate)."""

    def __init__(self, store: IdentityStore, quota: IdentityQuota, max_image_pixels: int) -> None:
        self.store = store
        self.quota = quota
        self.max_image_pixels = max_image_pixels

    def usage(self, owner: str) -> Usage:
        """What `owner` holds: the identities it created."""
        return self.store.usage(owner)

    def add(
        self,
        upload: IdentityUpload,
        pipeline: FramePipeline,
        eyes: EyeOpenness | None,
        screen: Callable[[Image], None] | None = None,
    ) -> Created:
        """Enrol the photos and store the identity. `QuotaExceeded` when the owner's quota has no room, checked
        before the enrolment for the count (no costly work for an owner already at the limit) and again, with the
        bytes it adds, as one step with the creation. `screen`: the content gate on each decoded photo; a flagged
        one raises `ContentRefused` before anything is stored."""
        owner = upload.owner
        self.quota.check(self.usage(owner))
        enrolment = enrol_photos(pipeline, upload.photos, self.max_image_pixels, upload.face_index, eyes, screen)
        prepared = enrolment.prepared
        adding = enrolment.stored_bytes + len(enrolment.thumbnail) + prepared.nbytes
        first, *more = (photo.data for photo in upload.photos)
        consent = Consent.record(upload.consent, upload=first, owner=owner, more_uploads=more)

        def create() -> Identity:
            return self.store.create(
                name=upload.name,
                photo=enrolment.stored,
                format="png",
                width=enrolment.info.width,
                height=enrolment.info.height,
                faces=enrolment.faces,
                face_index=upload.face_index,
                thumbnail=enrolment.thumbnail,
                prepared=prepared,
                owner=owner,
                consent=consent,
                extra_photos=enrolment.extra_stored,
            )

        return Created(self.quota.create_within(lambda: self.usage(owner), adding, create), enrolment)
