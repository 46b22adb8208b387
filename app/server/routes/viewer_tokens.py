"""Viewer tokens for an output (a session's or a stream's): minted by its owner (or admin) for OBS's Browser
Source or any WHEP player, listed, and revoked (which ends the viewers opened with the token). The token is
shown once, in the answer to `POST`; the server keeps only its hash."""

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response

from app.auth.guard import AccessDep, client_address
from app.auth.principal import Principal
from app.server.deps import RevocationDep, StateDep
from app.server.outputs import OUTPUT_KINDS, OutputKind
from app.server.viewers import ViewerTokenNotFound

router = APIRouter(tags=["viewer tokens"])

TokenId = Annotated[str, Path(min_length=1, max_length=64)]


def add_routes(kind: OutputKind) -> None:
    OutputId = Annotated[str, Path(alias=kind.param, min_length=1, max_length=64)]
    User = Annotated[Principal, kind.user()]

    @router.post(kind.path("/viewer-tokens"), status_code=201, name=f"mint_{kind.singular}_viewer_token")
    async def mint(
        output_id: OutputId, request: Request, principal: User, access: AccessDep, state: StateDep
    ) -> dict[str, Any]:
        """A read-only token for this output's WHEP endpoint and viewer page (`view_url` goes into OBS)."""
        output = kind.owned(state, output_id, principal, access)
        state.rate_limiter.hit("credentials", principal.id, client_address(request))
        ownership = access.owners.of(output)
        owner = ownership.owner if ownership is not None else principal.id
        record, token = access.viewer_tokens.mint(kind.key(output.id), owner, principal)
        page = f"/view/{output.id}" if kind.singular == "session" else f"/view/{kind.singular}/{output.id}"
        return {
            **record.public(),
            "token": token,
            "view_url": f"{page}?token={token}",
            "whep_url": f"/v1/{kind.plural}/{output.id}/whep",
        }

    @router.get(kind.path("/viewer-tokens"), name=f"list_{kind.singular}_viewer_tokens")
    async def listing(output_id: OutputId, principal: User, access: AccessDep, state: StateDep) -> dict[str, Any]:
        output = kind.owned(state, output_id, principal, access)
        return {"viewer_tokens": [t.public() for t in access.viewer_tokens.of_output(kind.key(output.id))]}

    @router.delete(kind.path("/viewer-tokens/{token_id}"), status_code=204, name=f"revoke_{kind.singular}_viewer_token")
    async def revoke(
        output_id: OutputId,
        token_id: TokenId,
        principal: User,
        access: AccessDep,
        revocation: RevocationDep,
        state: StateDep,
    ) -> Response:
        """Revoke the token; the viewers opened with it end now."""
        output = kind.owned(state, output_id, principal, access)
        record = access.viewer_tokens.get(kind.key(output.id), token_id)
        if record is None:
            raise ViewerTokenNotFound(token_id)
        await revocation.revoke_viewer_token(record)
        return Response(status_code=204)


for output_kind in OUTPUT_KINDS:
    add_routes(output_kind)
