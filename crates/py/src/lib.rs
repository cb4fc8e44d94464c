//! `ftlab._ftlab`, the native half of the `ftlab` Python package (python/ftlab): the same
//! configuration layering, simulation, trace readers and sweep store as the `ftlab` binary, so
//! that a report from Python is the CLI's byte for byte. Python-facing names and docstrings are
//! in python/ftlab/__init__.py; this module is its engine. The GIL is released while anything
//! long runs (a simulation, a sweep's points, a trace's parsing).

use ftlab_core::config::{ConfigBuilder, PRESETS};
use ftlab_core::request::Op;
use ftlab_sim::trace::{TraceFormat, TraceReader};
use ftlab_sweep::{Spec, Store};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use std::path::Path;

fn error(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("{e:#}"))
}

/// A Python value as a TOML value: bool, int, float, str, and lists of them.
fn toml_value(key: &str, v: &Bound<'_, PyAny>) -> PyResult<toml::Value> {
    // bool before int: Python's bool is an int.
    if v.is_instance_of::<PyBool>() {
        return Ok(toml::Value::Boolean(v.extract()?));
    }
    if v.is_instance_of::<PyInt>() {
        let i: i64 = v
            .extract()
            .map_err(|_| PyValueError::new_err(format!("`{key}`: {v} is not a 64-bit integer")))?;
        return Ok(toml::Value::Integer(i));
    }
    if v.is_instance_of::<PyFloat>() {
        return Ok(toml::Value::Float(v.extract()?));
    }
    if v.is_instance_of::<PyString>() {
        return Ok(toml::Value::String(v.extract()?));
    }
    if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() {
        let items = v
            .try_iter()?
            .map(|item| toml_value(key, &item?))
            .collect::<PyResult<Vec<_>>>()?;
        return Ok(toml::Value::Array(items));
    }
    Err(PyTypeError::new_err(format!(
        "`{key}`: a {} is not a configuration value (bool, int, float, str or a list)",
        v.get_type().name()?
    )))
}

/// The resolved configuration's TOML: `preset`, then (with a trace, as `ftlab sim --trace`)
/// `workload.precondition = false`, then each TOML file of `files`, each TOML text of `texts`,
/// each (dotted key, value) of `sets`, then the trace.
#[pyfunction]
#[pyo3(signature = (preset, files, texts, sets, trace=None))]
fn resolve(
    preset: &str,
    files: Vec<String>,
    texts: Vec<String>,
    sets: Vec<(String, Bound<'_, PyAny>)>,
    trace: Option<String>,
) -> PyResult<String> {
    let mut b = ConfigBuilder::from_preset(preset).map_err(error)?;
    if trace.is_some() {
        b.set("workload.precondition=false").map_err(error)?;
    }
    for f in &files {
        b.merge_file(Path::new(f)).map_err(error)?;
    }
    for (i, t) in texts.iter().enumerate() {
        b.merge_str(t, &format!("TOML layer {}", i + 1))
            .map_err(error)?;
    }
    for (key, value) in &sets {
        b.set_value(key, toml_value(key, value)?).map_err(error)?;
    }
    if let Some(t) = trace {
        b.set_value("workload.trace", toml::Value::String(t))
            .map_err(error)?;
    }
    Ok(b.build().map_err(error)?.to_toml())
}

fn config_of(toml_text: &str) -> PyResult<ftlab_core::Config> {
    ConfigBuilder::from_toml(toml_text, "the configuration")
        .and_then(ConfigBuilder::build)
        .map_err(error)
}

/// The JSON report of the configuration `config_toml` (a resolved one), simulated without the
/// GIL.
#[pyfunction]
fn simulate(py: Python<'_>, config_toml: &str) -> PyResult<String> {
    let config = config_of(config_toml)?;
    py.detach(|| ftlab_sweep::run::simulate(&config))
        .map_err(error)
}

/// A trace's requests as little-endian columns (`time_ns`, `offset_bytes`, `length_bytes`:
/// u64; `op`: u8, 0 read 1 write 2 trim 3 flush; `reclaim_group`, `handle`: u8), the format
/// used and the lines skipped.
#[pyfunction]
#[pyo3(signature = (path, format=None, skip_bad_lines=false))]
fn read_trace<'py>(
    py: Python<'py>,
    path: &str,
    format: Option<&str>,
    skip_bad_lines: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let format = format
        .map(TraceFormat::parse)
        .transpose()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let parsed = py.detach(|| -> Result<_, ftlab_sim::trace::TraceError> {
        let mut reader = TraceReader::open(Path::new(path), format, skip_bad_lines)?;
        let mut c: [Vec<u8>; 6] = Default::default();
        while let Some(r) = reader.next_request()? {
            c[0].extend_from_slice(&r.arrival_ns.to_le_bytes());
            c[1].push(match r.op {
                Op::Read => 0,
                Op::Write => 1,
                Op::Trim => 2,
                Op::Flush => 3,
            });
            c[2].extend_from_slice(&r.offset_bytes.to_le_bytes());
            c[3].extend_from_slice(&r.length_bytes.to_le_bytes());
            c[4].push(r.placement.reclaim_group);
            c[5].push(r.placement.handle);
        }
        Ok((c, reader.format().name(), reader.bad_lines()))
    });
    let (columns, format, bad) = parsed.map_err(error)?;
    let d = PyDict::new(py);
    for (name, bytes) in [
        "time_ns",
        "op",
        "offset_bytes",
        "length_bytes",
        "reclaim_group",
        "handle",
    ]
    .iter()
    .zip(&columns)
    {
        d.set_item(*name, PyBytes::new(py, bytes))?;
    }
    d.set_item("format", format)?;
    d.set_item("bad_lines_skipped", bad)?;
    Ok(d)
}

