"""`swapcast config`: every setting with its environment variable, effective value, source and description."""

import argparse
import json
import sys


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser(
        "config",
        help="print every setting: environment variable, effective value, source, description (secrets masked)",
    )
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.add_argument("--changed", action="store_true", help="only settings set in the environment")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.settings_catalog import effective, unknown_warnings

    for line in unknown_warnings():
        print(line, file=sys.stderr)
    rows = [row for row in effective() if row.source != "default" or not args.changed]
    if args.json:
        out = [
            {
                "variable": row.setting.env,
                "group": row.setting.group,
                "value": row.value,
                "source": row.source,
                "description": row.setting.description,
            }
            for row in rows
        ]
        print(json.dumps(out, indent=2))
        return 0
    width = max((len(row.setting.env) for row in rows), default=0)
    group = ""
    for row in rows:
        if row.setting.group != group:
            print(f"\n[{row.setting.group}]" if group else f"[{row.setting.group}]")
            group = row.setting.group
        print(f"{row.setting.env:<{width}}  {row.value}  ({row.source})")
        print(f"{'':<{width}}  {row.setting.description}")
    return 0
