"""`swapcast bench batch`: shared dynamic batching vs one model call per frame, N live sessions; with
`--backend triton`, sessions over several media processes sharing one Triton server beside the in-process
batcher."""

import argparse
from typing import Any

from app.commands.arguments import counts, names, non_negative_float, positive_float, positive_int
from app.commands.bench_args import print_report
from app.commands.options import add_output_argument
from app.errors import UserError

DEFAULT_NETWORKS = ("reference_swapper_narrow", "reference_swapper_full")


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("batch", help="N simulated 30 fps sessions: batched vs unbatched, JSON out")
    p.add_argument("--networks", type=names, default=DEFAULT_NETWORKS)
    p.add_argument("--sessions", type=counts(1), default=(1, 2, 4, 8), help="comma list of session counts")
    p.add_argument("--seconds", type=positive_float, default=None, help="seconds per cell (default 4 narrow, 10 full)")
    p.add_argument("--max-batch", type=positive_int, default=8)
    p.add_argument("--max-delay-ms", type=non_negative_float, default=4.0)
    add_output_argument(p)
    p.add_argument(
        "--backend",
        choices=("onnxruntime", "triton"),
        default="onnxruntime",
        help="triton: the swap model on a Triton server shared by --media-processes processes, beside the "
        "in-process batcher (default onnxruntime: batched vs unbatched in this process)",
    )
    p.add_argument("--triton-url", default=None, help="Triton gRPC address (default SWAPCAST_TRITON_URL)")
    p.add_argument("--media-processes", type=positive_int, default=2, help="media processes sharing Triton")
    p.add_argument(
        "--shm",
        choices=("auto", "on", "off"),
        default=None,
        help="Triton system shared memory (default SWAPCAST_TRITON_SHM, else auto: when the URL is loopback)",
    )
    p.set_defaults(func=run)


def run_triton(args: argparse.Namespace) -> dict[str, Any]:
    from app.bench.triton_batch_bench import TritonBenchConfig, run_triton_bench
    from app.model_store import open_model_store
    from app.settings import PipelineSettings

    settings = PipelineSettings()
    store = open_model_store()
    (network, *more) = args.networks if args.networks != DEFAULT_NETWORKS else ("reference_swapper_narrow",)
    if more:
        raise UserError("bench batch --backend triton takes one network (the model Triton serves)")
    config = TritonBenchConfig(
        url=args.triton_url or settings.triton_url,
        model_dir=store.root,
        network=network,
        sessions=args.sessions,
        seconds=args.seconds or 4.0,
        media_processes=args.media_processes,
        max_batch=args.max_batch,
        max_delay_ms=args.max_delay_ms,
        shared_memory=args.shm or settings.triton_shm,
    )
    return run_triton_bench(config, store)


def run(args: argparse.Namespace) -> int:
    if args.backend == "triton":
        return print_report(run_triton(args), args.output)
    from app.bench.batch_bench import BatchBenchConfig, run_batch_bench
    from app.model_store import open_model_store

    config = BatchBenchConfig(
        networks=args.networks, sessions=args.sessions, max_batch=args.max_batch, max_delay_ms=args.max_delay_ms
    )
    if args.seconds is not None:
        config = BatchBenchConfig(
            networks=args.networks,
            sessions=args.sessions,
            max_batch=args.max_batch,
            max_delay_ms=args.max_delay_ms,
            seconds={n: args.seconds for n in args.networks},
        )
    return print_report(run_batch_bench(config, open_model_store()), args.output)
