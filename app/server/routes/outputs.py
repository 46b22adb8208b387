"""What sessions and streams answer alike: the caller's list, one output's stats, switching its identity or
identity map live (`{"identity": ID}` or `{"map": [{"person": ID, "identity": ID}], "match_threshold": 0.92}`,
only the owner's identities; admin: any), and its live options (face-lost policy, occlusion,
mouth mask), from the next frame on."""

from enum import Enum
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path
from pydantic import BaseModel, ConfigDict, StrictBool

from app.auth.guard import AccessDep
from app.auth.principal import Principal
from app.errors import UserError
from app.names import FaceLostPolicy
from app.server.deps import StateDep
from app.server.identity_maps import SourceChoice, sources_for
from app.server.outputs import OUTPUT_KINDS, OutputKind

router = APIRouter()


class LiveOptions(BaseModel):
    """Options of one live output; each left out stays as it is. `on_face_lost`: what a swapped face the
    detector misses gets (`hold`: swapped where the tracker predicts it, then covered; `cover`: pixelated;
    `pass`: shown as it is); the server's `SWAPCAST_ON_FACE_LOST` is the default. `occlusion`: hands in front
    of the faces kept (true, the default where the server runs the stage) or faces pasted whole (false).
    `mouth_mask`: the target's own mouth (lips, teeth, tongue) kept in the swapped face (true) or swapped too
    (false); the server's `SWAPCAST_MOUTH_MASK` is the default. All are applied, or none (409)."""

    model_config = ConfigDict(extra="forbid")

    on_face_lost: FaceLostPolicy | None = None
    occlusion: StrictBool | None = None  # JSON true/false only
    mouth_mask: StrictBool | None = None


def add_routes(kind: OutputKind) -> None:
    OutputId = Annotated[str, Path(alias=kind.param, min_length=1, max_length=64)]
    User = Annotated[Principal, kind.user()]
    tags: list[str | Enum] = [kind.plural]

    @router.get(f"/v1/{kind.plural}", tags=tags, name=f"list_{kind.plural}")
    async def listing(principal: User, access: AccessDep, state: StateDep) -> dict[str, list[dict[str, Any]]]:
        return {kind.plural: [o.stats() for o in kind.every(state) if access.owners.visible(principal, o)]}

    @router.get(kind.path(), tags=tags, name=f"get_{kind.singular}")
    async def read(output_id: OutputId, principal: User, access: AccessDep, state: StateDep) -> dict[str, Any]:
        return kind.owned(state, output_id, principal, access).stats()

    @router.patch(kind.path(), tags=tags, name=f"switch_{kind.singular}")
    async def switch(
        output_id: OutputId, change: SourceChoice, principal: User, access: AccessDep, state: StateDep
    ) -> dict[str, Any]:
        """Switch to another identity, or identity map, of the owner's, from the next frame on."""
        output = kind.owned(state, output_id, principal, access)
        chosen, source = await sources_for(
            state, principal, output.source, change.identity, change.map, change.match_threshold
        )
        output.switch(chosen, source)
        return output.stats()

    @router.patch(kind.path("/options"), tags=tags, name=f"set_{kind.singular}_options")
    async def set_options(
        output_id: OutputId, options: LiveOptions, principal: User, access: AccessDep, state: StateDep
    ) -> dict[str, Any]:
        """Change the output's live options (its owner or admin), from the next frame on; 409 (and nothing
        changed) for occlusion or the mouth mask where the server cannot have it."""
        output = kind.owned(state, output_id, principal, access)
        try:
            output.core.set_options(
                on_face_lost=options.on_face_lost, occlusion=options.occlusion, mouth_mask=options.mouth_mask
            )
        except UserError as exc:
            raise HTTPException(409, str(exc)) from None
        return output.stats()


for output_kind in OUTPUT_KINDS:
    add_routes(output_kind)
