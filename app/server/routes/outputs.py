"""What sessions and streams answer alike: the caller's list, one output's stats, and switching its identity or
identity map live (`{"identity": ID}` or `{"map": [{"person": ID, "identity": ID}], "match_threshold": 0.92}`,
only the owner's identities; admin: any), from the next frame on."""

from enum import Enum
from typing import Annotated, Any

from fastapi import APIRouter, Path

from app.auth.guard import AccessDep
from app.auth.principal import Principal
from app.server.deps import StateDep
from app.server.identity_maps import SourceChoice, sources_for
from app.server.outputs import OUTPUT_KINDS, OutputKind

router = APIRouter()


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


for output_kind in OUTPUT_KINDS:
    add_routes(output_kind)
