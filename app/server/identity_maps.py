"""Identity maps in the API: who gets which identity, in a session or a stream.

A map entry names a *person* (an identity whose photos show who to look for: "me", the streamer) and the
*identity* swapped onto that person; faces that match no person are left as they are. Sessions take the map in
the query (`map=PERSON:IDENTITY`, repeated), streams in their JSON body; `PATCH` replaces it live. Both ids of
every entry must be identities the principal may use, as for a plain `identity`.
"""

from typing import Annotated, Self

from fastapi import HTTPException
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from app.auth.principal import Principal
from app.errors import UserError
from app.pipeline.identity_map import FaceSources, IdentityMap, MapEntry, MappedFaces
from app.pipeline.swap import PreparedSource
from app.server.owned import check_owned_identity, owned_source
from app.server.state import ServerState

MAX_MAP_ENTRIES = 16
IdentityRef = Annotated[str, Field(min_length=1, max_length=64)]
# The cosine similarity a face needs to a person. Below 0.3 even ArcFace takes different people for one (dlib
# puts any two faces above 0.8), so a lower bar would swap strangers: refused rather than clamped.
MIN_MATCH_THRESHOLD = 0.3
MatchThreshold = Annotated[float, Field(ge=MIN_MATCH_THRESHOLD, le=1.0)]


class MapEntryIn(BaseModel):
    person: IdentityRef  # whose face: an identity whose photos show that person
    identity: IdentityRef  # what that face becomes


def parse_query_map(values: list[str]) -> list[MapEntryIn]:
    """`PERSON:IDENTITY` query values as entries; 422 with the value's position otherwise."""
    if len(values) > MAX_MAP_ENTRIES:
        raise HTTPException(422, f"an identity map has at most {MAX_MAP_ENTRIES} entries")
    entries = []
    for number, value in enumerate(values, 1):
        person, sep, identity = value.partition(":")
        if not sep or not person.strip() or not identity.strip():
            raise HTTPException(422, f"map entry {number} must be PERSON_ID:IDENTITY_ID, got {value[:80]!r}")
        try:
            entries.append(MapEntryIn(person=person.strip(), identity=identity.strip()))
        except ValidationError:
            raise HTTPException(422, f"map entry {number}: identity ids are 1 to 64 characters") from None
    return entries


def choice_problem(identity: str | None, entries: list[MapEntryIn] | None, threshold: float | None) -> str | None:
    """Why the choice is not exactly one of `identity` and a non-empty map (a threshold only with a map)."""
    if entries is not None and not entries:
        return "the identity map is empty: give at least one PERSON:IDENTITY entry"
    if identity is None and entries is None:
        return "give `identity` (every face) or `map` (faces by person)"
    if identity is not None and entries is not None:
        return "give either `identity` (every face) or `map` (faces by person), not both"
    if threshold is not None and entries is None:
        return "`match_threshold` applies to an identity map only"
    return None


def check_choice(identity: str | None, entries: list[MapEntryIn] | None, threshold: float | None) -> None:
    problem = choice_problem(identity, entries, threshold)
    if problem is not None:
        raise HTTPException(422, problem)


class SourceChoice(BaseModel):
    """`identity` for every face, or `map` by person (with its `match_threshold`): exactly one of the two."""

    identity: IdentityRef | None = None
    map: list[MapEntryIn] | None = Field(None, max_length=MAX_MAP_ENTRIES)
    match_threshold: MatchThreshold | None = None

    @field_validator("match_threshold", mode="before")
    @classmethod
    def _a_number(cls, value: object) -> object:
        if isinstance(value, bool):  # JSON true would otherwise read as 1.0
            raise ValueError("match_threshold must be a number")
        return value

    @model_validator(mode="after")
    def _one_choice(self) -> Self:
        problem = choice_problem(self.identity, self.map, self.match_threshold)
        if problem is not None:
            raise ValueError(problem)
        return self


async def build_map(
    state: ServerState, principal: Principal, entries: list[MapEntryIn], threshold: float | None
) -> IdentityMap:
    """The map with every person's reference embedding and every identity prepared; 404 for an identity the
    principal may not use, 503 when no face embedder can run here."""
    try:
        embedder = await state.embedder()
    except UserError as exc:
        raise HTTPException(503, f"identity maps are unavailable here: {exc}") from None
    built = []
    for entry in entries:
        await check_owned_identity(state, principal, entry.person)
        source = await owned_source(state, principal, entry.identity)
        reference = await state.load_reference(entry.person)
        built.append(MapEntry(entry.person, entry.identity, reference, source))
    if threshold is None:
        threshold = state.settings.pipeline.match_threshold
    return IdentityMap(tuple(built), embedder.same_person if threshold is None else threshold, embedder.key)


async def sources_for(
    state: ServerState,
    principal: Principal,
    current: FaceSources | None,
    identity: str | None,
    entries: list[MapEntryIn] | None,
    threshold: float | None,
) -> tuple[str, FaceSources]:
    """The identity to report (a map's first entry's) and what to swap in: `current` keeps its faces' embeddings
    when it was a map already, so a new map applies from the next frame without embedding anyone again."""
    check_choice(identity, entries, threshold)
    if entries is None:
        assert identity is not None
        source: PreparedSource = await owned_source(state, principal, identity)
        return identity, source
    identity_map = await build_map(state, principal, entries, threshold)
    if isinstance(current, MappedFaces):
        current.use_map(identity_map)
        return entries[0].identity, current
    return entries[0].identity, MappedFaces(identity_map, await state.embedder(), state.embed_executor)
