"""`swapcast bench egress`: the CPU of a real process tree read from /proc (a grandchild's work counts, whether
it is still running or was waited for), the server's counters read alike from old and new stats (a missing
encoder is null), and one short real run against a real server with real readers."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.bench.egress_clients import readers_unavailable
from app.bench.egress_counters import OUTPUTS, encodes_per_frame, flatten_counters, per_frame, window_deltas
from app.bench.proc_cpu import CLOCK_TICKS, all_stats, parse_stat, tree, tree_cpu_seconds
from app.cli import build_parser
from app.commands.bench_egress import engines_of

BURN = "import time\nend = time.process_time() + {s}\nwhile time.process_time() < end: pass\n"


def test_a_stat_line_is_read_past_a_command_name_with_spaces_and_brackets() -> None:
    line = "4242 (my (odd) name) S 17 4242 4242 0 -1 4194560 1 0 0 0 150 50 7 3 20 0 1 0 100 0 0"
    stat = parse_stat(line, 4242)
    assert (stat.pid, stat.ppid, stat.ticks) == (4242, 17, 150 + 50 + 7 + 3)


def test_the_tree_counts_a_running_grandchild_and_one_that_was_waited_for() -> None:
    # The child starts a grandchild that burns 0.6 s of CPU, waits for it, then one more that burns and stays.
    script = (
        "import subprocess, sys, time\n"
        f"subprocess.run([sys.executable, '-c', {BURN.format(s=0.6)!r}])\n"
        f"p = subprocess.Popen([sys.executable, '-c', {BURN.format(s=0.6)!r} + 'time.sleep(60)'])\n"
        "print('started', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 30
        while tree_cpu_seconds(child.pid) < 1.1 and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = tree(child.pid, all_stats())
        assert pids[0] == child.pid and len(pids) == 2  # the child and its live grandchild
        own = all_stats()[child.pid]
        assert tree_cpu_seconds(child.pid) >= 1.1  # both grandchildren's burns
        assert own.ticks / CLOCK_TICKS < tree_cpu_seconds(child.pid)  # the child's own figures miss the live one
    finally:
        child.kill()
        child.wait()
    assert tree_cpu_seconds(child.pid) == 0.0  # gone: nothing to read


NEW = {
    "channel": {"frames_published": 100, "consumers": {"rtsp": 1}, "egress": {"encode": {"frames_encoded": 40}}},
    "channel_whep": {"viewers": [], "frames_encoded": 40},
    "pushes": {"pushes": [{"frames_sent": 10, "state": "live"}, {"frames_sent": 12, "state": "live"}]},
    "session": {"frames_in": 100, "frames_out": 98, "hops_ms": {"swap": 4.5}},
    "session_whep": None,  # the listing answered nothing
    "metrics": 'swapcast_egress_frames_encoded_total{kind="channel"} 40.0\nswapcast_frames_in_created 17.0\n',
}


def test_counters_are_flattened_and_their_growth_is_per_published_frame() -> None:
    before = flatten_counters(NEW)
    assert before["channel.egress.encode.frames_encoded"] == 40.0
    assert before['metrics.swapcast_egress_frames_encoded_total{kind="channel"}'] == 40.0
    assert "session.hops_ms.swap" not in before and "channel.consumers.rtsp" not in before
    after = {name: value * 2 for name, value in before.items()}
    deltas = window_deltas(before, after | {"pushes.pushes.2.frames_sent": 5.0})
    assert deltas["channel.frames_published"] == 100.0 and deltas["pushes.pushes.2.frames_sent"] == 5.0
    encodes = encodes_per_frame(deltas, deltas["channel.frames_published"])
    assert encodes["channel_shared_encode"] == 0.4 and encodes["channel_whep_hub"] == 0.4
    assert encodes["session_whep_hub"] is None and encodes["pushes"] is None  # not exposed: null
    outputs = per_frame(deltas, 100.0, OUTPUTS)
    assert outputs["pushes_sent"] == 0.27 and outputs["session_out"] == 0.98


def test_an_older_server_without_the_shared_encode_reports_it_as_null() -> None:
    old = {"channel": {"frames_published": 50}, "channel_whep": {"frames_encoded": 50}, "metrics": ""}
    deltas = window_deltas(flatten_counters(old), flatten_counters(old))
    encodes = encodes_per_frame(deltas, 0.0)
    assert encodes["channel_shared_encode"] is None and encodes["channel_whep_hub"] is None  # nothing published


def test_the_engine_option_takes_both_or_a_repeated_name() -> None:
    parser = build_parser()
    assert engines_of(parser.parse_args(["bench", "egress"]).engine) == ("passthrough", "mesh")
    assert engines_of(parser.parse_args(["bench", "egress", "--engine", "both"]).engine) == ("passthrough", "mesh")
    args = parser.parse_args(["bench", "egress", "--engine", "mesh", "--engine", "mesh", "--baseline", "c499594"])
    assert engines_of(args.engine) == ("mesh",) and args.baseline == "c499594"


@pytest.mark.slow
@pytest.mark.alone
@pytest.mark.skipif(readers_unavailable() is not None, reason=f"readers cannot run here: {readers_unavailable()}")
def test_a_short_run_measures_every_cell_on_a_real_server(tmp_path: Path) -> None:
    from app.bench.egress_cost import EgressConfig, run_egress_bench

    config = EgressConfig(seconds=2.0, warmup_s=1.0, rounds=1, engines=("passthrough",))
    report = run_egress_bench(config, say=lambda text: None)
    cells = report["cells"]
    assert [c["cell"] for c in cells] == ["none", "readers", "viewer"]
    for cell in cells:
        assert cell["cores"] > 0 and cell["frames_published"] > 0 and cell["readers_down"] == []
    for readers in cells[1:]:
        assert readers["not_connected"] == [] and [p["state"] for p in readers["pushes"]] == ["live", "live"]
    summary = report["summary"]["passthrough"]["current"]
    assert set(summary["cores"]) == {"none", "readers", "viewer"} and summary["readers_over_none"] is not None
    # This server counts every encode in one metric: the return's and the channel's, whatever reads them.
    assert 1.5 <= summary["encodes_per_frame"]["viewer"]["total_from_metric"] <= 2.2, summary
