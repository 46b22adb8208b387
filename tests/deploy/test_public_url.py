"""Absolute Location URLs: paths get the replica's public base URL; absolute and protocol-relative ones stay."""

from fastapi import FastAPI, Response
from fastapi.testclient import TestClient

from app.server.public_url import AbsoluteLocation


def test_paths_get_the_base_url_and_other_locations_stay() -> None:
    app = FastAPI()

    @app.get("/to")
    async def to(where: str) -> Response:
        return Response(status_code=201, headers={"Location": where})

    app.add_middleware(AbsoluteLocation, base_url="https://replica-2.example:8443/")
    client = TestClient(app)
    cases = {
        "/v1/sessions/abc": "https://replica-2.example:8443/v1/sessions/abc",
        "https://other.example/x": "https://other.example/x",
        "//other.example/x": "//other.example/x",
    }
    for given, expected in cases.items():
        response = client.get("/to", params={"where": given}, follow_redirects=False)
        assert response.headers["location"] == expected
    assert "location" not in client.get("/docs").headers
