"""`swapcast engines`: one command whose sub-commands come from several modules (precision variants and
TensorRT; pruning, distillation and reports). The first module to register creates it, the others join."""

import argparse


def engines_actions(
    sub: "argparse._SubParsersAction[argparse.ArgumentParser]",
) -> "argparse._SubParsersAction[argparse.ArgumentParser]":
    existing = sub.choices.get("engines")
    if existing is None:
        parser = sub.add_parser("engines", help="model variants: FP16/INT8, TensorRT, pruning, distillation, reports")
        return parser.add_subparsers(dest="engines_command", required=True)
    for action in existing._actions:
        if isinstance(action, argparse._SubParsersAction):
            action.metavar = None  # the usage line lists every sub-command, theirs and these
            return action
    raise RuntimeError("`swapcast engines` exists without sub-commands to join")
