"""The OpenAPI document describes the bodies the routes really take and give, so a schema fuzzer exercises them:
the multipart identity upload, SDP offers and answers, the JPEG thumbnail, Prometheus text, and one error shape,
`{"detail": str}`, for every error (FastAPI documents a list of validation errors that this server never sends).

`/docs`, the explorer over that document, is Swagger UI from this server's own files: FastAPI's default page loads
it from a CDN with an inline script, which the pages' Content-Security-Policy (`app.auth.browser`) rules out.
"""

from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse
from starlette.requests import Request

# Swagger UI's bundle and stylesheet as a Python package ships them, served under /static beside the page's files.
SWAGGER_UI_FILES = ("fastapi_offline", "static")

ERROR_SCHEMA: dict[str, Any] = {
    "title": "Error",
    "type": "object",
    "properties": {"detail": {"type": "string"}},
    "required": ["detail"],
}
_ERROR_REF = {"$ref": "#/components/schemas/Error"}
_ERROR_RESPONSE = {"description": "what was wrong", "content": {"application/json": {"schema": _ERROR_REF}}}
_SDP = {"schema": {"type": "string"}}

IDENTITY_UPLOAD: dict[str, Any] = {
    "required": True,
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "properties": {
                    "image": {"type": "string", "format": "binary", "description": "JPEG, PNG or WebP"},
                    "face_index": {"type": "integer", "minimum": 0, "maximum": 999},
                    "name": {"type": "string", "maxLength": 100},
                    "consent": {
                        "type": "string",
                        "enum": ["self", "obtained"],
                        "description": "self: the photo shows you; obtained: it shows someone who agreed",
                    },
                    "attestation": {
                        "type": "string",
                        "maxLength": 1000,
                        "description": "who the person is and how they agreed; required with consent=obtained",
                    },
                },
                "required": ["image", "consent"],
            },
            "encoding": {"image": {"contentType": "image/jpeg, image/png, image/webp"}},
        }
    },
}


def _not_ready_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"status": {"type": "string"}, "reason": {"type": "string"}},
        "required": ["status"],
    }


def describe_real_bodies(app: FastAPI) -> None:
    """Replace `app.openapi` with one that documents the real bodies and error shape."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components["Error"] = ERROR_SCHEMA
        components["HTTPValidationError"] = ERROR_SCHEMA  # validation errors are answered as one string too
        components.pop("ValidationError", None)
        paths = schema["paths"]
        for item in paths.values():
            for operation in item.values():
                operation.setdefault("responses", {})["default"] = _ERROR_RESPONSE
        paths["/v1/identities"]["post"]["requestBody"] = IDENTITY_UPLOAD
        create_session = paths["/v1/sessions"]["post"]
        create_session["requestBody"] = {"required": True, "content": {"application/sdp": _SDP}}
        create_session["responses"]["201"] = {"description": "the SDP answer", "content": {"application/sdp": _SDP}}
        thumbnail = paths["/v1/identities/{identity_id}/thumbnail"]["get"]
        thumbnail["responses"]["200"] = {
            "description": "the chosen face, JPEG",
            "content": {"image/jpeg": {"schema": {"type": "string", "format": "binary"}}},
        }
        paths["/metrics"]["get"]["responses"]["200"] = {
            "description": "Prometheus text format",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
        paths["/readyz"]["get"]["responses"]["503"] = {
            "description": "not ready, with the reason",
            "content": {"application/json": {"schema": _not_ready_schema()}},
        }
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def serve_docs(app: FastAPI, page: Path) -> None:
    """`/docs`: `page` (Swagger UI started by `docs.js`, over `/openapi.json`), open to everyone like the document
    itself. A plain route, not an API operation: it is no part of the document."""

    async def docs(_request: Request) -> FileResponse:
        return FileResponse(page, headers={"Cache-Control": "no-cache"})

    app.add_route("/docs", docs, include_in_schema=False)
