"""What a Dask LocalCluster adds per sweep point: the same sweep of N short points run in this
process on one thread (ftlab.sweep(jobs=1)) and through a LocalCluster of one worker process with
one thread, alternating, ROUNDS times, each into a fresh folder; (cluster - here) / N is the
overhead per point (task submission, pickling the configuration and the report, the scheduler's
round trips, saving). The cluster is started once, before timing, as a user's would be.

    target/pyenv/bin/python scripts/bench-dask.py [--points 64] [--rounds 3]
"""

import argparse
import statistics
import sys
import tempfile
import time

import distributed

import ftlab

SPEC = """
seeds = {points}
[base]
preset = "validation-uniform"
set = {{ "flash.blocks_per_die" = 64, "workload.overwrites" = 0.5, "workload.precondition_overwrites" = 1 }}
"""


def timed(spec: str, **how) -> float:
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        table = ftlab.sweep(spec, out=out, **how)
        seconds = time.perf_counter() - started
    assert table["waf"].notna().all()
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    spec = SPEC.format(points=args.points)
    here, dask = [], []
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as client:
        timed(spec, client=client)  # the worker imports ftlab once, as it would in any sweep
        for r in range(args.rounds):
            here.append(timed(spec, jobs=1))
            dask.append(timed(spec, client=client))
            print(f"round {r + 1}: here {here[-1]:.3f} s, LocalCluster {dask[-1]:.3f} s", file=sys.stderr)
    h, d = statistics.median(here), statistics.median(dask)
    print(f"{args.points} points: median here {h:.3f} s ({1000 * h / args.points:.1f} ms a point), "
          f"LocalCluster {d:.3f} s: overhead {1000 * (d - h) / args.points:.1f} ms a point")
    return 0


if __name__ == "__main__":
    sys.exit(main())
