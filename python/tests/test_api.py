"""The package against the CLI: the same configuration gives the same report, byte for byte; the
trace readers against an independent parse; the GIL released while simulating."""

import csv
import json
import subprocess
import sys
import threading
import time

import pytest

import ftlab
from conftest import ROOT, run_cli

# A small steady-state job: 64 Ki pages, GC running, a second or less.
SMALL = {
    "preset": "validation-uniform",
    "flash.blocks_per_die": 256,
    "workload.overwrites": 1,
    "workload.precondition_overwrites": 2,
}
SMALL_SETS = [
    "--preset",
    "validation-uniform",
    "--set",
    "flash.blocks_per_die=256",
    "--set",
    "workload.overwrites=1",
    "--set",
    "workload.precondition_overwrites=2",
]


def test_a_generator_report_is_the_clis_byte_for_byte(tmp_path):
    out = tmp_path / "cli.json"
    run_cli("sim", *SMALL_SETS, "--quiet", "--json", str(out))
    cli = out.read_text()
    assert ftlab.simulate_json(SMALL) == cli
    as_dict = ftlab.simulate(SMALL)
    assert as_dict == json.loads(cli)
    assert json.dumps(as_dict, sort_keys=True) == json.dumps(json.loads(cli), sort_keys=True)
    assert as_dict["waf"] > 1.5, "the job ran GC"
    # The same configuration built as a Config, a nested dict, and TOML text.
    c = ftlab.Config("validation-uniform").update(
        {"flash": {"blocks_per_die": 256}, "workload.overwrites": 1, "workload.precondition_overwrites": 2}
    )
    assert ftlab.simulate_json(c) == cli
    assert ftlab.simulate_json(c.to_toml()) == cli


def test_a_trace_report_is_the_clis_byte_for_byte(tmp_path, traces):
    trace = str(traces / "msr-hm0-sample.csv")
    out = tmp_path / "cli.json"
    run_cli("sim", "--trace", trace, "--wrap", "--set", "capacity.logical_bytes=1073741824", "--quiet", "--json", str(out))
    cli = out.read_text()
    config = {"workload.wrap": True, "capacity.logical_bytes": 1073741824}
    assert ftlab.simulate_json(config, trace=trace) == cli
    report = ftlab.simulate(config, trace=trace)
    assert report["trace"]["requests"] == 1000
    assert report["config"]["workload"]["precondition"] is False, "a trace starts on a fresh device"


def test_the_default_config_is_the_clis(ftlab_bin):
    printed = subprocess.run([ftlab_bin, "config", "--preset", "hexa"], capture_output=True, text=True, check=True).stdout
    assert printed.startswith(ftlab.Config("hexa").to_toml())
    assert ftlab.Config().to_dict()["flash"]["channels"] == 8


def test_bad_configurations_name_the_key():
    with pytest.raises(ValueError, match="ftl.bogus|bogus"):
        ftlab.Config().set("ftl.bogus", 1)
    with pytest.raises(ValueError, match="preset"):
        ftlab.Config("nope")
    with pytest.raises(TypeError, match="flash.channels"):
        ftlab.Config().set("flash.channels", object())
    with pytest.raises(FileNotFoundError):
        ftlab.simulate("no-such-preset-or-file")


def test_series_is_a_dataframe():
    r = ftlab.simulate(SMALL)
    s = ftlab.series(r)
    assert len(s) == len(r["series"]) > 1
    assert {"end_ns", "waf", "host_write_pages"} <= set(s.columns)
    assert s["end_ns"].is_monotonic_increasing


def _msr_rows(path):
    with open(path) as f:
        rows = list(csv.reader(f))
    return [r for r in rows[1:]]


