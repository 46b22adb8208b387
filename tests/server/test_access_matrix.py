"""Every route of the app against every kind of caller: no credentials, a bad key, a revoked key, an expired and
a forged JWT, a key without the route's scope, another owner, the owner, admin, and viewer tokens (one of the
route's own output, and one of another output of the same owner).

The cases are generated from the app's route table: a route without an access rule, or without a case here,
fails the test, so no route can be added unguarded."""

from __future__ import annotations

import asyncio
import itertools
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection
from fastapi import routing as fastapi_routing
from fastapi.routing import APIRoute
from starlette.routing import Mount, Route

from app.auth.guard import access_rule
from app.auth.settings import AccessSettings
from app.bench.rtc_client import StampedTrack
from app.egress.rtsp import rtsp_unavailable_reason
from app.media.clips import MotionClip
from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.server.credentials import (
    JWT_AUDIENCE,
    JWT_ISSUER,
    JWT_SECRET,
    Credentials,
    bearer,
    make_credentials,
    token,
)
from tests.server.harness import (
    LOOPBACK_DESTINATIONS,
    SELF_CONSENT,
    RunningServer,
    camera_file,
    server_settings,
    start_server,
)

UNAVAILABLE = rtsp_unavailable_reason()
pytestmark = [
    pytest.mark.slow,
    # Its sessions have no peer behind them; on a crowded machine one has ended between the check and its use.
    pytest.mark.alone,
    pytest.mark.skipif(UNAVAILABLE is not None, reason=f"streams need GStreamer RTSP: {UNAVAILABLE}"),
]

CALLERS = (
    "none",
    "bad_key",
    "revoked_key",
    "expired_jwt",
    "forged_jwt",
    "missing_scope",
    "other",
    "owner",
    "admin",
    "viewer_token",
    "foreign_viewer_token",
)
# Routes that are not API routes: the docs and the static files, open to everyone.
OPEN_NON_API = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/static"}


def upload_form(photo: bytes) -> dict[str, Any]:
    return {"files": {"image": ("tom.png", photo)}, "data": SELF_CONSENT}


def real_offer() -> str:
    async def make() -> str:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTransceiver(StampedTrack([np.zeros((48, 64, 3), np.uint8)]), direction="sendrecv")
        await pc.setLocalDescription(await pc.createOffer())
        offer = pc.localDescription.sdp
        await pc.close()
        return str(offer)

    return asyncio.run(make())


def viewer_offer() -> str:
    async def make() -> str:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTransceiver("video", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())
        offer = pc.localDescription.sdp
        await pc.close()
        return str(offer)

    return asyncio.run(make())


CHANNEL_NAMES = (f"matrix-{n}" for n in itertools.count())
SUCCEEDS = ("owner", "admin")  # callers whose DELETE really deletes: they get fresh resources


