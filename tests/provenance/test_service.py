"""What output paths call: a marker per output that records its issue, marks frames, and adds the label."""

from pathlib import Path

import numpy as np

from app.provenance.code import MarkCode
from app.provenance.detect import detect_windows
from app.provenance.service import Provenance
from app.provenance.settings import ProvenanceSettings


def test_marker_records_its_issue_and_marks_frames_readably(mark_registry: Path) -> None:
    provenance = Provenance(ProvenanceSettings(server_id=9))
    marker = provenance.marker(kind="session", ref="s1", identity="i1", owner="alice")
    assert marker.record is not None and marker.record.server_id == 9
    frame = np.full((360, 640, 3), 90, np.uint8) + np.random.default_rng(0).integers(0, 60, (360, 640, 3), np.uint8)
    marked = marker.apply(frame.copy())
    (found,) = detect_windows([marked], provenance.code, window=1)
    assert found.payload == marker.record.payload()
    (record,) = provenance.registry.lookup(found.payload)
    assert (record.ref, record.identity, record.owner) == ("s1", "i1", "alice")
    assert provenance.registry.path == mark_registry


def test_watermark_off_issues_nothing_and_label_only_draws_the_corner(mark_registry: Path) -> None:
    provenance = Provenance(ProvenanceSettings(watermark=False))
    marker = provenance.marker(kind="stream", ref="s2", label=True)
    assert marker.record is None and not mark_registry.exists()
    frame = np.full((720, 1280, 3), 200, np.uint8)
    out = marker.apply(frame.copy())
    changed = np.argwhere(np.any(out != frame, axis=2))
    assert len(changed) > 0
    assert changed[:, 0].min() > 720 * 0.9 and changed[:, 1].min() > 1280 * 0.7  # bottom-right corner only
    assert not detect_windows([out], MarkCode("swapcast"), window=1)[0].found
