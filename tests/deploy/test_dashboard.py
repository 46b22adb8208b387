"""The Grafana dashboard queries only metrics a real server exports (batchers and identity cache included),
and its provisioning points at the Prometheus that compose and Kubernetes scrape into."""

import json
import re
import time
from pathlib import Path

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.server.app import create_app
from app.settings import PipelineSettings
from tests.server.harness import server_settings

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "swapcast.json"


def _exported_samples(tmp_path: Path) -> set[str]:
    settings = server_settings(tmp_path, batching_enabled=True, pipeline=PipelineSettings(engine="classic"))
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        deadline = time.monotonic() + 60
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, client.get("/readyz").text
            time.sleep(0.1)
        text = client.get("/metrics").text
    # Labelled families with no child yet have no samples: name what each family type exports.
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    return {
        family.name + suffix
        for family in text_string_to_metric_families(text)
        for suffix in suffixes.get(family.type, ("",))
    }


def _queries(dashboard: dict) -> list[str]:
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def test_every_dashboard_metric_is_exported(tmp_path: Path, model_root: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = _exported_samples(tmp_path)
    used = {name for query in _queries(dashboard) for name in re.findall(r"\bswapcast_[a-z_]+\b", query)}
    assert used, "the dashboard queries no swapcast metric"
    missing = sorted(used - exported)
    assert not missing, f"the dashboard queries metrics the server does not export: {missing}"
    for needed in ("swapcast_session_capacity", "swapcast_frames_dropped_total", "swapcast_batcher_batch_size_sum",
                   "swapcast_identity_cache_hits_total", "swapcast_frame_latency_seconds_bucket"):  # fmt: skip
        assert needed in used


def test_dashboard_panels_do_not_overlap_and_use_the_provisioned_source() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    taken: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        cells = {
            (x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & taken, f"panel {panel['title']!r} overlaps another"
        taken |= cells
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "prometheus"
    source = (ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    assert "uid: prometheus" in source