@dataclass
class World:
    server: RunningServer
    creds: Credentials
    photo: bytes
    offer: str
    video: Path
    cached: dict[str, str] = field(default_factory=dict)

    def url(self, path: str) -> str:
        return f"{self.server.base_url}{path}"

    def call(self, method: str, path: str, credential: str | None, **kwargs: Any) -> httpx.Response:
        headers = {**bearer(credential), **kwargs.pop("headers", {})}
        return httpx.request(method, self.url(path), headers=headers, timeout=60, **kwargs)

    def _owned(self, kind: str, fresh: bool, make: Callable[[], str]) -> str:
        if fresh:
            return make()
        if kind not in self.cached:
            self.cached[kind] = make()
        return self.cached[kind]

    def identity(self, fresh: bool = False) -> str:
        def make() -> str:
            response = self.call("POST", "/v1/identities", self.creds.owner, **upload_form(self.photo))
            assert response.status_code == 201, response.text
            return str(response.json()["id"])

        return self._owned("identity", fresh, make)

    def session(self, fresh: bool = False) -> str:
        def make() -> str:
            response = self.call(
                "POST",
                f"/v1/sessions?identity={self.identity()}",
                self.creds.owner,
                content=self.offer,
                headers={"Content-Type": "application/sdp"},
            )
            assert response.status_code == 201, response.text
            return response.headers["location"].rsplit("/", 1)[1]

        if not fresh:
            self._forget_if_ended("session")
        return self._owned("session", fresh, make)

    def _forget_if_ended(self, key: str) -> None:
        """A cached session has no peer behind it: on a slow run ICE gives up on it before the matrix ends,
        and the next case gets a new one."""
        cached = self.cached.get(key)
        if cached is not None and self.call("GET", f"/v1/sessions/{cached}", self.creds.admin).status_code == 404:
            del self.cached[key]

    def stream(self, fresh: bool = False) -> str:
        def make() -> str:
            body = {"source_url": str(self.video), "identity": self.identity()}
            response = self.call("POST", "/v1/streams", self.creds.owner, json=body)
            assert response.status_code == 201, response.text
            return str(response.json()["id"])

        return self._owned("stream", fresh, make)

    def channel(self, fresh: bool = False) -> str:
        """A channel of the owner's (its name); its own viewer token is kept as `channel-token`."""

        def make() -> str:
            response = self.call("POST", "/v1/channels", self.creds.owner, json={"name": next(CHANNEL_NAMES)})
            assert response.status_code == 201, response.text
            if not fresh:
                self.cached["channel-token"] = response.json()["viewer_token"]
            return str(response.json()["name"])

        return self._owned("channel", fresh, make)

    def push(self, fresh: bool = False) -> str:
        """A push of the owner's cached channel to a port nothing listens on (it retries): its path."""

        def make() -> str:
            channel = self.channel()
            body = {"url": f"rtmp://127.0.0.1:{closed_port()}/live/matrix-key"}
            response = self.call("POST", f"/v1/channels/{channel}/pushes", self.creds.owner, json=body)
            assert response.status_code == 201, response.text
            return f"/v1/channels/{channel}/pushes/{response.json()['id']}"

        return self._owned("push", fresh, make)

    def channel_token(self) -> str:
        self.channel()
        return self.cached["channel-token"]

    def output(self, kind: str) -> str:
        """The owner's cached output of `kind`."""
        return {"sessions": self.session, "streams": self.stream, "channels": self.channel}[kind]()

    def viewer(self, kind: str, fresh: bool = False) -> str:
        """A WHEP viewer of the owner's cached session, stream or channel: its resource path."""
        output = self.output(kind)

        def make() -> str:
            response = self.call(
                "POST",
                f"/v1/{kind}/{output}/whep",
                self.creds.owner,
                content=viewer_offer(),
                headers={"Content-Type": "application/sdp"},
            )
            assert response.status_code == 201, response.text
            return response.headers["location"]

        return self._owned(f"{kind}-viewer", fresh, make)

    def foreign_session(self) -> str:
        """A second session of the owner: its viewer token is foreign to the cached session's routes."""
        self._forget_if_ended("foreign-session")
        return self._owned("foreign-session", False, lambda: self.session(fresh=True))

    def viewer_token(self, kind: str, output: str, fresh: bool = False) -> tuple[str, str]:
        """(token id, token) minted by the owner for `output` of `kind`."""

        def make() -> str:
            response = self.call("POST", f"/v1/{kind}/{output}/viewer-tokens", self.creds.owner)
            assert response.status_code == 201, response.text
            return f"{response.json()['id']} {response.json()['token']}"

        token_id, token = self._owned(f"{kind}-{output}-token", fresh, make).split(" ")
        return token_id, token

    def cleanup(self) -> None:
        """End every session and stream but the cached ones."""
        keep = set(self.cached.values())
        for kind in ("sessions", "streams"):
            for item in self.call("GET", f"/v1/{kind}", self.creds.admin).json()[kind]:
                if item["id"] not in keep:
                    self.call("DELETE", f"/v1/{kind}/{item['id']}", self.creds.admin)


