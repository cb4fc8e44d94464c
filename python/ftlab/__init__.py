"""ftlab: a fast, deterministic software SSD, from Python.

The same Rust core as the ``ftlab`` command: a configuration simulated here gives the CLI's
report, figure for figure.

>>> import ftlab
>>> r = ftlab.simulate({"preset": "validation-uniform", "capacity.over_provisioning": 0.28})
>>> round(r["waf"], 2)                                      # doctest: +SKIP
2.46
>>> ftlab.series(r)[["time_ns", "waf"]].head()              # doctest: +SKIP
>>> ftlab.read_trace("../shared/traces/msr-hm0-sample.csv")  # doctest: +SKIP
>>> ftlab.sweep("sweeps/waf-vs-op.toml")                     # doctest: +SKIP
>>> ftlab.sweep("sweeps/waf-vs-op.toml", client=distributed.Client("tcp://host:8786"))  # doctest: +SKIP

A configuration is layered as the CLI's: a preset, then TOML files or texts, then dotted-key
overrides (docs/config.md lists every key).
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _ftlab

__version__: str = _ftlab.__version__

__all__ = [
    "Config",
    "simulate",
    "simulate_json",
    "series",
    "read_trace",
    "sweep",
    "presets",
    "desnoyers_greedy_waf",
]

PathLike = Union[str, "os.PathLike[str]"]


class Config:
    """A device and workload configuration: a preset, TOML layers, and dotted-key overrides.

    ``Config("hexa").set("ftl.write_buffer_mib", 1024)`` is ``ftlab sim --preset hexa --set
    ftl.write_buffer_mib=1024``. A Config is immutable: ``set`` and ``update`` return a new one.

    Args:
        preset: one of :func:`presets` (default ``femu``, the CLI's).
        files: TOML files merged over the preset, in order (``--config``).
        overrides: dotted keys (``"ftl.mapping"``) or nested mappings (``{"ftl": {...}}``).
    """

    def __init__(
        self,
        preset: str = "femu",
        files: Sequence[PathLike] = (),
        overrides: Optional[Mapping[str, Any]] = None,
        *,
        _texts: Sequence[str] = (),
        _sets: Sequence[Tuple[str, Any]] = (),
    ) -> None:
        self.preset = preset
        self.files: Tuple[str, ...] = tuple(os.fspath(f) for f in files)
        self._texts: Tuple[str, ...] = tuple(_texts)
        self._sets: Tuple[Tuple[str, Any], ...] = tuple(_sets) + tuple(_flatten(overrides or {}))
        # Refused here, naming the key, rather than at the first simulation.
        self.to_toml()

    @classmethod
    def from_toml(cls, text: str, preset: str = "femu") -> "Config":
        """A configuration given as TOML text, merged over ``preset``."""
        return cls(preset, _texts=(text,))

    def set(self, key: str, value: Any) -> "Config":
        """A copy with one dotted key set (``--set key=value``)."""
        return self.update({key: value})

    def update(self, overrides: Mapping[str, Any]) -> "Config":
        """A copy with several keys set (dotted or nested)."""
        return Config(self.preset, self.files, overrides, _texts=self._texts, _sets=self._sets)

    def to_toml(self, trace: Optional[PathLike] = None) -> str:
        """The fully resolved configuration as TOML (what ``ftlab config`` prints)."""
        return _ftlab.resolve(
            self.preset,
            list(self.files),
            list(self._texts),
            list(self._sets),
            None if trace is None else os.fspath(trace),
        )

    def to_dict(self, trace: Optional[PathLike] = None) -> Dict[str, Any]:
        """The fully resolved configuration as nested dicts (the report's ``config``)."""
        return json.loads(_ftlab.config_json(self.to_toml(trace)))

    @staticmethod
    def presets() -> Dict[str, str]:
        """The presets, name to description."""
        return presets()

    def __repr__(self) -> str:
        parts = [repr(self.preset)]
        if self.files:
            parts.append(f"files={list(self.files)!r}")
        if self._sets:
            parts.append(f"overrides={dict(self._sets)!r}")
        if self._texts:
            parts.append(f"<{len(self._texts)} TOML text layer(s)>")
        return f"Config({', '.join(parts)})"


def _flatten(mapping: Mapping[str, Any], prefix: str = "") -> List[Tuple[str, Any]]:
    out: List[Tuple[str, Any]] = []
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.extend(_flatten(value, name + "."))
        else:
            out.append((name, value))
    return out


ConfigLike = Union[Config, Mapping[str, Any], str, "os.PathLike[str]", None]


def _as_config(config: ConfigLike) -> Config:
    """None: the default; a Config; a dict of overrides (``"preset"`` may name the preset); a
    preset name; a TOML file's path; or TOML text."""
    if config is None:
        return Config()
    if isinstance(config, Config):
        return config
    if isinstance(config, Mapping):
        overrides = dict(config)
        preset = overrides.pop("preset", "femu")
        return Config(preset, overrides=overrides)
    if isinstance(config, os.PathLike):
        return Config(files=[config])
    if isinstance(config, str):
        if config in presets():
            return Config(config)
        if "\n" not in config and "=" not in config:
            if not Path(config).exists():
                raise FileNotFoundError(f"{config}: neither a preset ({', '.join(presets())}) nor a file")
            return Config(files=[config])
        return Config.from_toml(config)
    raise TypeError(f"config: expected a Config, dict, preset name, TOML file or text, not {type(config).__name__}")


def simulate_json(
    config: ConfigLike = None,
    trace: Optional[PathLike] = None,
    *,
    seed: Optional[int] = None,
) -> str:
    """The JSON report, as ``ftlab sim --json`` writes it (the same bytes for the same
    configuration). The GIL is released while the simulation runs, so threads can run several.

    Args:
        config: see :func:`simulate`.
        trace: a block trace to replay instead of the generator (``--trace``): starts on a fresh
            device unless the configuration sets ``workload.precondition``.
        seed: ``workload.seed`` (``--seed``).
    """
    c = _as_config(config)
    if seed is not None:
        c = c.set("workload.seed", seed)
    return _ftlab.simulate(c.to_toml(trace))


def simulate(
    config: ConfigLike = None,
    trace: Optional[PathLike] = None,
    *,
    seed: Optional[int] = None,
) -> Dict[str, Any]:
    """Simulates a configuration and returns its report as a dict (docs/report-schema.md).

    Args:
        config: a :class:`Config`; a dict of dotted or nested overrides, whose ``"preset"``
            names the preset; a preset name; a TOML file; TOML text; or None (the CLI's default
            job: FEMU-like 16 GiB SSD, 1 M random 4 KiB writes).
        trace: a block trace (msr, nbdkit, disksim, blkparse, fio; gzip or plain) to replay.
        seed: ``workload.seed``.
    """
    return json.loads(simulate_json(config, trace, seed=seed))


def series(report: Mapping[str, Any]) -> "pandas.DataFrame":  # noqa: F821
    """A report's time series (one row per ``report.series_interval_ns`` of simulated time:
    WAF, IOPS, latency, free superblocks ...) as a DataFrame."""
    import pandas

    rows = report["series"]
    frame = pandas.DataFrame([{k: v for k, v in r.items() if not isinstance(v, (list, dict))} for r in rows])
    return frame


_OPS = ("read", "write", "trim", "flush")


def read_trace(
    path: PathLike,
    format: Optional[str] = None,
    *,
    skip_bad_lines: bool = False,
) -> "pandas.DataFrame":  # noqa: F821
    """A block trace's requests, parsed by ftlab's readers (the format guessed from the content
    unless given): columns ``time_ns`` (from the first request), ``op`` (read, write, trim,
    flush), ``offset_bytes``, ``length_bytes``, ``reclaim_group``, ``handle`` (a write's FDP
    placement). ``df.attrs`` holds the format and the lines skipped."""
    import numpy
    import pandas

    raw = _ftlab.read_trace(os.fspath(path), format, skip_bad_lines)
    u64 = numpy.dtype("<u8")
    frame = pandas.DataFrame(
        {
            "time_ns": numpy.frombuffer(raw["time_ns"], dtype=u64),
            "op": pandas.Categorical.from_codes(numpy.frombuffer(raw["op"], dtype=numpy.uint8), _OPS),
            "offset_bytes": numpy.frombuffer(raw["offset_bytes"], dtype=u64),
            "length_bytes": numpy.frombuffer(raw["length_bytes"], dtype=u64),
            "reclaim_group": numpy.frombuffer(raw["reclaim_group"], dtype=numpy.uint8),
            "handle": numpy.frombuffer(raw["handle"], dtype=numpy.uint8),
        }
    )
    frame.attrs["format"] = raw["format"]
    frame.attrs["bad_lines_skipped"] = raw["bad_lines_skipped"]
    return frame


def _run_point(config_toml: str) -> str:
    """One sweep point, as a Dask task: the configuration in, the JSON report out."""
    return _ftlab.simulate(config_toml)


def _default_out(spec: PathLike) -> str:
    p = Path(spec)
    return str(p.with_name(p.stem + "-results"))


def sweep(
    spec: Union[PathLike, str],
    *,
    out: Optional[PathLike] = None,
    jobs: Optional[int] = None,
    client: Any = None,
    retries: int = 3,
    progress: bool = False,
) -> "pandas.DataFrame":  # noqa: F821
    """Runs a sweep file (docs/sweep.md) and returns its results table, one row per point.

    The points whose report is in ``out`` already are not run again (a report is named by the
    hash of its configuration and the ftlab version); the others run on ``jobs`` threads here
    (default: the cores), or, given a Dask ``client`` (a ``distributed.Client`` or a scheduler
    address), as Dask tasks on its workers, with ``retries`` retries when a worker dies. Each
    result is kept as it arrives, so an interrupted sweep resumes. ``out/results.csv`` and
    ``out/results.parquet`` are written at the end: the same table as ``ftlab sweep`` writes.

    Args:
        spec: a sweep file's path, or its TOML text (relative paths then from the current
            folder).
        out: the results folder (default: beside the sweep file, its name with ``-results``).
    """
    import pandas

    text = isinstance(spec, str) and "\n" in spec
    if out is None:
        if text:
            raise ValueError("a sweep given as text needs out=")
        out = _default_out(spec)
    s = _ftlab.Sweep(spec if text else os.fspath(spec), os.fspath(out), text)
    if client is None:
        s.run_here(jobs or os.cpu_count() or 1)
    else:
        _run_on_dask(s, client, retries, progress)
    return pandas.read_csv(io.StringIO(s.write_table()))


def _run_on_dask(s: "_ftlab.Sweep", client: Any, retries: int, progress: bool) -> None:
    import distributed

    own = isinstance(client, str)
    if own:
        client = distributed.Client(client)
    try:
        points = {index: (digest, described, config) for index, digest, described, config in s.points()}
        # One task per distinct configuration: two points with the same one share its report.
        by_hash: Dict[str, List[int]] = {}
        for index in s.pending():
            by_hash.setdefault(points[index][0], []).append(index)
        if not by_hash:
            return
        digests = list(by_hash)
        futures = client.map(
            _run_point,
            [points[by_hash[d][0]][2] for d in digests],
            key=[f"ftlab-point-{d}" for d in digests],
            retries=retries,
            pure=False,
        )
        index_of = {f.key: by_hash[d] for f, d in zip(futures, digests)}
        done = 0
        for future in distributed.as_completed(futures):
            report = future.result()
            for index in index_of[future.key]:
                s.save(index, report)
            done += 1
            if progress:
                first = index_of[future.key][0]
                print(f"[{done}/{len(futures)}] point {first}: {points[first][1]}", file=sys.stderr)
    finally:
        if own:
            client.close()


def presets() -> Dict[str, str]:
    """The built-in presets, name to description (``ftlab presets``)."""
    return dict(_ftlab.presets())


def desnoyers_greedy_waf(rho: float) -> float:
    """Greedy GC's WAF under uniform random writes at over-provisioning ``rho``, in the limit
    of large blocks (Desnoyers, SYSTOR 2012): the curve a WAF-vs-OP sweep is drawn against."""
    return _ftlab.desnoyers_greedy_waf(rho)
