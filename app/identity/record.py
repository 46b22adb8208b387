"""What the store records about one identity (its `meta.json`)."""

from dataclasses import dataclass

from app.identity.consent import Consent
from app.identity.images import FORMATS


@dataclass(frozen=True)
class Identity:
    id: str
    name: str
    created: str
    faces: int  # faces found in the photo
    face_index: int | None  # the face chosen, None when the photo had exactly one
    format: str
    width: int
    height: int
    # The principal that created it; None for identities stored before owners were recorded (admin only).
    owner: str | None = None
    # The uploader's consent statement; None for identities stored before consent was recorded.
    consent: Consent | None = None
    # Photos it was enrolled from (1-10); `faces`, `face_index`, `width` and `height` describe the first.
    photos: int = 1

    @property
    def image_file(self) -> str:
        return f"image.{self.format}"

    @property
    def image_files(self) -> list[str]:
        """Every photo's file, the first one first (`image.png`, then `image-2.png`, ...)."""
        return [self.image_file] + [f"image-{n}.{self.format}" for n in range(2, self.photos + 1)]

    @property
    def media_type(self) -> str:
        return FORMATS[self.format]