Request = tuple[str, str, dict[str, Any]]  # method, path, httpx keyword arguments
Build = Callable[[World, str], Request]  # (world, caller) -> request


@dataclass
class Case:
    """How to call a route as a caller (the owner's resources made as needed) and what a caller gets when its
    credentials are good: `ok` for the owner, `other` for another owner (404 for the owner's items, `ok` for
    collections and for what it creates for itself), `admin` (default `ok`)."""

    build: Build
    ok: int
    other: int
    admin: int | None = None
    check_list: str | None = None  # list routes: the key of the list, whose visibility is checked
    viewer: int | None = None  # routes that take viewer tokens: what the output's own token gets
    # Callers whose successful call would end the shared server (draining): checked by a test of their own.
    skip: tuple[str, ...] = ()


def plain(method: str, path: str) -> Build:
    return lambda w, caller: (method, path, {})


def listing(kind: str, make: Callable[[World], str]) -> Build:
    def build(w: World, caller: str) -> Request:
        make(w)
        return "GET", f"/v1/{kind}", {}

    return build


def item(method: str, template: str, make: Callable[[World, bool], str], **kwargs: Any) -> Build:
    def build(w: World, caller: str) -> Request:
        resource = make(w, method == "DELETE" and caller in SUCCEEDS)
        extra = {k: v(w) if callable(v) else v for k, v in kwargs.items()}
        return method, template.format(resource), extra

    return build


def sessions_post(w: World, caller: str) -> Request:
    sdp = {"content": w.offer, "headers": {"Content-Type": "application/sdp"}}
    return "POST", f"/v1/sessions?identity={w.identity()}", sdp


def channels_post(w: World, caller: str) -> Request:
    return "POST", "/v1/channels", {"json": {"name": next(CHANNEL_NAMES), "width": 320, "height": 240}}


def rotate_post(w: World, caller: str) -> Request:
    return "POST", f"/v1/channels/{w.channel(fresh=caller in SUCCEEDS)}/rotate", {"headers": {"X-Swapcast": "1"}}


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def push_post(w: World, caller: str) -> Request:
    # A fresh channel for each caller that succeeds: the cached one would reach its most pushes.
    channel = w.channel(fresh=caller in SUCCEEDS)
    return "POST", f"/v1/channels/{channel}/pushes", {"json": {"url": f"rtmp://127.0.0.1:{closed_port()}/live/k"}}


def push_item(method: str) -> Build:
    def build(w: World, caller: str) -> Request:
        return method, w.push(fresh=method == "DELETE" and caller in SUCCEEDS), {}

    return build


def streams_post(w: World, caller: str) -> Request:
    return "POST", "/v1/streams", {"json": {"source_url": str(w.video), "identity": w.identity()}}


def upload_post(w: World, caller: str) -> Request:
    return "POST", "/v1/identities", upload_form(w.photo)


def whep_post(kind: str, make: Callable[[World], str]) -> Build:
    def build(w: World, caller: str) -> Request:
        sdp = {"content": viewer_offer(), "headers": {"Content-Type": "application/sdp"}}
        return "POST", f"/v1/{kind}/{make(w)}/whep", sdp

    return build


def whep_delete(kind: str) -> Build:
    def build(w: World, caller: str) -> Request:
        return "DELETE", w.viewer(kind, fresh=caller in SUCCEEDS), {}

    return build


def token_delete(kind: str) -> Build:
    def build(w: World, caller: str) -> Request:
        output = w.session() if kind == "sessions" else w.stream()
        token_id, _ = w.viewer_token(kind, output, fresh=caller in SUCCEEDS)
        return "DELETE", f"/v1/{kind}/{output}/viewer-tokens/{token_id}", {}

    return build


