"""Sub-commands of the `swapcast` CLI. Each module exposes `register(subparsers)`."""

import argparse
from collections.abc import Callable

Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def _commands() -> list[Register]:
    # Imported here so that `app.commands` stays cheap to import and each command module loads its
    # heavy dependencies (onnxruntime, av) only when run.
    from app.commands import (
        bench,
        bench_batch,
        bench_content,
        bench_encoder,
        bench_engines,
        bench_mesh,
        bench_network,
        bench_quality,
        bench_return_loss,
        bench_server,
        bench_soak,
        bench_stability,
        bench_upload,
        bench_watermark,
        config,
        demo,
        doctor,
        drain,
        engines_group,
        keys,
        models,
        provenance,
        serve,
        swap,
        triton,
        watermark,
    )

    return [
        serve.register,
        keys.register,
        drain.register,
        config.register,
        doctor.register,
        demo.register,
        swap.register,
        models.register,
        engines_group.register,
        bench.register,
        bench_batch.register,
        bench_server.register,
        bench_network.register,
        bench_return_loss.register,
        bench_soak.register,
        bench_encoder.register,
        bench_quality.register,
        bench_stability.register,
        bench_engines.register,
        bench_mesh.register,
        bench_upload.register,
        bench_watermark.register,
        bench_content.register,
        watermark.register,
        provenance.register,
        triton.register,
    ]


COMMANDS: list[Register] = _commands()