/// The presets: (name, what it is).
#[pyfunction]
fn presets() -> Vec<(&'static str, &'static str)> {
    PRESETS.iter().map(|p| (p.name, p.summary)).collect()
}

/// Desnoyers' greedy-GC WAF under uniform writes at over-provisioning `rho`.
#[pyfunction]
fn desnoyers_greedy_waf(rho: f64) -> PyResult<f64> {
    if !(rho > 0.0 && rho.is_finite()) {
        return Err(PyValueError::new_err(format!(
            "over-provisioning {rho} must be > 0"
        )));
    }
    Ok(ftlab_sim::analytic::desnoyers_greedy_waf(rho))
}

/// A sweep file expanded, and the folder its reports and table are kept in.
#[pyclass(frozen)]
struct Sweep {
    spec: Spec,
    store: Store,
}

#[pymethods]
impl Sweep {
    /// `spec` is a sweep file's path, or (with `text`) its TOML, whose relative paths are then
    /// taken from `folder`.
    #[new]
    #[pyo3(signature = (spec, out, text=false, folder=None))]
    fn new(spec: &str, out: &str, text: bool, folder: Option<&str>) -> PyResult<Self> {
        let spec = if text {
            let folder = std::path::absolute(folder.unwrap_or(".")).map_err(error)?;
            Spec::parse(spec, "<sweep text>", &folder)
        } else {
            Spec::load(Path::new(spec))
        }
        .map_err(error)?;
        let store = Store::open(Path::new(out)).map_err(error)?;
        Ok(Sweep { spec, store })
    }

    #[getter]
    fn parameters(&self) -> Vec<String> {
        self.spec.parameters.clone()
    }

    #[getter]
    fn out(&self) -> String {
        self.store.dir().display().to_string()
    }

    /// Every point: (index, hash, "key=value, ...", resolved configuration TOML).
    fn points(&self) -> Vec<(usize, String, String, String)> {
        self.spec
            .points
            .iter()
            .map(|p| (p.index, p.hash.clone(), p.label.clone(), p.config.to_toml()))
            .collect()
    }

    /// The indices of the points without a report yet.
    fn pending(&self, py: Python<'_>) -> Vec<usize> {
        py.detach(|| {
            self.store
                .pending(&self.spec)
                .iter()
                .map(|p| p.index)
                .collect()
        })
    }

    /// Keeps point `index`'s JSON report (a Dask worker's result), after checking that it is a
    /// report of that point's configuration.
    fn save(&self, index: usize, json: &str) -> PyResult<()> {
        let point = self
            .spec
            .points
            .get(index)
            .ok_or_else(|| PyValueError::new_err(format!("no point {index}")))?;
        let report: ftlab_sim::Report = serde_json_from_str(json)?;
        if report.config != point.config {
            return Err(PyValueError::new_err(format!(
                "the report given for point {index} is of another configuration"
            )));
        }
        self.store.save(point, json).map_err(error)
    }

    /// Runs the pending points on `jobs` threads of this process, without the GIL; returns how
    /// many ran.
    fn run_here(&self, py: Python<'_>, jobs: usize) -> PyResult<usize> {
        let ran = std::sync::atomic::AtomicUsize::new(0);
        py.detach(|| {
            ftlab_sweep::run::run_here(&self.spec, &self.store, jobs, &|f| {
                if f.ran {
                    ran.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            })
        })
        .map_err(error)?;
        Ok(ran.into_inner())
    }

    /// Writes results.csv and results.parquet from the kept reports; returns the CSV text.
    fn write_table(&self, py: Python<'_>) -> PyResult<String> {
        let table = py
            .detach(|| self.store.write_table(&self.spec))
            .map_err(error)?;
        String::from_utf8(table.to_csv()).map_err(error)
    }
}

fn serde_json_from_str(json: &str) -> PyResult<ftlab_sim::Report> {
    serde_json::from_str(json).map_err(|e| error(format!("not an ftlab report: {e}")))
}

#[pymodule]
fn _ftlab(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(resolve, m)?)?;
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    m.add_function(wrap_pyfunction!(read_trace, m)?)?;
    m.add_function(wrap_pyfunction!(presets, m)?)?;
    m.add_function(wrap_pyfunction!(desnoyers_greedy_waf, m)?)?;
    m.add_function(wrap_pyfunction!(config_json, m)?)?;
    m.add_class::<Sweep>()?;
    Ok(())
}

/// A resolved configuration as JSON (what Python's `Config.to_dict` returns).
#[pyfunction]
fn config_json(config_toml: &str) -> PyResult<String> {
    serde_json::to_string(&config_of(config_toml)?).map_err(error)
}
