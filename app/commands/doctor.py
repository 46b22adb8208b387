"""`swapcast doctor`: one line per capability with its state and, where it is missing, the fix. Exit status 0
when `swapcast serve` (with the same options) can start, 1 when it cannot."""

import argparse
import json

from pydantic import ValidationError

from app.commands.options import add_serving_arguments
from app.errors import UserError, invalid_setting

SYMBOLS = {"ok": "ok     ", "missing": "missing", "warn": "warn   ", "fail": "FAIL   "}


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("doctor", help="what works on this machine and how to fix what does not; 0 when serve can start")
    add_serving_arguments(p)
    p.add_argument("--json", action="store_true", help="print a JSON list instead of lines")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.doctor import can_serve, run_checks
    from app.model_store import open_model_store
    from app.server.settings import ServerSettings
    from app.settings_catalog import unknown_warnings

    overrides = {"host": args.host, "port": args.port, "identity_dir": args.identity_dir}
    try:
        settings = ServerSettings.model_validate({k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        raise UserError(f"{invalid_setting(exc)} (`swapcast config` lists them)") from None
    checks = run_checks(settings, open_model_store(settings.models))
    ok = can_serve(checks)
    if args.json:
        print(json.dumps({"can_serve": ok, "checks": [vars(c) for c in checks]}, indent=2))
        return 0 if ok else 1
    width = max(len(c.name) for c in checks)
    for check in checks:
        fix = f"  -> {check.fix}" if check.fix and check.state != "ok" else ""
        print(f"{SYMBOLS[check.state]}  {check.name:<{width}}  {check.detail}{fix}")
    for line in unknown_warnings():
        print(line)
    print("swapcast serve can start" if ok else "swapcast serve cannot start: fix the FAIL lines above")
    return 0 if ok else 1
