"""`swapcast keys create|list|revoke`: API keys for the server. A new key is printed once and never stored."""

import argparse
from pathlib import Path

from app.errors import UserError


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("keys", help="create, list and revoke API keys for the server")
    p.add_argument("--keys-file", type=Path, default=None, help="the keys file (default SWAPCAST_KEYS_FILE)")
    actions = p.add_subparsers(dest="keys_action", required=True)
    create = actions.add_parser("create", help="create a key and print it once")
    create.add_argument("name", help="who or what uses the key (owns what it creates)")
    create.add_argument(
        "--scope",
        action="append",
        default=[],
        metavar="SCOPE",
        help="repeat for several: identities:write, identities:read, sessions, streams, metrics, admin",
    )
    actions.add_parser("list", help="list keys (ids, names, scopes; never the keys)")
    revoke = actions.add_parser("revoke", help="revoke a key by id, or every active key of a name")
    revoke.add_argument("key", help="key id or name")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.auth.keys import KeyStore, KeyStoreError
    from app.auth.scopes import ALL_SCOPES, unknown_scopes
    from app.auth.settings import AccessSettings

    store = KeyStore(args.keys_file or AccessSettings().keys_file)
    try:
        if args.keys_action == "create":
            unknown = unknown_scopes(args.scope)
            if unknown:
                raise UserError(f"unknown scope {unknown[0]!r}; choose from: {', '.join(ALL_SCOPES)}")
            record, key = store.create(args.name, args.scope)
            print(key)
            print(
                f"created key {record.id} for {record.name} with {', '.join(record.scopes)}; "
                f"it is shown only now (stored as a salted hash in {store.path})"
            )
        elif args.keys_action == "list":
            records = store.records()
            if not records:
                print(f"no keys in {store.path}")
            for r in records:
                status = f"revoked {r.revoked}" if r.revoked else "active"
                print(f"{r.id}  {r.name:<20} {','.join(r.scopes):<40} created {r.created}  {status}")
        else:
            for r in store.revoke(args.key):
                print(f"revoked key {r.id} ({r.name}); a running server ends its sessions, streams and viewers")
            if not store.has_active():
                print(
                    "that was the last active key: a server using this keys file now refuses every request "
                    "(401) until a key is created with `swapcast keys create NAME --scope ...`; it does not "
                    "fall back to local mode"
                )
    except KeyStoreError as exc:
        raise UserError(str(exc)) from None
    return 0
