"""Identities: upload a face photo once, use it in any number of sessions and streams."""

import asyncio
import functools
import logging
import re
from pathlib import PurePath
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Request, Response
from pydantic import BaseModel, field_serializer
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from app.auth.access import Access
from app.auth.guard import AccessDep, IdentitiesRead, IdentitiesWrite, client_address
from app.auth.principal import Principal
from app.content.check import ContentRefused
from app.identity.consent import Consent, ConsentStatement
from app.identity.enrol import Upload
from app.identity.images import sniff_format
from app.identity.store import Identity, IdentityNotFound, IdentityUnreadable, StoreFull
from app.identity.upload import IdentityUpload
from app.identity.validate import MAX_PHOTOS
from app.server.deps import PipelineDep, RevocationDep, StateDep, StoreDep
from app.server.limits import capped_stream, media_type

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/identities", tags=["identities"])

MULTIPART_OVERHEAD = 64 * 1024
MAX_NAME = 100
MAX_FACE_INDEX = 999  # far above the detector's 64 faces per image; longer input is not echoed back

IdentityId = Annotated[str, Path(min_length=1, max_length=64)]


class IdentityOut(BaseModel):
    id: str
    name: str
    faces: int
    face_index: int | None
    model_key: str | None
    created: str
    width: int
    height: int
    warnings: list[str] = []  # why this photo may swap badly (open mouth, closed eyes); given on upload
    consent: Consent | None  # the uploader's statement; null for identities stored before consent was recorded
    photos: int = 1  # photos it was enrolled from
    # Given on upload: the photo (0-based, in upload order) the engine uses, or null when it uses all of them
    # (inswapper: their mean embedding).
    photo_used: int | None = None

    @field_serializer("consent")
    def _consent(self, consent: Consent | None) -> dict[str, Any] | None:
        return consent.to_json() if consent is not None else None

    @classmethod
    def of(
        cls,
        identity: Identity,
        model_key: str | None,
        warnings: list[str] | None = None,
        photo_used: int | None = None,
    ) -> "IdentityOut":
        return cls(
            id=identity.id,
            name=identity.name,
            faces=identity.faces,
            face_index=identity.face_index,
            model_key=model_key,
            created=identity.created,
            width=identity.width,
            height=identity.height,
            warnings=warnings or [],
            consent=identity.consent,
            photos=identity.photos,
            photo_used=photo_used,
        )


class IdentityList(BaseModel):
    identities: list[IdentityOut]


def upload_limit(max_upload_bytes: int) -> int:
    return max_upload_bytes + MULTIPART_OVERHEAD


def _clean_name(raw: str | None, filename: str | None) -> str:
    name = raw if raw is not None else (PurePath(filename).stem if filename else "")
    name = re.sub(r"[\x00-\x1f\x7f]+", " ", name).strip()
    if len(name) > MAX_NAME:
        raise HTTPException(422, f"name is longer than {MAX_NAME} characters")
    return name or "identity"


def _parse_face_index(raw: str | None) -> int | None:
    if raw is None or raw.strip() == "":
        return None
    text = raw.strip()
    if not text.isascii() or not text.isdigit():
        raise HTTPException(422, f"face_index must be a whole number from 0 to {MAX_FACE_INDEX}, got {text[:20]!r}")
    if len(text) > len(str(MAX_FACE_INDEX)) or int(text) > MAX_FACE_INDEX:
        raise HTTPException(422, f"face_index must be at most {MAX_FACE_INDEX}")
    return int(text)


