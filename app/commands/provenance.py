"""`swapcast provenance verify FILE`: validate the C2PA manifest of a file swapcast wrote."""

import argparse


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("provenance", help="C2PA manifests of output files")
    actions = p.add_subparsers(dest="action", required=True)
    v = actions.add_parser("verify", help="validate a file's C2PA manifest (exit 0 valid, 1 invalid or none)")
    v.add_argument("file")
    v.add_argument("--trust-anchors", default=None, help="PEM file of CA certificates to trust")
    v.set_defaults(func=verify)


def verify(args: argparse.Namespace) -> int:
    from pathlib import Path

    from app.provenance_files.c2pa_files import verify_file

    report = verify_file(Path(args.file), trust_anchors=Path(args.trust_anchors) if args.trust_anchors else None)
    for line in report.lines():
        print(line)
    return 0 if report.valid else 1
