"""The server benchmark end to end on a tiny configuration, and its command's argument checks."""

import argparse
import json
from pathlib import Path

import pytest

from app.bench.rtsp_ingest_cell import compare_to_sessions
from app.bench.server_bench import ServerBenchConfig, compare, run_server_bench
from app.cli import main
from app.commands import bench_server
from app.egress.rtsp import rtsp_unavailable_reason
from app.errors import UserError
from engines.store import ModelStore

UNAVAILABLE = rtsp_unavailable_reason()
needs_rtsp = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"GStreamer RTSP unavailable: {UNAVAILABLE}")


@pytest.mark.slow
@pytest.mark.alone
def test_tiny_benchmark_measures_echo_and_our_server(model_root: Path) -> None:
    config = ServerBenchConfig(
        seconds=1.0,
        warmup=0.5,
        sessions=(1,),
        resolutions=("480p",),
        engines=("passthrough",),
        face_lost=False,
        rtsp_ingest=False,
    )
    result = run_server_bench(config, progress=False)
    json.dumps(result)  # JSON all the way down
    cells = {c["server"]: c for c in result["cells"]}
    assert set(cells) == {"echo", "passthrough"}
    for cell in cells.values():
        assert cell["failed"] is None, cell
        assert cell["frames_returned"] > 0 and cell["latency_ms"]["p50"] > 0, cell
        assert cell["unreadable"] <= 1
    assert cells["echo"]["server_dropped"] is None
    assert cells["passthrough"]["server_dropped"] is not None
    assert cells["passthrough"]["server_latency_p50_ms"] > 0
    hops = cells["passthrough"]["server_hops_ms"]
    assert {"queue", "detect", "paste", "output_wait", "encode", "total"} <= set(hops), hops
    # Why frames waited for a detection (the first for its new face), and what each frame cost in CPU.
    detections = cells["passthrough"]["detections"]
    assert detections["new"] >= 1 and set(detections) == {"new", "missed", "fast", "looks", "background"}
    assert cells["passthrough"]["server_cpu_ms_per_frame"] > 0 and cells["echo"]["server_cpu_ms_per_frame"] > 0
    (row,) = result["compared_to_echo"]
    p50 = cells["passthrough"]["latency_ms"]["p50"]
    assert row["added_p50_ms"] == pytest.approx(p50 - cells["echo"]["latency_ms"]["p50"], abs=0.11)
    assert row["ratio_p50"] == pytest.approx(p50 / cells["echo"]["latency_ms"]["p50"], abs=0.01)


@pytest.mark.slow
@pytest.mark.alone
@needs_rtsp
def test_mesh_and_rtsp_ingest_cells_measure_frames_that_flowed(store: ModelStore) -> None:
    store.ensure("face_mesh_468")  # the mesh server finds its landmark model imported
    config = ServerBenchConfig(
        seconds=1.5, warmup=0.5, sessions=(1,), resolutions=("480p",), engines=("mesh",), echo=False, face_lost=False
    )
    result = run_server_bench(config, progress=False)
    json.dumps(result)
    assert result["config"]["rtsp_ingest"] is True
    (session,) = result["cells"]
    assert session["server"] == "mesh" and session["failed"] is None, session
    assert session["frames_returned"] > 0 and session["latency_ms"]["p99"] >= session["latency_ms"]["p50"] > 0
    assert "landmarks" in session["server_hops_ms"] and "total" in session["server_hops_ms"], session
    (stream,) = result["rtsp_ingest"]
    assert stream["server"] == "mesh" and stream["resolution"] == "480p" and stream["failed"] is None, stream
    assert stream["frames_sent"] > 0 and stream["frames_returned"] > 0 and stream["fps"] > 0, stream
    latency = stream["latency_ms"]
    assert latency["n"] == stream["frames_returned"] and latency["p99"] >= latency["p95"] >= latency["p50"] > 0
    assert stream["server_dropped"] is not None and stream["server_cpu_ms_per_frame"] > 0
    assert stream["server_latency_p50_ms"] is None or stream["server_latency_p50_ms"] > 0, stream
    hops = stream["server_hops_ms"]
    assert hops is None or "total" in hops, hops  # the stream's own hops, once its stats carry them
    (row,) = result["rtsp_ingest_vs_session"]
    assert row["fps_ratio"] == pytest.approx(stream["fps"] / session["fps_per_session"], abs=0.01)
    assert row["session_hops_total_p50_ms"] == session["server_hops_ms"]["total"]["p50"]
    assert (row["hops_total_ratio"] is None) == (hops is None)


