"""`swapcast bench soak`: one server for N minutes under churn (sessions, an RTSP-ingest stream, WHEP viewers,
RTSP pullers, a channel, identity switches, uploads and deletes); its memory, threads, files, tasks and
connections sampled all along, their growth per hour and whether they come back once the clients leave."""

import argparse
from typing import Any

from app.commands.arguments import int_between, non_negative_float, one_of, positive_float
from app.commands.bench_args import check_bench_args, run_and_report, text_table
from app.commands.from_args import picked
from app.commands.options import (
    add_fps_argument,
    add_output_argument,
    add_resolution_argument,
    add_server_engine_argument,
)
from app.runtime.allocator import NAMED_ALLOCATORS


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("soak", help="one server for N minutes with clients joining and leaving; leaks and drift")
    p.add_argument("--minutes", type=positive_float, default=10.0, help="minutes of churn (default 10)")
    p.add_argument(
        "--warmup-minutes",
        type=non_negative_float,
        default=5.0,
        help="growth is fitted after this (at most a third of the run; default 5)",
    )
    p.add_argument("--sessions", type=int_between(1, 8), default=2, help="WebRTC sessions per cycle (default 2)")
    p.add_argument("--hold", type=positive_float, default=30.0, help="seconds the clients stay each cycle (default 30)")
    p.add_argument("--window", type=positive_float, default=60.0, help="seconds per fps/latency window (default 60)")
    p.add_argument("--sample", type=positive_float, default=5.0, help="seconds between samples (default 5)")
    add_resolution_argument(p)
    add_fps_argument(p, 15, "each source")
    p.add_argument(
        "--malloc-arena-max",
        type=int_between(1, 64),
        default=None,
        help="MALLOC_ARENA_MAX for the server (glibc), to tell allocator fragmentation from leaks",
    )
    p.add_argument(
        "--allocator",
        type=one_of(NAMED_ALLOCATORS, "allocator"),
        default="system",
        help="the server's C allocator: glibc's malloc, or jemalloc preloaded (libjemalloc2; default system)",
    )
    add_server_engine_argument(p)
    add_output_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.bench.server_bench import RESOLUTIONS
    from app.bench.soak_bench import SoakConfig, run_soak_bench

    check_bench_args([args.resolution], RESOLUTIONS, args.output)
    config = SoakConfig(
        **picked(args, "minutes", "warmup_minutes", "sessions", "resolution", "fps", "engine"),
        **picked(args, "malloc_arena_max", "allocator"),
        hold_s=args.hold,
        window_s=args.window,
        sample_s=args.sample,
    )
    return run_and_report(lambda progress: run_soak_bench(config, progress=progress), format_table, args.output)


def format_table(result: dict[str, Any]) -> str:
    kinds = ("session", "whep", "rtsp_stream", "rtsp_channel")
    header = ("WINDOW S", *(f"{k.upper()} FPS/P50" for k in kinds))
    rows = []
    for window in result["windows"]:
        cells = []
        for kind in kinds:
            cell = window.get(kind)
            cells.append(f"{cell['fps']}/{cell['latency_ms']['p50']}" if cell else None)
        rows.append((f"{window['from_s']}-{window['to_s']}", *cells))
    resources = text_table(
        ("RESOURCE", "BASELINE", "PEAK", "AFTER LEAVE", "SLOPE /H"),
        [
            (name, r["baseline"], r["peak"], r["after_leave"], r["slope_per_hour"])
            for name, r in result["resources"].items()
        ],
    )
    failed = [name for name, check in result["checks"].items() if isinstance(check, dict) and not check["ok"]]
    config = result["config"]
    notes = [
        f"{config['engine']} engine, {result['allocator']} allocator, "
        f"{config['resolution']} at {config['fps']} fps, {config['sessions']} sessions, "
        f"{result['cycles']} cycles of {config['hold_s']:g} s in {config['minutes']:g} min; "
        f"RSS per cycle {result['rss_per_cycle_mb']} MB",
        "checks: all passed" if not failed else f"checks failed: {', '.join(failed)}",
    ]
    return text_table(header, rows) + "\n\n" + resources + "\n" + "\n".join(notes)
