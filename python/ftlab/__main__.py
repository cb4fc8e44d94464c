"""``python -m ftlab sweep SPEC [--dask ADDRESS]``: what ``ftlab sweep --dask`` runs."""

from __future__ import annotations

import argparse
import sys
import time

from . import _ftlab, sweep, _default_out


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ftlab",
        description="ftlab's Python package. `sweep` runs a sweep file here or on a Dask cluster "
        "(the same results folder and table as `ftlab sweep`).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("sweep", help="run a sweep file (docs/sweep.md)")
    p.add_argument("spec", help="the sweep file")
    p.add_argument("--out", help="the results folder (default: beside the file, NAME-results)")
    p.add_argument("--dask", metavar="ADDRESS", help="a Dask scheduler, e.g. tcp://host:8786")
    p.add_argument("--jobs", type=int, help="points at once without --dask (default: the cores)")
    p.add_argument("--quiet", "-q", action="store_true", help="no line per point")
    args = parser.parse_args(argv)
    out = args.out or _default_out(args.spec)
    started = time.monotonic()
    try:
        table = sweep(args.spec, out=out, jobs=args.jobs, client=args.dask, progress=not args.quiet)
    except (ValueError, OSError) as e:
        print(f"ftlab: error: {e}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(
            f"{len(table)} points in {time.monotonic() - started:.1f} s; table: {out}/results.csv, "
            f"{out}/results.parquet (ftlab {_ftlab.__version__})",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