CASES: dict[tuple[str, str], Case] = {
    ("GET", "/"): Case(plain("GET", "/"), 200, 200),
    ("GET", "/healthz"): Case(plain("GET", "/healthz"), 200, 200),
    ("GET", "/readyz"): Case(plain("GET", "/readyz"), 200, 200),
    ("GET", "/metrics"): Case(plain("GET", "/metrics"), 200, 200),
    ("GET", "/v1/server"): Case(plain("GET", "/v1/server"), 200, 200),
    ("POST", "/v1/identities"): Case(upload_post, 201, 201),
    ("GET", "/v1/identities"): Case(listing("identities", World.identity), 200, 200, check_list="identities"),
    ("GET", "/v1/identities/{identity_id}"): Case(item("GET", "/v1/identities/{}", World.identity), 200, 404),
    ("GET", "/v1/identities/{identity_id}/thumbnail"): Case(
        item("GET", "/v1/identities/{}/thumbnail", World.identity), 200, 404
    ),
    ("DELETE", "/v1/identities/{identity_id}"): Case(item("DELETE", "/v1/identities/{}", World.identity), 204, 404),
    ("POST", "/v1/sessions"): Case(sessions_post, 201, 404),
    ("GET", "/v1/sessions"): Case(listing("sessions", World.session), 200, 200, check_list="sessions"),
    ("GET", "/v1/sessions/{session_id}"): Case(item("GET", "/v1/sessions/{}", World.session), 200, 404),
    ("PATCH", "/v1/sessions/{session_id}"): Case(
        item("PATCH", "/v1/sessions/{}", World.session, json=lambda w: {"identity": w.identity()}), 200, 404
    ),
    ("PATCH", "/v1/sessions/{session_id}/options"): Case(
        item("PATCH", "/v1/sessions/{}/options", World.session, json={"on_face_lost": "cover"}), 200, 404
    ),
    ("DELETE", "/v1/sessions/{session_id}"): Case(item("DELETE", "/v1/sessions/{}", World.session), 204, 404),
    ("POST", "/v1/streams"): Case(streams_post, 201, 404),
    ("GET", "/v1/streams"): Case(listing("streams", World.stream), 200, 200, check_list="streams"),
    ("GET", "/v1/streams/{stream_id}"): Case(item("GET", "/v1/streams/{}", World.stream), 200, 404),
    ("PATCH", "/v1/streams/{stream_id}"): Case(
        item("PATCH", "/v1/streams/{}", World.stream, json=lambda w: {"identity": w.identity()}), 200, 404
    ),
    ("PATCH", "/v1/streams/{stream_id}/options"): Case(
        item("PATCH", "/v1/streams/{}/options", World.stream, json={"on_face_lost": "cover"}), 200, 404
    ),
    ("DELETE", "/v1/streams/{stream_id}"): Case(item("DELETE", "/v1/streams/{}", World.stream), 204, 404),
    ("POST", "/v1/sessions/{session_id}/whep"): Case(whep_post("sessions", World.session), 201, 404, viewer=201),
    ("GET", "/v1/sessions/{session_id}/whep"): Case(item("GET", "/v1/sessions/{}/whep", World.session), 200, 404),
    # A viewer token stops only the viewers it opened itself, not the owner's.
    ("DELETE", "/v1/sessions/{session_id}/whep/{viewer_id}"): Case(whep_delete("sessions"), 200, 404, viewer=404),
    ("POST", "/v1/streams/{stream_id}/whep"): Case(whep_post("streams", World.stream), 201, 404, viewer=201),
    ("GET", "/v1/streams/{stream_id}/whep"): Case(item("GET", "/v1/streams/{}/whep", World.stream), 200, 404),
    ("DELETE", "/v1/streams/{stream_id}/whep/{viewer_id}"): Case(whep_delete("streams"), 200, 404, viewer=404),
    ("POST", "/v1/sessions/{session_id}/viewer-tokens"): Case(
        item("POST", "/v1/sessions/{}/viewer-tokens", World.session), 201, 404
    ),
    ("GET", "/v1/sessions/{session_id}/viewer-tokens"): Case(
        item("GET", "/v1/sessions/{}/viewer-tokens", World.session), 200, 404
    ),
    ("DELETE", "/v1/sessions/{session_id}/viewer-tokens/{token_id}"): Case(token_delete("sessions"), 204, 404),
    ("POST", "/v1/streams/{stream_id}/viewer-tokens"): Case(
        item("POST", "/v1/streams/{}/viewer-tokens", World.stream), 201, 404
    ),
    ("GET", "/v1/streams/{stream_id}/viewer-tokens"): Case(
        item("GET", "/v1/streams/{}/viewer-tokens", World.stream), 200, 404
    ),
    ("DELETE", "/v1/streams/{stream_id}/viewer-tokens/{token_id}"): Case(token_delete("streams"), 204, 404),
    ("GET", "/v1/sessions/{session_id}/audio"): Case(item("GET", "/v1/sessions/{}/audio", World.session), 200, 404),
    ("PATCH", "/v1/sessions/{session_id}/audio"): Case(
        item("PATCH", "/v1/sessions/{}/audio", World.session, json={"offset_ms": 20}), 200, 404
    ),
    ("GET", "/view/{session_id}"): Case(item("GET", "/view/{}", World.session), 200, 200),
    ("GET", "/view/stream/{stream_id}"): Case(item("GET", "/view/stream/{}", World.stream), 200, 200),
    # Only a failed stream restarts: the owner and admin hear that this one is not failed, others nothing.
    ("POST", "/v1/streams/{stream_id}/restart"): Case(item("POST", "/v1/streams/{}/restart", World.stream), 409, 404),
    # Draining needs the admin scope (an admin's drain would end this shared server: its own test below).
    ("POST", "/v1/server/drain"): Case(plain("POST", "/v1/server/drain"), 403, 403, admin=202, skip=("admin",)),
    ("GET", "/v1/server/drain"): Case(plain("GET", "/v1/server/drain"), 200, 200),
    ("GET", "/v1/ice-servers"): Case(plain("GET", "/v1/ice-servers"), 200, 200),
    ("POST", "/v1/channels"): Case(channels_post, 201, 201),
    ("GET", "/v1/channels"): Case(listing("channels", World.channel), 200, 200, check_list="channels"),
    ("GET", "/v1/channels/{name}"): Case(item("GET", "/v1/channels/{}", World.channel), 200, 404),
    # Rotating the cached channel would change the token the viewer-token cases use: the owner and admin get
    # fresh channels.
    ("POST", "/v1/channels/{name}/rotate"): Case(rotate_post, 200, 404),
    ("DELETE", "/v1/channels/{name}"): Case(item("DELETE", "/v1/channels/{}", World.channel), 204, 404),
    ("POST", "/v1/channels/{name}/whep"): Case(whep_post("channels", World.channel), 201, 404, viewer=201),
    ("GET", "/v1/channels/{name}/whep"): Case(item("GET", "/v1/channels/{}/whep", World.channel), 200, 404),
    ("DELETE", "/v1/channels/{name}/whep/{viewer_id}"): Case(whep_delete("channels"), 200, 404, viewer=404),
    ("GET", "/view/channel/{name}"): Case(item("GET", "/view/channel/{}", World.channel), 200, 200),
    ("POST", "/v1/channels/{name}/pushes"): Case(push_post, 201, 404),
    ("GET", "/v1/channels/{name}/pushes"): Case(item("GET", "/v1/channels/{}/pushes", World.channel), 200, 404),
    ("GET", "/v1/channels/{name}/pushes/{push_id}"): Case(push_item("GET"), 200, 404),
    ("DELETE", "/v1/channels/{name}/pushes/{push_id}"): Case(push_item("DELETE"), 204, 404),
}


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory,
    pipeline_factory: Callable[[PipelineSettings], FramePipeline],
    tom_png: bytes,
    clip: MotionClip,
) -> Iterator[World]:
    root = tmp_path_factory.mktemp("matrix")
    creds = make_credentials(root / "keys.json")
    video = camera_file(root, clip, 10)
    access = AccessSettings(
        keys_file=creds.keys_file,
        jwt_secret=JWT_SECRET,
        jwt_issuer=JWT_ISSUER,
        jwt_audience=JWT_AUDIENCE,
        auth_failure_delay_s=0.0,
    )
    settings = server_settings(
        root / "identities",
        access=access,
        rtsp_enabled=True,
        rtsp_port=0,
        allow_file_sources=True,
        max_sessions=8,
        max_streams=8,
        connect_timeout_s=900.0,
        # The matrix's sessions have no peer behind them: they must outlive the unconnected-session timeout.
        ice_timeout_s=900.0,
        **LOOPBACK_DESTINATIONS,
    )
    with start_server(settings, pipeline_factory) as server:
        yield World(server, creds, tom_png, real_offer(), video)