@router.post("", status_code=201, response_model=IdentityOut)
async def create_identity(
    request: Request, principal: IdentitiesWrite, state: StateDep, pipeline: PipelineDep, access: AccessDep
) -> IdentityOut:
    """Multipart form: `image` (JPEG, PNG or WebP; repeat it for up to 10 photos of the same person, together
    within the upload limit), `consent` (`self`: the photos show you, or `obtained`: they show someone who agreed,
    with `attestation` saying who and how), optional `face_index`, optional `name`."""
    settings = state.settings
    state.rate_limiter.hit("uploads", principal.id, client_address(request))
    upload = await _read_upload(request, principal.id, settings.max_upload_bytes)
    screen = state.content.screen if state.content is not None else None
    try:
        created = await asyncio.get_running_loop().run_in_executor(
            state.control_executor, functools.partial(state.uploads.add, upload, pipeline, state.eyes, screen)
        )
    except ContentRefused as exc:
        raise _content_refused(exc, principal, access) from None
    except StoreFull as exc:
        state.metrics.store_full.labels("identities").inc()
        log.error("identity upload refused: no room on the disk of %s (%s)", state.store.root, exc.__cause__)
        raise
    identity, enrolment = created.identity, created.enrolment
    state.cache.put(identity.id, enrolment.prepared.model_key, enrolment.prepared)
    access.audit.event(
        "identity_created",
        identity=identity.id,
        owner=principal.id,
        consent=identity.consent.to_json() if identity.consent else None,
    )
    return IdentityOut.of(identity, enrolment.prepared.model_key, enrolment.warnings, enrolment.photo_used)


def _content_refused(exc: ContentRefused, principal: Principal, access: Access) -> HTTPException:
    """422 for a photo the content gate flagged, audited; only admin hears the score."""
    access.audit.event(
        "identity_refused",
        owner=principal.id,
        reason="content",
        photo=exc.photo,
        score=round(exc.score, 4),
        threshold=exc.threshold,
    )
    which = "the photo" if exc.photo is None else f"photo {exc.photo}"
    reason = f"{which} was refused by this server's content policy (sexually explicit material is not accepted)"
    if principal.is_admin:
        reason += f"; score {exc.score:.4f}, threshold {exc.threshold}"
    return HTTPException(422, reason)


async def _read_upload(request: Request, owner: str, max_upload_bytes: int) -> IdentityUpload:
    """The multipart form, checked field by field; every refusal is an HTTPException with the reason."""
    if media_type(request) != "multipart/form-data":
        raise HTTPException(415, "send multipart/form-data with an `image` field")
    parser = MultiPartParser(
        request.headers,
        capped_stream(request, upload_limit(max_upload_bytes)),
        max_files=MAX_PHOTOS,
        max_fields=6,
        max_part_size=4096,
    )
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        if "Too many files" in str(exc):
            raise HTTPException(422, f"an identity takes at most {MAX_PHOTOS} photos (`image` fields)") from None
        raise HTTPException(400, f"malformed multipart body: {exc}") from None
    try:
        fields = form.getlist("image")
        files = [f for f in fields if isinstance(f, UploadFile)]
        if not files or len(files) != len(fields):
            raise HTTPException(422, "the form has no `image` file field" if not files else "`image` must be files")
        raw_name = form.get("name")
        raw_index = form.get("face_index")
        if isinstance(raw_name, UploadFile) or isinstance(raw_index, UploadFile):
            raise HTTPException(422, "`name` and `face_index` must be plain form fields")
        raw_consent, raw_attestation = form.get("consent"), form.get("attestation")
        if isinstance(raw_consent, UploadFile) or isinstance(raw_attestation, UploadFile):
            raise HTTPException(422, "`consent` and `attestation` must be plain form fields")
        face_index = _parse_face_index(raw_index)
        name = _clean_name(raw_name, files[0].filename)
        consent = ConsentStatement.parse(raw_consent, raw_attestation)
        photos = [await _read_photo(f, max_upload_bytes, n, len(files)) for n, f in enumerate(files, 1)]
    finally:
        await form.close()
    if sum(len(u.data) for u in photos) > max_upload_bytes:
        raise HTTPException(413, f"the photos are over the limit of {max_upload_bytes} bytes together")
    return IdentityUpload(owner, name, photos, face_index, consent)


