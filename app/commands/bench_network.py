"""`swapcast bench network`: one server, one session per network profile (loss, burst loss, jitter, a bandwidth
cap, outages) through an impairing UDP relay; fps, freezes, latency and bitrate, each against the clean run."""

import argparse
from typing import Any

from app.commands.arguments import names_from, non_negative_float, non_negative_int, positive_float
from app.commands.bench_args import check_bench_args, run_and_report, text_table
from app.commands.from_args import picked
from app.commands.options import (
    add_fps_argument,
    add_output_argument,
    add_resolution_argument,
    add_server_engine_argument,
)

PATHS = ("session", "whep", "rtsp-udp", "rtsp-tcp")
PROFILES = ("clean", "loss1", "loss5", "burst2", "jitter40", "cap1.5", "outage3", "outage40")


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser(
        "network", help="sessions through an impaired network (loss, jitter, a cap, outages) vs a clean one"
    )
    p.add_argument(
        "--profiles",
        type=names_from(PROFILES, "profile"),
        default=PROFILES,
        help=f"comma list of {', '.join(PROFILES)} (default all; clean always runs first)",
    )
    p.add_argument(
        "--seconds", type=positive_float, default=10.0, help="measured seconds per profile, outages added (default 10)"
    )
    p.add_argument(
        "--warmup", type=non_negative_float, default=2.0, help="clean seconds streamed before each profile (default 2)"
    )
    add_resolution_argument(p)
    add_fps_argument(p, 30, "the client")
    p.add_argument("--seed", type=non_negative_int, default=1, help="seed of the relay's losses (default 1)")
    add_server_engine_argument(p)
    p.add_argument(
        "--paths",
        type=names_from(PATHS, "path"),
        default=("session",),
        help="comma list of session (the client's own session), whep (a WHEP viewer of a session's output, "
        "through the relay: clean, loss5 and outage3 where asked for), rtsp-udp and rtsp-tcp (an RTSP-ingest "
        "stream whose source comes through an impairing RTSP proxy, its media over UDP or interleaved on TCP, "
        "where loss does not apply); default session",
    )
    p.add_argument(
        "--client-recovery",
        action="store_true",
        help="the client's receivers give up lost packets and ask for keyframes as the server's do (as a "
        "browser does); default: aiortc's own receivers",
    )
    add_output_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.bench.network_bench import NetworkBenchConfig
    from app.bench.network_run import run_network_bench
    from app.bench.server_bench import RESOLUTIONS

    check_bench_args([args.resolution], RESOLUTIONS, args.output)
    config = NetworkBenchConfig(
        **picked(args, "seconds", "warmup", "resolution", "fps", "seed", "engine", "client_recovery"),
        profiles=tuple(args.profiles),
        paths=tuple(args.paths),
    )
    return run_and_report(lambda progress: run_network_bench(config, progress=progress), format_table, args.output)


def format_table(result: dict[str, Any]) -> str:
    header = ("PROFILE", "FPS", "x CLEAN", "P50 MS", "P95 MS", "x P50", "FREEZES", "LONGEST MS", "PLI", "NACK", "KBPS")
    rows = []
    for row in result["profiles"]:
        ratio = row.get("vs_clean") or {}
        feedback = row["feedback"] or {}  # none for an RTSP-ingest stream
        rows.append(
            (
                row["profile"],
                row["fps"],
                ratio.get("fps_ratio"),
                row["latency_ms"]["p50"],
                row["latency_ms"]["p95"],
                ratio.get("latency_p50_ratio"),
                row["freezes"]["count"],
                row["freezes"]["longest_ms"],
                feedback.get("pli_sent"),
                feedback.get("nack_sent"),
                f"{row['mean_client_kbps']}/{row['mean_server_kbps']}",
            )
        )
    config, machine = result["config"], result["machine"]
    notes = [
        f"{config['engine']} engine, {config['resolution']} at {config['fps']} fps, "
        f"{config['seconds']:g} s per profile, {machine['cpus']} CPUs; "
        "PLI/NACK: sent by the client's receiver; KBPS: client/server senders",
    ]
    for row in result["profiles"]:
        if "outage" in row:
            outage = row["outage"]
            closed = outage.get("closed_by_server")
            slot = outage.get("slot")
            notes.append(
                f"{row['profile']}: fresh frames {outage['fresh_frame_after_s']} s after the link came back"
                + (f"; server closed the session: {closed}" if closed is not None else "")
                + (f"; a new session: {slot}" if slot is not None else "")
            )
        if "settled_after_s" in row:
            targets = " ".join(f"{s['t']:g}:{s['target_kbps']}" for s in row.get("return_rate", [])[::2])
            notes.append(
                f"{row['profile']}: under the cap from {row['settled_after_s']} s, p95 after 5 s "
                f"{row['latency_after_5s_ms']['p95']} ms; recovered {row['recovered_after_lift_s']} s after the lift"
                + (f"; server target kbps by second: {targets}" if targets else "")
            )
        if row["failed"]:
            notes.append(f"{row['profile']}: FAILED {row['failed']}")
    return text_table(header, rows) + "\n" + "\n".join(notes)
