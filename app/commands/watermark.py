"""`swapcast watermark detect FILE|rtsp://...`: read the invisible mark and say which output it was issued to.

Exit status: 0 found, 1 not found, 2 error."""

import argparse

FOUND, NOT_FOUND = 0, 1


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("watermark", help="read the invisible watermark of a file or an RTSP stream")
    actions = p.add_subparsers(dest="action", required=True)
    d = actions.add_parser("detect", help="print the payload, its confidence and the session it maps to")
    d.add_argument("source", help="video or image file, or rtsp:// URL")
    d.add_argument("--seconds", type=float, default=10.0, help="how much video to read (default 10)")
    d.set_defaults(func=detect)


def detect(args: argparse.Namespace) -> int:
    from app.provenance.service import Provenance
    from app.provenance_files.scan import scan

    provenance = Provenance()
    result = scan(args.source, provenance.code, seconds=args.seconds)
    best = result.best
    print(f"read {result.windows} one-second window(s) of {result.source}")
    if not best.found or best.payload is None:
        print(
            f"no watermark found (best statistic {best.statistic:.1f}, needs {best.threshold:.1f}; "
            f"false-positive probability at that level {best.false_positive_p:.2g})"
        )
        return NOT_FOUND
    payload = best.payload
    print(f"payload: {payload.hex()} (server {payload.server_id}, mark {payload.mark_id}, hour {payload.hour})")
    print(
        f"confidence: {best.confidence:.1f} (false-positive probability {best.false_positive_p:.2g} per second of "
        f"video; statistic {best.statistic:.1f}, scale {best.scale:.3g}, {best.frames} frames)"
    )
    records = provenance.registry.lookup(payload)
    if not records:
        print(f"issued to: unknown here (not in {provenance.registry.path})")
    for record in records:
        print(
            f"issued to: {record.kind} {record.ref}, identity {record.identity or '-'}, owner {record.owner or '-'}, "
            f"at {record.issued}"
        )
    return FOUND