async def _read_photo(upload: UploadFile, limit: int, number: int, count: int) -> Upload:
    """One `image` part, checked for size, emptiness and type; the reason names the photo when there are several."""
    which = "image" if count == 1 else f"photo {number}" + (f" ({upload.filename[:60]})" if upload.filename else "")
    if upload.size is not None and upload.size > limit:
        raise HTTPException(413, f"{which} is over the limit of {limit} bytes")
    data = await upload.read(limit + 1)
    if len(data) > limit:
        raise HTTPException(413, f"{which} is over the limit of {limit} bytes")
    if not data:
        raise HTTPException(422, f"the {which} field is empty" if count == 1 else f"{which} is empty")
    if sniff_format(data) is None:
        prefix = "" if count == 1 else f"{which}: "
        raise HTTPException(415, f"{prefix}unsupported image type: send a JPEG, PNG or WebP file")
    return Upload(data, upload.filename)


def _model_key(state: StateDep) -> str | None:
    return state.pipeline.engine.model_key if state.pipeline is not None else None


@router.get("", response_model=IdentityList)
async def list_identities(state: StateDep, store: StoreDep, principal: IdentitiesRead) -> IdentityList:
    loop = asyncio.get_running_loop()
    found = await loop.run_in_executor(state.control_executor, store.list)
    key = _model_key(state)
    visible = [i for i in found if principal.can_see(i.owner) and i.id not in state.damaged]
    return IdentityList(identities=[IdentityOut.of(i, key) for i in visible])


async def _visible(state: StateDep, identity_id: str, principal: Principal) -> Identity | None:
    """The identity if this principal may see it; another owner's answers 404 like a missing one. None: damaged so
    that its owner cannot be read, which only admin hears of (everyone else gets 404)."""
    loop = asyncio.get_running_loop()
    try:
        identity = await loop.run_in_executor(state.control_executor, state.store.get, identity_id)
    except IdentityUnreadable:
        if not principal.is_admin:  # damaged on disk: whose it was cannot be read, so only admin hears of it
            raise IdentityNotFound(identity_id) from None
        return None
    if not principal.can_see(identity.owner):
        raise IdentityNotFound(identity_id)
    return identity


async def _get(state: StateDep, identity_id: str, principal: Principal) -> Identity:
    """A visible identity that is usable; a damaged one answers 409 with the reason."""
    identity = await _visible(state, identity_id, principal)
    state.check_usable(identity_id)
    if identity is None:  # damaged after the audit: the store's reason
        return await asyncio.get_running_loop().run_in_executor(state.control_executor, state.store.get, identity_id)
    return identity


@router.get("/{identity_id}", response_model=IdentityOut)
async def get_identity(identity_id: IdentityId, state: StateDep, principal: IdentitiesRead) -> IdentityOut:
    return IdentityOut.of(await _get(state, identity_id, principal), _model_key(state))


@router.get("/{identity_id}/thumbnail")
async def get_thumbnail(identity_id: IdentityId, state: StateDep, principal: IdentitiesRead) -> Response:
    await _get(state, identity_id, principal)
    loop = asyncio.get_running_loop()
    data = await loop.run_in_executor(state.control_executor, state.store.thumbnail, identity_id)
    return Response(data, media_type="image/jpeg", headers={"Cache-Control": "private, max-age=3600"})


@router.delete("/{identity_id}", status_code=204)
async def delete_identity(
    identity_id: IdentityId,
    state: StateDep,
    principal: IdentitiesWrite,
    access: AccessDep,
    revocation: RevocationDep,
) -> Response:
    """Deletes the identity (damaged ones too: photo, thumbnail, preparations, cached entries) and ends every live
    session and stream showing it before answering."""
    identity = await _visible(state, identity_id, principal)
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(state.control_executor, state.store.delete, identity_id)
    finally:
        state.cache.invalidate(identity_id)
        state.forget_damaged(identity_id)
    await revocation.identity_deleted(identity_id)
    access.audit.event(
        "identity_deleted",
        identity=identity_id,
        by=principal.id,
        owner=identity.owner if identity else None,
        photo_sha256=identity.consent.photo_sha256 if identity and identity.consent else None,
    )
    return Response(status_code=204)
