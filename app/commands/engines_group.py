"""`swapcast engines`: the one command group for making model variants. This module owns the group; the
sub-commands come from `variant_commands` (FP16/INT8 variants, TensorRT plans) and `engine_tools` (pruning,
distillation, reports)."""

import argparse

from app.commands import engine_tools, variant_commands


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = sub.add_parser("engines", help="model variants: FP16/INT8, TensorRT, pruning, distillation, reports")
    actions = parser.add_subparsers(dest="engines_command", required=True)
    variant_commands.add_commands(actions)
    engine_tools.add_commands(actions)
