"""`trainlab import-spill PATH [--tracking-uri URI]`: deliver a spill file into its runs.

A trial whose tracking server was still unreachable at its end leaves its metrics in
`<output_dir>/mlflow_spill.jsonl` (see trainlab.tracking.spill); this sends them, in order,
to the runs and server the records name (or to --tracking-uri, e.g. the server's new
address). Idempotent: progress is recorded after each batch (`PATH.delivered`), so an
import that stops halfway goes on where it stopped, and a second import adds nothing. The
file and its marker stay as a receipt; delete them when you like.
"""

from __future__ import annotations

import argparse
import os
import sys

from trainlab.redact import redact
from trainlab.tracking.delivery import SHORT_HTTP_RETRIES, Delivery, Unreachable
from trainlab.tracking.spill import Spill, SpillError, points
from trainlab.tracking.store import resolve_tracking_uri


def import_spill(path: str, *, tracking_uri: str | None = None, remove: bool = False) -> int:
    """Deliver what `path` still holds; returns the metric points delivered. `remove`: delete
    the file and its marker once all of it was delivered.

    Raises SpillError for a missing or malformed file (before sending anything) and
    Unreachable when the server stops answering (what was delivered stays delivered)."""
    spill = Spill(path)
    spill.check()
    delivery = Delivery(tracking_uri=tracking_uri)
    for record in spill.resumed_runs():
        delivery.send([record])
    sent = 0
    while chunk := spill.read():
        n = delivery.send([r for r, _ in chunk])
        spill.delivered(chunk[n - 1][1])
        sent += sum(points(r) for r, _ in chunk[:n])
    if remove:
        spill.finish()
    return sent


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="trainlab import-spill", description=__doc__.split("\n\n")[1])
    ap.add_argument("path", help="the spill file, e.g. outputs/.../mlflow_spill.jsonl")
    ap.add_argument("--tracking-uri", default=None,
                    help="deliver to this tracking server instead of the one the records name")
    args = ap.parse_args(argv)
    for k, v in SHORT_HTTP_RETRIES.items():
        os.environ.setdefault(k, v)
    try:
        records, _ = Spill(args.path).check()
        # the records name the server without its credentials: MLflow's client takes them from
        # MLFLOW_TRACKING_USERNAME / _PASSWORD, or from a --tracking-uri that holds them
        uri = resolve_tracking_uri(args.tracking_uri) if args.tracking_uri else None
        sent = import_spill(args.path, tracking_uri=uri)
    except (SpillError, ValueError) as e:
        print(f"error: {redact(str(e))}", file=sys.stderr)
        sys.exit(2)
    except Unreachable as e:
        print(f"error: the MLflow server did not answer ({redact(str(e))}); what was delivered is recorded, "
              f"run the same command again when it is back", file=sys.stderr)
        sys.exit(1)
    if not records:
        print(f"{args.path}: everything in it was delivered before; nothing to import")
        return
    print(f"delivered {records} records ({sent} metric points) from {args.path} "
          f"(progress in {args.path}.delivered: importing again adds nothing)")
