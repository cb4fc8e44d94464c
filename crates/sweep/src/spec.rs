//! A sweep file: a base configuration and the axes it varies, expanded into points, every one
//! checked before any runs (docs/sweep.md is the format's reference).
//!
//! ```toml
//! seeds = 3                      # repetitions: workload.seed = 1, 2, 3 (or a list of seeds)
//! [base]
//! preset = "validation-uniform"  # then `config` files, then `trace`, then `set`
//! set = { "workload.overwrites" = 1 }
//! [grid]                         # every combination, the last axis varying fastest
//! "capacity.over_provisioning" = [0.07, 0.14, 0.28]
//! "workload.kind" = ["uniform", "hotcold"]
//! [zip]                          # one axis: the i-th values of every key together
//! "ftl.write_buffer_mib" = [0, 64]
//! "ftl.buffer_policy" = ["fifo", "hexa"]
//! ```

use crate::{io, Result, SweepError};
use ftlab_core::config::{Config, ConfigBuilder, ConfigError, DEFAULT_PRESET};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use toml::Spanned;

/// The sweep file's error, formatted: `spec_error!("{origin}:{line}: ...")`.
macro_rules! spec_error {
    ($($arg:tt)*) => { SweepError::Spec(format!($($arg)*)) };
}

/// Refuses the sweep file: returns the error `spec_error!` makes.
macro_rules! refuse {
    ($($arg:tt)*) => { return Err(spec_error!($($arg)*)) };
}

/// The keys whose string values are paths: relative ones are taken from the sweep file's folder.
const PATH_KEYS: [&str; 2] = ["workload.trace", "workload.placement_ranges"];

/// The most points a sweep file may expand to: every one is built and checked before any runs
/// (about 200 us each), and a table of more rows is past what one results folder should hold.
pub const MAX_POINTS: usize = 100_000;