def credential_for(caller: str, world: World, scope: str | None, route_path: str) -> str | None:
    creds = world.creds
    now = int(time.time())
    if caller in ("viewer_token", "foreign_viewer_token"):
        kind = "streams" if route_path.startswith("/v1/streams") else "sessions"
        if caller == "foreign_viewer_token":
            return world.viewer_token("sessions", world.foreign_session())[1]
        if route_path.startswith("/v1/channels"):
            return world.channel_token()
        return world.viewer_token(kind, world.stream() if kind == "streams" else world.session())[1]
    return {
        "none": None,
        "bad_key": creds.bad_key,
        "revoked_key": creds.revoked,
        "expired_jwt": token({"exp": now - 3600, "iat": now - 7200}),
        "forged_jwt": token(key="another-secret-that-is-long-enough-to-sign!"),
        # No key lacks only `admin` but the owner's, which has every other scope.
        "missing_scope": creds.without.get(scope, creds.owner) if scope else creds.other,
        "other": creds.other,
        "owner": creds.owner,
        "admin": creds.admin,
    }[caller]


def api_routes(server: RunningServer) -> list[tuple[str, APIRoute]]:
    """(path, route) for every API route the app serves, through included routers."""
    contexts: Any = server.app.routes
    if hasattr(fastapi_routing, "iter_route_contexts"):  # FastAPI versions that include routers lazily
        contexts = fastapi_routing.iter_route_contexts(server.app.routes)
    found = []
    for context in contexts:
        route = getattr(context, "original_route", context)
        path = getattr(context, "path", None) or getattr(route, "path", None)
        if isinstance(route, APIRoute):
            found.append((str(path), route))
        else:
            assert isinstance(route, Route | Mount) and path in OPEN_NON_API, f"unexpected route {path}"
    return found


