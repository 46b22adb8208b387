"""The payload's bit layout and CRC, the registry, and the chi-square tail the detector's threshold rests on."""

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from app.provenance.fec import CODED_BITS, decode, encode
from app.provenance.payload import CODE_BITS, Payload
from app.provenance.registry import MarkRegistry
from app.provenance.stats import chi2_isf, chi2_log_sf


def test_payload_round_trips_through_its_64_bits() -> None:
    payload = Payload(server_id=0xBEEF, mark_id=0x123456, hour=201)
    bits = payload.to_bits()
    assert bits.shape == (CODE_BITS,) and set(np.unique(bits)) <= {0, 1}
    assert Payload.from_bits(bits) == payload
    assert payload.hex() == "beef123456c9"


def test_a_single_wrong_bit_fails_the_crc() -> None:
    bits = Payload(1, 2, 3).to_bits()
    for i in range(CODE_BITS):
        flipped = bits.copy()
        flipped[i] ^= 1
        assert Payload.from_bits(flipped) is None


def test_fields_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match="mark_id"):
        Payload(0, 1 << 24, 0)
    with pytest.raises(ValueError, match="hour"):
        Payload(0, 0, 256)


@pytest.mark.parametrize("x", [10.0, 64.0, 140.0, 250.0, 400.0])
def test_chi2_tail_matches_scipy(x: float) -> None:
    assert chi2_log_sf(x, 140) == pytest.approx(stats.chi2.logsf(x, 140), rel=1e-9)
    assert chi2_isf(1e-10, 140) == pytest.approx(stats.chi2.isf(1e-10, 140), rel=1e-6)


def test_convolutional_code_corrects_what_bare_bits_would_get_wrong() -> None:
    """At the same energy per payload bit: 140 coded bits at 1.35 sigma each, or 64 bare bits at 2 sigma."""
    rng = np.random.default_rng(0)
    decoded = bare = 0
    for _ in range(50):
        bits = Payload(int(rng.integers(1 << 16)), int(rng.integers(1 << 24)), int(rng.integers(256))).to_bits()
        coded = encode(bits)
        assert coded.shape == (CODED_BITS,)
        decoded += np.array_equal(decode((2.0 * coded - 1) * 1.35 + rng.normal(size=CODED_BITS)), bits)
        bare += np.array_equal(((2.0 * bits - 1) * 2.0 + rng.normal(size=CODE_BITS) > 0).astype(np.uint8), bits)
    assert decoded >= 48 and bare <= 25


def test_registry_maps_a_payload_back_to_its_session_and_skips_a_torn_line(tmp_path: Path) -> None:
    registry = MarkRegistry(tmp_path / "marks.jsonl")
    first = registry.issue(server_id=7, kind="session", ref="abc", identity="id1", owner="alice")
    registry.issue(server_id=7, kind="stream", ref="def", identity="id2")
    with registry.path.open("a") as f:
        f.write('{"mark": "torn')
    (found,) = registry.lookup(first.payload())
    assert (found.kind, found.ref, found.identity, found.owner) == ("session", "abc", "id1", "alice")
    lines = registry.path.read_text().splitlines()
    assert json.loads(lines[0])["mark"] == first.mark
    assert registry.lookup(Payload(8, first.mark_id, first.hour)) == []