def test_read_trace_matches_an_independent_parse_of_msr(traces):
    path = traces / "msr-hm0-sample.csv"
    df = ftlab.read_trace(path)
    rows = _msr_rows(path)
    assert df.attrs["format"] == "msr"
    assert len(df) == len(rows)
    assert list(df["offset_bytes"]) == [int(r[4]) for r in rows]
    assert list(df["length_bytes"]) == [int(r[5]) for r in rows]
    assert list(df["op"].astype(str)) == [r[3].lower() for r in rows]
    # Windows file-time ticks of 100 ns, from the first request (never going back in time).
    t0 = int(rows[0][0])
    expected = []
    last = 0
    for r in rows:
        last = max(last, (int(r[0]) - t0) * 100)
        expected.append(last)
    assert list(df["time_ns"]) == expected


def test_read_trace_reads_every_format(tmp_path, traces):
    """Each of the five formats: as many requests as the simulator replays from it."""
    blk = tmp_path / "t.blkparse"
    blk.write_text(
        "  8,0    3        1     0.000000000   697  Q   W 223490 + 8 [kjournald]\n"
        "  8,0    3        2     0.000100000   697  Q   R 100 + 16 [cat]\n"
        "259,0 1 9 1.5 100 Q DS 2048 + 2048 [fstrim]\n"
    )
    fio = tmp_path / "t.iolog"
    fio.write_text("fio version 2 iolog\n/dev/x add\n/dev/x open\n/dev/x write 0 4096\n/dev/x read 8192 8192\n/dev/x close\n")
    disksim = tmp_path / "t.disksim"
    subprocess.run(
        [sys.executable, str(traces.parent / "tools/gen_disksim_trace.py"), "--kind", "rand4k",
         "--span-bytes", str(1 << 24), "--n", "500", "--out", str(disksim)],
        check=True,
    )
    cases = [
        (traces / "msr-rsrch0-sample.csv", "msr"),
        (traces / "pgbench.nbdlog.gz", "nbdkit"),
        (disksim, "disksim"),
        (blk, "blkparse"),
        (fio, "fio"),
    ]
    for path, fmt in cases:
        df = ftlab.read_trace(path)
        assert df.attrs["format"] == fmt, path
        report = ftlab.simulate({"workload.wrap": True, "capacity.logical_bytes": 1 << 30}, trace=path)
        assert len(df) == report["trace"]["requests"], path
        assert (df["time_ns"].diff().dropna() >= 0).all()
    blk_df = ftlab.read_trace(blk)
    assert list(blk_df["op"].astype(str)) == ["write", "read", "trim"]
    assert list(blk_df["offset_bytes"]) == [223490 * 512, 100 * 512, 2048 * 512]
    bad = tmp_path / "bad.iolog"
    bad.write_text("fio version 2 iolog\n/dev/x add\n/dev/x open\n/dev/x write zero 4096\n")
    with pytest.raises(ValueError, match=r"bad\.iolog:4: field `offset`"):
        ftlab.read_trace(bad, format="fio")


def test_the_gil_is_released_while_simulating():
    """A Python thread keeps running while another simulates: the longest pause it sees is a
    small part of the simulation's time (with the GIL held it would be all of it)."""
    config = dict(SMALL, **{"flash.blocks_per_die": 2048, "workload.overwrites": 2})
    stop = threading.Event()
    stamps = []

    def spin():
        while not stop.is_set():
            stamps.append(time.perf_counter())
            time.sleep(0.0005)

    t = threading.Thread(target=spin)
    t.start()
    time.sleep(0.05)
    begin = time.perf_counter()
    ftlab.simulate(config)
    end = time.perf_counter()
    stop.set()
    t.join()
    during = [s for s in stamps if begin <= s <= end]
    gaps = [b - a for a, b in zip([begin] + during, during + [end])]
    assert end - begin > 0.3, "the job is long enough to tell"
    assert max(gaps) < (end - begin) / 3, f"the thread paused {max(gaps):.3f} s of {end - begin:.3f} s"


def test_desnoyers_and_presets():
    assert abs(ftlab.desnoyers_greedy_waf(0.07) - 7.82) < 0.01
    assert set(ftlab.presets()) == {"femu", "hexa", "femu-fdp", "validation-uniform"}
    with pytest.raises(ValueError):
        ftlab.desnoyers_greedy_waf(0)