def test_every_route_declares_an_access_rule_and_has_a_case(world: World) -> None:
    routes = api_routes(world.server)
    served = {(method, path) for path, route in routes for method in route.methods}
    assert set(CASES) <= served, f"cases for routes no longer served: {sorted(set(CASES) - served)}"
    for path, route in routes:
        assert access_rule(route) is not None, f"{path} declares no access rule"
        for method in route.methods:
            assert (method, path) in CASES, f"no access case for {method} {path}: add one"


def test_the_authorisation_matrix(world: World) -> None:
    failures: list[str] = []
    try:
        for route_path, route in api_routes(world.server):
            rule = access_rule(route)
            assert rule is not None
            for method in sorted(route.methods):
                case = CASES[(method, route_path)]
                for caller in CALLERS:
                    if caller in case.skip:
                        continue
                    expected = expected_status(case, caller, rule.public, rule.scope, rule.viewer_token)
                    credential = credential_for(caller, world, rule.scope, route_path)
                    verb, path, kwargs = case.build(world, caller)
                    response = world.call(verb, path, credential, **kwargs)
                    where = f"{method} {route_path} as {caller}"
                    if response.status_code != expected:
                        failures.append(f"{where}: {response.status_code} (expected {expected}) {response.text[:120]}")
                        continue
                    if expected == 401:
                        challenge = response.headers.get("www-authenticate", "")
                        if not challenge.startswith("Bearer"):
                            failures.append(f"{where}: 401 without a Bearer challenge")
                    if case.check_list and caller in ("other", "owner", "admin"):
                        failures += list_visibility(world, case.check_list, response, caller, where)
                world.cleanup()
    finally:
        world.cleanup()
    assert not failures, "\n".join(failures)


