"""Sub-commands of the `swapcast` CLI. Each module exposes `register(subparsers)`."""

import argparse
from collections.abc import Callable

Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def _commands() -> list[Register]:
    # Imported here so that `app.commands` stays cheap to import and each command module loads its
    # heavy dependencies (onnxruntime, av) only when run.
    from app.commands import (
        bench_group,
        cam,
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
        cam.register,
        config.register,
        doctor.register,
        demo.register,
        swap.register,
        models.register,
        engines_group.register,
        bench_group.register,
        watermark.register,
        provenance.register,
        triton.register,
    ]


COMMANDS: list[Register] = _commands()