@pytest.mark.slow
@pytest.mark.alone
def test_the_servers_can_run_in_the_benchmarks_own_process(model_root: Path) -> None:
    config = ServerBenchConfig(
        seconds=1.0,
        warmup=0.5,
        sessions=(1,),
        resolutions=("480p",),
        engines=("passthrough",),
        echo=False,
        face_lost=False,
        in_process=True,
        rtsp_ingest=False,
    )
    result = run_server_bench(config, progress=False)
    assert result["config"]["in_process"] is True and result["config"]["client_encoder"] == "live"
    (cell,) = result["cells"]
    assert cell["failed"] is None and cell["frames_returned"] > 0, cell
    assert cell["server_hops_ms"] and cell["server_cpu_ms_per_frame"] is None, cell


def test_compare_pairs_cells_with_the_echo_of_the_same_shape() -> None:
    def cell(server: str, sessions: int, p50: float, fps: float) -> dict:
        return {
            "server": server,
            "resolution": "480p",
            "sessions": sessions,
            "latency_ms": {"p50": p50, "p95": p50 * 2},
            "fps_per_session": fps,
        }

    rows = compare([cell("echo", 1, 100, 30), cell("echo", 2, 200, 20), cell("classic", 2, 300, 10)])
    assert rows == [
        {
            "server": "classic",
            "resolution": "480p",
            "sessions": 2,
            "added_p50_ms": 100.0,
            "ratio_p50": 1.5,
            "added_p95_ms": 200.0,
            "ratio_p95": 1.5,
            "fps_ratio": 0.5,
        }
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--engines", "magic"], "unknown engine"),
        (["--codec", "AV1"], "unknown codec"),
        (["--sessions", "one"], "comma list of numbers"),
        (["--sessions", "0"], "between 1 and 16"),
        (["--seconds", "0"], "argument --seconds: must be more than 0"),
    ],
)
def test_bench_server_refuses_bad_arguments_while_parsing(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench-server", *argv])
    assert exited.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("swapcast: error: ") and message in lines[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--resolutions", "4k"], "unknown resolution"),
        (["--output", "/no/such/dir/out.json"], "output directory does not exist"),
    ],
)
def test_bench_server_refuses_bad_arguments(argv: list[str], message: str) -> None:
    parser = argparse.ArgumentParser()
    bench_server.register(parser.add_subparsers())
    args = parser.parse_args(["server", *argv])
    with pytest.raises(UserError, match=message):
        args.func(args)


def test_mesh_the_engine_users_get_is_benchmarked_by_default() -> None:
    parser = argparse.ArgumentParser()
    bench_server.register(parser.add_subparsers())
    assert parser.parse_args(["server"]).engines == ("passthrough", "classic", "mesh")
    assert ServerBenchConfig().engines == ("passthrough", "classic", "mesh")


def test_rtsp_ingest_cells_pair_with_the_one_session_cell_of_their_server_and_resolution() -> None:
    def session(server: str, sessions: int, fps: float, total: float) -> dict:
        hops = {"swap": {"p50": 10.0}, "encode": {"p50": 5.0}, "total": {"p50": total, "p95": total * 2}}
        return {
            "server": server,
            "resolution": "480p",
            "sessions": sessions,
            "latency_ms": {"p50": 100.0},
            "fps_per_session": fps,
            "server_hops_ms": hops,
        }

    def stream(server: str, hops: dict | None) -> dict:
        return {
            "server": server,
            "resolution": "480p",
            "latency_ms": {"p50": 150.0},
            "fps": 27.0,
            "server_hops_ms": hops,
        }

    sessions = [session("mesh", 1, 30.0, 40.0), session("mesh", 2, 20.0, 80.0), session("classic", 1, 30.0, 30.0)]
    stream_hops = {"swap": {"p50": 12.0}, "total": {"p50": 44.0}, "detect_background": {"p50": 9.0}}
    rows = compare_to_sessions(sessions, [stream("mesh", stream_hops), stream("classic", None)])
    assert rows == [
        {
            "server": "mesh",
            "resolution": "480p",
            "rtsp_ingest_fps": 27.0,
            "session_fps": 30.0,
            "fps_ratio": 0.9,
            "latency_p50_ratio": 1.5,
            "rtsp_ingest_hops_total_p50_ms": 44.0,
            "session_hops_total_p50_ms": 40.0,
            "hops_total_ratio": 1.1,
            "shared_hops": ["swap"],  # the session's encode is not a hop of the stream's
            "rtsp_ingest_shared_hops_p50_ms": 12.0,
            "session_shared_hops_p50_ms": 10.0,
            "shared_hops_ratio": 1.2,
        },
        {
            "server": "classic",
            "resolution": "480p",
            "rtsp_ingest_fps": 27.0,
            "session_fps": 30.0,
            "fps_ratio": 0.9,
            "latency_p50_ratio": 1.5,
            "rtsp_ingest_hops_total_p50_ms": None,
            "session_hops_total_p50_ms": 30.0,
            "hops_total_ratio": None,  # the stream's stats carry no hops (yet)
            "shared_hops": None,
            "rtsp_ingest_shared_hops_p50_ms": None,
            "session_shared_hops_p50_ms": None,
            "shared_hops_ratio": None,
        },
    ]