def expected_status(case: Case, caller: str, public: bool, scope: str | None, takes_viewer_token: bool) -> int:
    if public:
        return case.ok
    if caller in ("viewer_token", "foreign_viewer_token"):
        if not takes_viewer_token:
            return 401  # not an API credential anywhere else
        return case.viewer if caller == "viewer_token" and case.viewer is not None else 404
    if caller in ("none", "bad_key", "revoked_key", "expired_jwt", "forged_jwt"):
        return 401
    if caller == "missing_scope":
        return 403 if scope else case.ok
    if caller == "other":
        return case.other
    if caller == "admin":
        return case.admin if case.admin is not None else case.ok
    return case.ok


def list_visibility(world: World, key: str, response: httpx.Response, caller: str, where: str) -> list[str]:
    """The owner's item is in the owner's and admin's list and not in another owner's."""
    owned = world.cached[key.rstrip("s") if key != "identities" else "identity"]
    seen = {entry["id"] for entry in response.json()[key]}
    wanted = caller != "other"
    return [] if (owned in seen) == wanted else [f"{where}: the owner's {key} {'missing' if wanted else 'visible'}"]


def test_the_openapi_document_declares_the_bearer_scheme_on_every_guarded_operation(world: World) -> None:
    document = httpx.get(world.url("/openapi.json")).json()
    scheme = document["components"]["securitySchemes"]["bearer"]
    assert scheme["type"] == "http" and scheme["scheme"] == "bearer"
    for path, route in api_routes(world.server):
        rule = access_rule(route)
        assert rule is not None
        if not route.include_in_schema:
            continue
        for method in route.methods:
            operation = document["paths"][path][method.lower()]
            assert ("security" in operation) == (not rule.public), f"{method} {path}"


def test_a_session_can_switch_only_to_its_owners_identities(world: World) -> None:
    session = world.session(fresh=True)
    theirs = world.call("POST", "/v1/identities", world.creds.other, **upload_form(world.photo))
    assert theirs.status_code == 201
    other_identity = theirs.json()["id"]
    try:
        path = f"/v1/sessions/{session}"
        switched = world.call("PATCH", path, world.creds.owner, json={"identity": other_identity})
        assert switched.status_code == 404 and "not found" in switched.json()["detail"]
        assert world.call("GET", path, world.creds.owner).json()["identity"] == world.identity()
        sdp = {"content": world.offer, "headers": {"Content-Type": "application/sdp"}}
        started = world.call("POST", f"/v1/sessions?identity={other_identity}", world.creds.owner, **sdp)
        assert started.status_code == 404
        by_admin = world.call("PATCH", path, world.creds.admin, json={"identity": other_identity})
        assert by_admin.status_code == 200 and by_admin.json()["identity"] == other_identity
    finally:
        world.cleanup()


def test_identities_stored_before_owners_existed_are_admin_only(world: World) -> None:
    state = world.server.state
    pipeline = state.pipeline
    assert pipeline is not None
    template = state.store.get(world.identity())
    prepared = state.store.load_prepared(
        template.id, pipeline.engine.model_key, pipeline.engine.name, pipeline.prepare_source
    )
    legacy = state.store.create(  # as stored before identities had owners: no owner recorded
        name="from before",
        photo=world.photo,
        format=template.format,
        width=template.width,
        height=template.height,
        faces=1,
        face_index=None,
        thumbnail=state.store.thumbnail(template.id),
        prepared=prepared,
    )
    assert legacy.owner is None
    for who, visible in ((world.creds.owner, False), (world.creds.other, False), (world.creds.admin, True)):
        listed = {i["id"] for i in world.call("GET", "/v1/identities", who).json()["identities"]}
        assert (legacy.id in listed) == visible
        assert world.call("GET", f"/v1/identities/{legacy.id}", who).status_code == (200 if visible else 404)