/// The column (and config key) the `seeds` axis sets.
pub const SEED_KEY: &str = "workload.seed";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SpecFile {
    seeds: Option<Spanned<toml::Value>>,
    #[serde(default)]
    base: BaseFile,
    #[serde(default)]
    grid: BTreeMap<Spanned<String>, Spanned<toml::Value>>,
    #[serde(default)]
    zip: BTreeMap<Spanned<String>, Spanned<toml::Value>>,
    /// `[cases.AXIS]`: each case a name and the keys it sets together.
    #[serde(default)]
    cases: BTreeMap<Spanned<String>, BTreeMap<Spanned<String>, Spanned<toml::Value>>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct BaseFile {
    preset: Option<Spanned<String>>,
    #[serde(default)]
    config: Vec<Spanned<String>>,
    trace: Option<Spanned<String>>,
    #[serde(default)]
    set: BTreeMap<Spanned<String>, Spanned<toml::Value>>,
}

/// One simulation of a sweep.
#[derive(Clone, Debug)]
pub struct Point {
    /// Its place in the expansion (the table's row order).
    pub index: usize,
    /// The value of every parameter ([`Spec::parameters`]), in that order.
    pub values: Vec<toml::Value>,
    /// What names it in messages: `key=value, ...` ([`describe`]), or the name its maker gave.
    pub label: String,
    pub config: Config,
    /// [`config_hash`] of `config`: the name of its report, so that a point already run (by
    /// this sweep or another with the same configuration) is not run again.
    pub hash: String,
}

/// A sweep file, expanded and checked.
#[derive(Clone, Debug)]
pub struct Spec {
    /// The file (or `<text>` for a spec given as text).
    pub origin: String,
    /// The axes' columns, in expansion order: grid keys, zip keys, each cases axis's name,
    /// then `workload.seed`.
    pub parameters: Vec<String>,
    pub points: Vec<Point>,
}

/// A key of the file and the line it is on, for errors.
#[derive(Clone, Debug)]
struct Located {
    key: String,
    line: usize,
}

/// One axis: the columns it fills (its key for a grid axis or the seeds, its keys for `zip`,
/// its name for a cases axis) and its steps.
struct Axis {
    columns: Vec<Located>,
    steps: Vec<Step>,
    /// A cases axis: a step's keys are checked together (a case may need them all), not each
    /// alone on the base.
    cases: bool,
}

/// One step of an axis: its columns' values and the keys it sets (the columns themselves, but
/// for a case: its own keys).
struct Step {
    values: Vec<toml::Value>,
    sets: Vec<(Located, toml::Value)>,
}

impl Axis {
    /// An axis whose columns are the keys it sets: grid, zip, seeds.
    fn of_keys(keys: Vec<Located>, steps: Vec<Vec<toml::Value>>) -> Axis {
        let steps = steps
            .into_iter()
            .map(|values| Step {
                sets: keys.iter().cloned().zip(values.iter().cloned()).collect(),
                values,
            })
            .collect();
        Axis {
            columns: keys,
            steps,
            cases: false,
        }
    }

    /// The keys its steps set, each once, with the first line that sets it.
    fn keys(&self) -> Vec<&Located> {
        let mut keys: Vec<&Located> = Vec::new();
        for (k, _) in self.steps.iter().flat_map(|s| &s.sets) {
            if !keys.iter().any(|seen| seen.key == k.key) {
                keys.push(k);
            }
        }
        keys
    }
}

impl Spec {
    /// Reads and expands the sweep file at `path`.
    pub fn load(path: &Path) -> Result<Spec> {
        let text = std::fs::read_to_string(path).map_err(io(path))?;
        let folder = std::path::absolute(path)
            .map_err(io(path))?
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        Spec::parse(&text, &path.display().to_string(), &folder)
    }

    /// Expands a sweep given as text; `origin` names it in errors, relative paths are taken from
    /// `folder`.
    pub fn parse(text: &str, origin: &str, folder: &Path) -> Result<Spec> {
        let file: SpecFile = toml::from_str(text).map_err(|e| {
            let at = e
                .span()
                .map(|s| format!(":{}", line_of(text, s.start)))
                .unwrap_or_default();
            spec_error!("{origin}{at}: {}", e.message())
        })?;
        let line = |span: std::ops::Range<usize>| line_of(text, span.start);
        let here = |l: &Located| format!("{origin}:{}: `{}`", l.line, l.key);

        // The base: preset, files, trace, then `set`, as `ftlab sim` layers them.
        let preset = file
            .base
            .preset
            .as_ref()
            .map_or(DEFAULT_PRESET, |p| p.get_ref().as_str());
        let mut base = ConfigBuilder::from_preset(preset).map_err(|e| match &file.base.preset {
            Some(p) => spec_error!("{origin}:{}: base.preset: {e}", line(p.span())),
            None => e.into(),
        })?;
        if file.base.trace.is_some() {
            // As `ftlab sim --trace`: a trace starts on a fresh device unless asked otherwise.
            base.set("workload.precondition=false")?;
        }
        for c in &file.base.config {
            let p = folder.join(c.get_ref());
            base.merge_file(&p)
                .map_err(|e| spec_error!("{origin}:{}: base.config: {e}", line(c.span())))?;
        }
        if let Some(t) = &file.base.trace {
            let p = folder.join(t.get_ref());
            base.set_value(
                "workload.trace",
                toml::Value::String(p.display().to_string()),
            )?;
        }
        let mut sets = Vec::new();
        for (k, v) in &file.base.set {
            flatten(k.get_ref(), v.get_ref(), line(k.span()), &mut sets);
        }
        for (key, value, line) in sets {
            let located = Located { key, line };
            let value = resolve_path(&located.key, value, folder);
            base.set_value(&located.key, value.clone())
                .map_err(|e| spec_error!("{}: {e}", here(&located)))?;
            check_layer(&base, &located, &value)
                .map_err(|e| spec_error!("{origin}:{}: base.set {e}", located.line))?;
        }
        base.clone()
            .build()
            .map_err(|e| spec_error!("{origin}: the base configuration: {e}"))?;

        // The axes, grid keys in file order, then zip, then the seeds.
        let mut axes = Vec::new();
        let mut grid: Vec<_> = file.grid.iter().collect();
        grid.sort_by_key(|(k, _)| k.span().start);
        for (k, v) in grid {
            let key = Located {
                key: k.get_ref().clone(),
                line: line(k.span()),
            };
            let values = axis_values(v.get_ref(), &key, origin, "grid")?;
            axes.push(Axis::of_keys(
                vec![key],
                values.into_iter().map(|v| vec![v]).collect(),
            ));
        }
        let mut zip: Vec<_> = file.zip.iter().collect();
        zip.sort_by_key(|(k, _)| k.span().start);
        if !zip.is_empty() {
            let mut keys = Vec::new();
            let mut columns = Vec::new();
            for (k, v) in zip {
                let key = Located {
                    key: k.get_ref().clone(),
                    line: line(k.span()),
                };
                columns.push(axis_values(v.get_ref(), &key, origin, "zip")?);
                keys.push(key);
            }
            let n = columns[0].len();
            for (key, c) in keys.iter().zip(&columns).skip(1) {
                if c.len() != n {
                    refuse!(
                        "{}: zip lists must have one length: {} values here, {n} for `{}` \
                         (line {})",
                        here(key),
                        c.len(),
                        keys[0].key,
                        keys[0].line
                    );
                }
            }
            let steps = (0..n)
                .map(|i| columns.iter().map(|c| c[i].clone()).collect())
                .collect();
            axes.push(Axis::of_keys(keys, steps));
        }
        let mut cases: Vec<_> = file.cases.iter().collect();
        cases.sort_by_key(|(k, _)| k.span().start);
        for (name, table) in cases {
            let column = Located {
                key: name.get_ref().clone(),
                line: line(name.span()),
            };
            if table.is_empty() {
                refuse!(
                    "{origin}:{}: cases `{}`: the axis has no cases",
                    column.line,
                    column.key
                );
            }
            let mut named: Vec<_> = table.iter().collect();
            named.sort_by_key(|(k, _)| k.span().start);
            let mut steps = Vec::new();
            for (case, settings) in named {
                let at = line(case.span());
                let toml::Value::Table(settings) = settings.get_ref() else {
                    refuse!(
                        "{origin}:{at}: case `{}` of `{}`: a table of settings, e.g. \
                         {{ \"workload.kind\" = \"uniform\" }}",
                        case.get_ref(),
                        column.key
                    );
                };
                let mut flat = Vec::new();
                for (k, v) in settings {
                    flatten(k, v, at, &mut flat);
                }
                steps.push(Step {
                    values: vec![toml::Value::String(case.get_ref().clone())],
                    sets: flat
                        .into_iter()
                        .map(|(key, value, line)| (Located { key, line }, value))
                        .collect(),
                });
            }
            axes.push(Axis {
                columns: vec![column],
                steps,
                cases: true,
            });
        }
        if let Some(s) = &file.seeds {
            let key = Located {
                key: SEED_KEY.into(),
                line: line(s.span()),
            };
            let seeds: Vec<toml::Value> = match s.get_ref() {
                toml::Value::Integer(n) if (1..=MAX_POINTS as i64).contains(n) => {
                    (1..=*n).map(toml::Value::Integer).collect()
                }
                toml::Value::Integer(n) => {
                    refuse!(
                        "{origin}:{}: `seeds`: {n} is not a count in 1..={MAX_POINTS}",
                        key.line
                    )
                }
                v => axis_values(v, &key, origin, "seeds")?,
            };
            axes.push(Axis::of_keys(
                vec![key],
                seeds.into_iter().map(|v| vec![v]).collect(),
            ));
        }
        let mut seen: BTreeMap<&str, &Located> = BTreeMap::new();
        for k in axes.iter().flat_map(|a| a.keys()) {
            if let Some(first) = seen.insert(&k.key, k) {
                refuse!(
                    "{}: the key is an axis twice (also line {})",
                    here(k),
                    first.line
                );
            }
        }

        // Every value alone on the base: a key the configuration does not have, or a value of
        // the wrong type, is named with its line before anything runs.
        // A case's keys are set together, on one copy of the base.
        for axis in &mut axes {
            for step in &mut axis.steps {
                let mut b = base.clone();
                for (key, value) in step.sets.iter_mut() {
                    *value = resolve_path(&key.key, value.clone(), folder);
                    if !axis.cases {
                        b = base.clone();
                    }
                    b.set_value(&key.key, value.clone())
                        .map_err(|e| spec_error!("{}: {e}", here(key)))?;
                    check_layer(&b, key, value)
                        .map_err(|e| spec_error!("{origin}:{}: {e}", key.line))?;
                }
                if !axis.cases {
                    // The columns are the keys: they hold the values set, paths resolved.
                    for (column, (_, set)) in step.values.iter_mut().zip(&step.sets) {
                        *column = set.clone();
                    }
                }
            }
        }

        // The points: every combination of the axes' steps, the last axis varying fastest.
        let parameters: Vec<String> = axes
            .iter()
            .flat_map(|a| a.columns.iter().map(|k| k.key.clone()))
            .collect();
        let count = axes
            .iter()
            .try_fold(1usize, |n, a| n.checked_mul(a.steps.len()))
            .filter(|&n| n <= MAX_POINTS)
            .ok_or_else(|| spec_error!("{origin}: more than {MAX_POINTS} points"))?;
        let mut points = Vec::with_capacity(count);
        let mut odometer = vec![0usize; axes.len()];
        for index in 0..count {
            let mut builder = base.clone();
            let mut values = Vec::with_capacity(parameters.len());
            for (axis, &step) in axes.iter().zip(&odometer) {
                let step = &axis.steps[step];
                for (key, value) in &step.sets {
                    builder.set_value(&key.key, value.clone())?;
                }
                values.extend(step.values.iter().cloned());
            }
            let config = builder.build().map_err(|e| {
                // Name the axis that set the key the configuration refused, when one did.
                let culprit = match &e {
                    ConfigError::Invalid { key, .. } => axes
                        .iter()
                        .flat_map(|a| a.keys())
                        .find(|k| k.key == *key)
                        .map(|k| format!(":{}", k.line)),
                    _ => None,
                };
                spec_error!(
                    "{origin}{}: point {index} ({}): {e}",
                    culprit.unwrap_or_default(),
                    describe(&parameters, &values)
                )
            })?;
            let hash = config_hash(&config);
            points.push(Point {
                index,
                label: describe(&parameters, &values),
                values,
                config,
                hash,
            });
            for i in (0..axes.len()).rev() {
                odometer[i] += 1;
                if odometer[i] < axes[i].steps.len() {
                    break;
                }
                odometer[i] = 0;
            }
        }
        Ok(Spec {
            origin: origin.to_string(),
            parameters,
            points,
        })
    }
}

impl Spec {
    /// A sweep of configurations built elsewhere (a paper's grid in code: `ftlab experiment`),
    /// without axes: the points are run, kept and resumed as a sweep file's are.
    pub fn of_configs(origin: &str, configs: impl IntoIterator<Item = (String, Config)>) -> Spec {
        let points = configs
            .into_iter()
            .enumerate()
            .map(|(index, (label, config))| Point {
                index,
                label,
                values: Vec::new(),
                hash: config_hash(&config),
                config,
            })
            .collect();
        Spec {
            origin: origin.to_string(),
            parameters: Vec::new(),
            points,
        }
    }
}

/// `key=value, key=value` of a point, for messages and `--dry-run`.
pub fn describe(parameters: &[String], values: &[toml::Value]) -> String {
    if parameters.is_empty() {
        return "the base configuration".into();
    }
    parameters
        .iter()
        .zip(values)
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The name of a configuration's report: a hash of its resolved TOML and of the ftlab version,
/// so that another version's results are never taken for this one's.
pub fn config_hash(config: &Config) -> String {
    let text = format!("ftlab {}\n{}", env!("CARGO_PKG_VERSION"), config.to_toml());
    format!("{:016x}", twox_hash::XxHash3_64::oneshot(text.as_bytes()))
}

/// The 1-based line of byte `at`.
fn line_of(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// An axis' values: a non-empty list.
fn axis_values(
    value: &toml::Value,
    key: &Located,
    origin: &str,
    table: &str,
) -> Result<Vec<toml::Value>> {
    let here = format!("{origin}:{}: {table} `{}`", key.line, key.key);
    match value {
        toml::Value::Array(a) if a.is_empty() => refuse!("{here}: the axis has no values"),
        toml::Value::Array(a) => {
            if let Some(t) = a.iter().find(|v| matches!(v, toml::Value::Table(_))) {
                refuse!("{here}: a table ({t}) is not a value a key can take");
            }
            Ok(a.clone())
        }
        v => refuse!("{here}: expected a list of values, found {v} (write [{v}] for one value)"),
    }
}

/// `set`'s keys, nested tables flattened to dotted keys.
fn flatten(
    key: &str,
    value: &toml::Value,
    line: usize,
    out: &mut Vec<(String, toml::Value, usize)>,
) {
    match value {
        toml::Value::Table(t) => {
            for (k, v) in t {
                flatten(&format!("{key}.{k}"), v, line, out);
            }
        }
        v => out.push((key.to_string(), v.clone(), line)),
    }
}

/// A relative path value of a path key, taken from the sweep file's folder.
fn resolve_path(key: &str, value: toml::Value, folder: &Path) -> toml::Value {
    match value {
        toml::Value::String(s) if PATH_KEYS.contains(&key) && Path::new(&s).is_relative() => {
            toml::Value::String(PathBuf::from(folder).join(s).display().to_string())
        }
        v => v,
    }
}

/// Whether the configuration `builder` holds accepts `key`'s value as a key it has, of its type:
/// only such errors are the value's own (a range check may depend on another axis' value, and
/// waits for the point).
fn check_layer(builder: &ConfigBuilder, key: &Located, value: &toml::Value) -> Result<()> {
    match builder.clone().build() {
        Err(e @ ConfigError::Parse { .. }) | Err(e @ ConfigError::BadOverride(_)) => {
            refuse!("`{}` = {value}: {e}", key.key)
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Spec> {
        Spec::parse(text, "s.toml", Path::new("/sweeps"))
    }

    #[test]
    fn a_grid_a_zip_and_seeds_expand_in_order() {
        let spec = parse(
            "seeds = 2\n[base]\npreset = \"validation-uniform\"\n[grid]\n\
             \"capacity.over_provisioning\" = [0.07, 0.28]\n\"workload.kind\" = [\"uniform\", \"hotcold\", \"zipf\"]\n\
             [zip]\n\"ftl.write_buffer_mib\" = [0, 64]\n\"ftl.buffer_policy\" = [\"fifo\", \"hexa\"]\n",
        )
        .unwrap();
        assert_eq!(
            spec.parameters,
            [
                "capacity.over_provisioning",
                "workload.kind",
                "ftl.write_buffer_mib",
                "ftl.buffer_policy",
                "workload.seed"
            ]
        );
        assert_eq!(spec.points.len(), 2 * 3 * 2 * 2);
        let p = &spec.points[1];
        assert_eq!(
            p.label,
            "capacity.over_provisioning=0.07, workload.kind=\"uniform\", ftl.write_buffer_mib=0, \
             ftl.buffer_policy=\"fifo\", workload.seed=2"
        );
        assert_eq!(p.config.workload.seed, 2);
        let last = spec.points.last().unwrap();
        assert_eq!(last.config.capacity.over_provisioning, Some(0.28));
        assert_eq!(last.config.workload.kind, "zipf");
        assert_eq!(last.config.ftl.write_buffer_mib, 64.0);
        // Every point is another configuration, so another report.
        let hashes: std::collections::BTreeSet<_> = spec.points.iter().map(|p| &p.hash).collect();
        assert_eq!(hashes.len(), spec.points.len());
    }

    #[test]
    fn a_cases_axis_sets_each_cases_keys_together_and_names_it_in_its_column() {
        let spec = parse(
            "[base]\npreset = \"validation-uniform\"\n[grid]\n\"ftl.write_buffer_mib\" = [0, 64]\n\
             [cases.workload]\nrandom = { \"workload.kind\" = \"uniform\" }\n\
             hot = { \"workload.kind\" = \"hotcold\", \"workload.hot_space_pcent\" = 7.5 }\n",
        )
        .unwrap();
        assert_eq!(spec.parameters, ["ftl.write_buffer_mib", "workload"]);
        assert_eq!(spec.points.len(), 4);
        let p = &spec.points[1];
        assert_eq!(p.label, "ftl.write_buffer_mib=0, workload=\"hot\"");
        assert_eq!(p.config.workload.kind, "hotcold");
        assert_eq!(p.config.workload.hot_space_pcent, 7.5);
        // The case before it set none of its keys: the base's value stays.
        let base = &spec.points[0].config.workload;
        assert_eq!(base.kind, "uniform");
        assert_ne!(base.hot_space_pcent, 7.5);
        // A case's key on another axis too is refused, as any key on two axes.
        let e = parse(
            "[grid]\n\"workload.kind\" = [\"uniform\"]\n[cases.w]\na = { \"workload.kind\" = \"zipf\" }\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("s.toml:4: `workload.kind`: the key is an axis twice"),
            "{e}"
        );
        let e = parse("[cases.w]\na = 3\n").unwrap_err().to_string();
        assert!(
            e.contains("s.toml:2: case `a` of `w`: a table of settings"),
            "{e}"
        );
    }

    #[test]
    fn bad_files_are_refused_naming_key_and_line() {
        let cases = [
            ("[grid]\n\"ftl.bogus\" = [1, 2]\n", "s.toml:2:", "ftl.bogus"),
            (
                "[grid]\n\n\"capacity.over_provisioning\" = []\n",
                "s.toml:3:",
                "no values",
            ),
            (
                "[grid]\n\"capacity.over_provisioning\" = [0.1, \"lots\"]\n",
                "s.toml:2:",
                "capacity.over_provisioning",
            ),
            (
                "[grid]\n\"workload.kind\" = \"uniform\"\n",
                "s.toml:2:",
                "list of values",
            ),
            (
                "[grids]\n\"workload.kind\" = [\"uniform\"]\n",
                "s.toml:1:",
                "grids",
            ),
            (
                "[zip]\n\"ftl.write_buffer_mib\" = [0, 64]\n\"ftl.streams\" = [1]\n",
                "s.toml:3:",
                "one length",
            ),
            ("[base]\npreset = \"nope\"\n", "s.toml:2:", "nope"),
            (
                "[base]\nset = { \"flash.channel\" = 2 }\n",
                "s.toml:2:",
                "flash.channel",
            ),
            ("seeds = 0\n", "s.toml:1:", "seeds"),
            ("seeds = 100001\n", "s.toml:1:", "seeds"),
            (
                "[grid]\n\"workload.seed\" = [1]\n[zip]\n\"workload.seed\" = [2]\n",
                "s.toml:4:",
                "twice",
            ),
        ];
        for (text, at, names) in cases {
            let e = format!("{:#}", parse(text).unwrap_err());
            assert!(e.starts_with(at), "{text:?}: {e}");
            assert!(e.contains(names), "{text:?}: {e}");
        }
    }

    #[test]
    fn a_sweep_of_too_many_points_is_refused_before_any_is_built() {
        let values: Vec<String> = (1..=400).map(|i| i.to_string()).collect();
        let list = values.join(", ");
        let text = format!("[grid]\n\"workload.seed\" = [{list}]\n\"ftl.streams\" = [{list}]\n");
        let e = format!("{:#}", parse(&text).unwrap_err());
        assert!(e.contains("more than 100000 points"), "{e}");
    }

    #[test]
    fn a_point_the_configuration_refuses_names_the_axis() {
        let e = parse("[grid]\n\"workload.read_pcent\" = [10, 170]\n").unwrap_err();
        let e = format!("{e:#}");
        assert!(e.starts_with("s.toml:2: point 1"), "{e}");
        assert!(e.contains("percentage"), "{e}");
    }

    #[test]
    fn paths_are_taken_from_the_sweep_files_folder() {
        let spec = parse(
            "[base]\ntrace = \"t.csv\"\n[grid]\n\"workload.trace\" = [\"a.csv\", \"/x/b.csv\"]\n",
        )
        .unwrap();
        assert_eq!(
            spec.points[0].config.workload.trace.as_deref(),
            Some("/sweeps/a.csv")
        );
        assert_eq!(
            spec.points[1].config.workload.trace.as_deref(),
            Some("/x/b.csv")
        );
        assert!(!spec.points[0].config.workload.precondition);
    }

    #[test]
    fn no_axis_is_one_point_of_the_base() {
        let spec = parse("").unwrap();
        assert_eq!(spec.points.len(), 1);
        assert_eq!(
            spec.points[0].config,
            Config::from_preset(DEFAULT_PRESET).unwrap()
        );
    }
}
