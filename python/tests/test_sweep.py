"""Sweeps: the same table serially, on two threads, on a Dask LocalCluster of two workers (one of
them killed midway), and from `ftlab sweep --dask`; an interrupted CLI sweep resumes without
re-running its finished points; bad sweep files are refused before anything runs."""

import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import distributed
import pandas
import pyarrow.parquet
import pytest

import ftlab
from conftest import ftlab_binary, run_cli

# 8 points: 2 over-provisioning x 2 workloads x 2 seeds, each a fraction of a second.
SPEC = """
seeds = 2
[base]
preset = "validation-uniform"
set = {{ "flash.blocks_per_die" = {blocks}, "workload.overwrites" = 0.5, "workload.precondition_overwrites" = 1 }}
[grid]
"capacity.over_provisioning" = [0.1, 0.25]
"workload.kind" = ["uniform", "hotcold"]
"""


def write_spec(folder: pathlib.Path, blocks: int = 512) -> pathlib.Path:
    path = folder / "s.toml"
    path.write_text(SPEC.format(blocks=blocks))
    return path


def reports(out: pathlib.Path):
    return sorted((out / "points").glob("*.json"))


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as c:
        yield c


def test_serial_two_threads_and_dask_give_one_table(tmp_path, cluster):
    spec = write_spec(tmp_path)
    run_cli("sweep", str(spec), "--jobs", "1", "--out", str(tmp_path / "serial"), "--quiet")
    run_cli("sweep", str(spec), "--jobs", "2", "--out", str(tmp_path / "two"), "--quiet")
    with distributed.Client(cluster) as client:
        df = ftlab.sweep(spec, out=tmp_path / "dask", client=client)
    local = ftlab.sweep(spec, out=tmp_path / "python", jobs=2)
    serial = (tmp_path / "serial/results.csv").read_bytes()
    for other in ("two", "dask", "python"):
        assert (tmp_path / other / "results.csv").read_bytes() == serial, other
        assert (tmp_path / other / "results.parquet").read_bytes() == (tmp_path / "serial/results.parquet").read_bytes()
    assert len(df) == 8
    pandas.testing.assert_frame_equal(df, local)
    # The Parquet file, read by pyarrow, holds what the CSV does.
    pq = pyarrow.parquet.read_table(tmp_path / "serial/results.parquet").to_pandas()
    pandas.testing.assert_frame_equal(pq, df, check_dtype=False)
    assert list(df.columns[:6]) == ["point", "config_hash", "capacity.over_provisioning", "workload.kind", "workload.seed", "waf"]
    assert {"latency_ns.write.p99", "traffic.gc_user_pages", "mapping.bytes", "erases", "iops"} <= set(df.columns)
    # Each point's report is the one `ftlab sim` writes for its configuration.
    point = df.iloc[5]
    cli = run_cli(
        "sim", "--preset", "validation-uniform", "--set", "flash.blocks_per_die=512", "--set", "workload.overwrites=0.5",
        "--set", "workload.precondition_overwrites=1", "--set", f"capacity.over_provisioning={point['capacity.over_provisioning']}",
        "--set", f"workload.kind={point['workload.kind']}", "--seed", str(point["workload.seed"]), "--quiet", "--json", "/dev/stdout",
    ).stdout
    assert (tmp_path / "serial/points" / f"{point['config_hash']}.json").read_text() == cli
    # Hot/cold and uniform differ, seeds differ: the table is not one point repeated.
    assert df["waf"].nunique() == 8


def test_a_worker_killed_mid_sweep_still_gives_the_full_table(tmp_path):
    spec = write_spec(tmp_path, blocks=4096)  # points of about a second
    reference = tmp_path / "reference"
    run_cli("sweep", str(spec), "--jobs", "2", "--out", str(reference), "--quiet")
    out = tmp_path / "dask"
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as client:
        pids = client.run(os.getpid)
        result = {}
        sweeper = threading.Thread(target=lambda: result.update(df=ftlab.sweep(spec, out=out, client=client)))
        sweeper.start()
        deadline = time.monotonic() + 120
        while not reports(out) and time.monotonic() < deadline:
            time.sleep(0.02)
        done_at_kill = len(reports(out))
        victim = sorted(pids.values())[0]
        os.kill(victim, signal.SIGKILL)
        sweeper.join(timeout=300)
        assert not sweeper.is_alive()
        assert 1 <= done_at_kill < 8, "the worker died with points still to run"
        assert victim not in client.run(os.getpid).values(), "the worker was killed (its nanny started another)"
    assert len(result["df"]) == 8
    assert (out / "results.csv").read_bytes() == (reference / "results.csv").read_bytes()


def test_an_interrupted_cli_sweep_resumes_without_rerunning(tmp_path):
    spec = write_spec(tmp_path, blocks=4096)
    out = tmp_path / "out"
    first = subprocess.Popen([ftlab_binary(), "sweep", str(spec), "--jobs", "1", "--out", str(out), "--quiet"])
    deadline = time.monotonic() + 120
    while len(reports(out)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)
    first.wait()
    kept = {p.name: p.stat().st_mtime_ns for p in reports(out)}
    assert 2 <= len(kept) < 8
    assert not (out / "results.csv").exists()
    again = run_cli("sweep", str(spec), "--jobs", "2", "--out", str(out))
    assert f"({8 - len(kept)} run, {len(kept)} done before)" in again.stderr, again.stderr
    for name, mtime in kept.items():
        assert (out / "points" / name).stat().st_mtime_ns == mtime, f"{name} ran again"
    assert len(pandas.read_csv(out / "results.csv")) == 8
    dry = run_cli("sweep", str(spec), "--out", str(out), "--dry-run").stdout
    assert "8 points, 0 to run" in dry


def test_the_cli_hands_a_dask_sweep_to_the_package(tmp_path, cluster):
    spec = write_spec(tmp_path)
    run_cli("sweep", str(spec), "--jobs", "2", "--out", str(tmp_path / "here"), "--quiet")
    env = dict(os.environ, FTLAB_PYTHON=sys.executable)
    done = subprocess.run(
        [ftlab_binary(), "sweep", str(spec), "--out", str(tmp_path / "dask"), "--dask", cluster.scheduler_address],
        capture_output=True, text=True, env=env,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "dask/results.csv").read_bytes() == (tmp_path / "here/results.csv").read_bytes()


BAD = [
    ('[grid]\n"ftl.bogus" = [1, 2]\n', ":2:", "ftl.bogus"),
    ('[base]\npreset = "femu"\n[grid]\n"capacity.over_provisioning" = []\n', ":4:", "no values"),
    ('[grid]\n"workload.kind" = ["uniform"]\n"workload.read_pcent" = [10, "half"]\n', ":3:", "workload.read_pcent"),
]


@pytest.mark.parametrize("text,line,key", BAD)
def test_bad_sweep_files_are_refused_before_any_point_runs(tmp_path, text, line, key):
    spec = tmp_path / "bad.toml"
    spec.write_text(text)
    out = tmp_path / "out"
    done = run_cli("sweep", str(spec), "--out", str(out), check=False)
    assert done.returncode == 1
    assert f"bad.toml{line}" in done.stderr and key in done.stderr, done.stderr
    assert not out.exists(), "nothing was run or created"
    with pytest.raises(ValueError, match=key):
        ftlab.sweep(spec, out=out)
