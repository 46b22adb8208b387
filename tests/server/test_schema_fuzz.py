"""Schema fuzzing of a live server: every operation the OpenAPI document describes, with bodies generated from it
(multipart photos, SDP text, JSON), answers without a 5xx and as documented (error shape `{"detail": str}`)."""

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import content_type_conformance, not_a_server_error, response_schema_conformance

from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.server.harness import server_settings, start_server
from tests.server.test_bad_input import real_offer

BUDGET_S = 60.0  # for all operations together
EXAMPLES = 40  # per operation and generation mode (valid and invalid by the schema), at most


def test_the_document_describes_the_real_bodies(identity_dir: Path) -> None:
    from app.server.app import create_app

    document = create_app(server_settings(identity_dir)).openapi()
    upload = document["paths"]["/v1/identities"]["post"]["requestBody"]["content"]
    assert upload["multipart/form-data"]["schema"]["properties"]["image"]["format"] == "binary"
    assert "application/sdp" in document["paths"]["/v1/sessions"]["post"]["requestBody"]["content"]
    assert document["components"]["schemas"]["HTTPValidationError"]["properties"]["detail"] == {"type": "string"}


def test_validation_errors_are_one_string_without_the_input(identity_dir: Path, server_url: str) -> None:
    response = httpx.post(f"{server_url}/v1/streams", json={"source_url": "x" * 5000, "identity": 7})
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert isinstance(detail, str) and "xxxxxxxxxx" not in detail and len(detail) <= 300


def _sdp_bodies() -> st.SearchStrategy[bytes]:
    """SDP offers for `application/sdp`: a real one, one cut short, lines shuffled or dropped, and raw bytes."""
    offer = real_offer()
    lines = offer.split("\r\n")
    cut = st.integers(0, len(offer)).map(lambda n: offer[:n])
    shuffled = st.permutations(lines[1:]).map(lambda rest: "\r\n".join([lines[0], *rest]))
    dropped = st.sets(st.integers(0, len(lines) - 1), max_size=6).map(
        lambda gone: "\r\n".join(line for i, line in enumerate(lines) if i not in gone)
    )
    text = st.one_of(st.just(offer), cut, shuffled, dropped, st.text(max_size=400))
    return st.one_of(text.map(lambda t: t.encode("utf-8", "surrogatepass")), st.binary(max_size=400))


@schemathesis.deserializer("application/sdp")
def _sdp_text(_ctx: schemathesis.DeserializationContext, response: schemathesis.Response) -> str:
    return response.content.decode("utf-8")


@schemathesis.deserializer("image/jpeg")
def _jpeg(_ctx: schemathesis.DeserializationContext, response: schemathesis.Response) -> str:
    return response.content.decode("latin-1")  # a binary string; its schema says no more


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory, pipeline_factory: Callable[[PipelineSettings], FramePipeline]):  # type: ignore[no-untyped-def]
    settings = server_settings(
        tmp_path_factory.mktemp("fuzzed"), max_sessions=50, connect_timeout_s=2.0, ice_timeout_s=1.0
    )
    with start_server(settings, pipeline_factory) as server:
        yield server.base_url


CHECKS = [not_a_server_error, response_schema_conformance, content_type_conformance]


def fuzz(operation: schemathesis.APIOperation, mode: GenerationMode, base_url: str, deadline: float) -> list[int]:
    """Up to EXAMPLES generated requests to one operation, each answer checked; the statuses seen."""
    statuses: list[int] = []

    @settings(
        max_examples=EXAMPLES, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def exercise(case: schemathesis.Case) -> None:
        if time.monotonic() > deadline:
            return
        response = case.call(base_url=base_url, timeout=30)
        statuses.append(response.status_code)
        case.validate_response(response, checks=CHECKS)

    try:
        exercise()
    except Unsatisfiable:  # nothing to make invalid: an operation without parameters or body
        assert mode is GenerationMode.NEGATIVE
    return statuses


@pytest.mark.slow
def test_schema_fuzzing_finds_no_5xx_and_no_schema_violation(server_url: str) -> None:
    schemathesis.openapi.media_type("application/sdp", _sdp_bodies())
    schema = schemathesis.openapi.from_url(f"{server_url}/openapi.json")
    deadline = time.monotonic() + BUDGET_S
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 14
    # Draining stops the server taking work (every later request would be 503): it has tests of its own.
    operations = [op for op in operations if (op.method.upper(), op.path) != ("POST", "/v1/server/drain")]
    statuses: list[int] = []
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            if time.monotonic() < deadline:
                statuses += fuzz(operation, mode, server_url, deadline)
    assert len(statuses) >= 400
    assert set(statuses) >= {200, 400, 404, 415, 422}


# The query map is parsed in the route, outside FastAPI's own validation: fuzzed on its own (ids of every length,
# separators in odd places, thresholds out of range or of the wrong type).
_MAP_VALUES = st.one_of(
    st.text(max_size=200),
    st.builds(lambda a, b: f"{a}:{b}", st.text(max_size=120), st.text(max_size=120)),
    st.builds(lambda n: f"{'p' * n}:{'i' * n}", st.integers(0, 200)),
)
_THRESHOLDS = st.one_of(
    st.none(), st.sampled_from(["-1", "true", "nan", "inf", "0.29", "1.01", "0.5", "x"]), st.text(max_size=8)
)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(_MAP_VALUES, max_size=18), threshold=_THRESHOLDS)
def test_the_query_map_and_threshold_never_get_a_5xx(server_url: str, values: list[str], threshold: str | None) -> None:
    params: list[tuple[str, str]] = [("map", v) for v in values]
    if threshold is not None:
        params.append(("match_threshold", threshold))
    response = httpx.post(
        f"{server_url}/v1/sessions", params=params, content=b"v=0\r\n", headers={"Content-Type": "application/sdp"}
    )
    assert response.status_code < 500, (params, response.text)
    assert isinstance(response.json()["detail"], str)


def test_a_map_id_over_64_characters_or_a_threshold_out_of_range_is_422(server_url: str) -> None:
    sdp = {"Content-Type": "application/sdp"}
    for query in (
        f"map={'p' * 65}:x",
        f"map=x:{'i' * 65}",
        "map=a:b&match_threshold=-1",
        "map=a:b&match_threshold=0.1",
    ):
        answer = httpx.post(f"{server_url}/v1/sessions?{query}", content=b"v=0\r\n", headers=sdp)
        assert answer.status_code == 422, (query, answer.text)
    long_id = httpx.post(f"{server_url}/v1/sessions?map={'p' * 65}:x", content=b"v=0\r\n", headers=sdp)
    assert long_id.json()["detail"] == "map entry 1: identity ids are 1 to 64 characters"
    for threshold in (-1, True, 0.29, 1.5):
        body = {"source_url": "rtsp://cam/x", "map": [{"person": "a", "identity": "b"}], "match_threshold": threshold}
        answer = httpx.post(f"{server_url}/v1/streams", json=body)
        assert answer.status_code == 422 and "match_threshold" in answer.json()["detail"], (threshold, answer.text)
