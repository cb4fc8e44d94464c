//! The results table of a sweep: one row per point, its parameters, then every scalar figure of
//! its report (dotted names, in the report's order: `waf`, `traffic.gc_user_pages`,
//! `latency_ns.write.p99`, `mapping.bytes` ...), written as CSV and as Parquet.

use crate::spec::Spec;
use crate::{Result, SweepError};
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::collections::HashMap;
use std::sync::Arc;

/// Report keys left out of the table: the configuration (its varied keys are the parameter
/// columns), the per-interval series and the latency CDF (lists, in each point's JSON), and the
/// version (part of every point's hash).
const SKIPPED: [&str; 4] = ["config", "series", "latency_cdf", "ftlab_version"];

/// One value of the table.
#[derive(Clone, Debug, PartialEq)]
pub enum Cell {
    Null,
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
}

/// What a column holds, from its cells: integers, numbers (integers and fractions), booleans, or
/// text (anything mixed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Int,
    Float,
    Bool,
    Str,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    pub names: Vec<String>,
    /// Row-major: `rows[i][j]` is row `i`'s value of column `names[j]`.
    pub rows: Vec<Vec<Cell>>,
}

impl Table {
    /// The table of `spec`'s points, `reports[i]` being point `i`'s JSON report.
    pub fn build(spec: &Spec, reports: &[String]) -> Result<Table> {
        assert_eq!(spec.points.len(), reports.len());
        let mut names: Vec<String> = ["point", "config_hash"].map(String::from).to_vec();
        names.extend(spec.parameters.iter().cloned());
        let fixed = names.len();
        let mut column_of: HashMap<String, usize> = HashMap::new();
        let mut figures: Vec<Vec<(usize, Cell)>> = Vec::with_capacity(reports.len());
        for (point, json) in spec.points.iter().zip(reports) {
            let mut flat = Vec::new();
            let mut de = serde_json::Deserializer::from_str(json);
            Flatten {
                prefix: String::new(),
                out: &mut flat,
            }
            .deserialize(&mut de)
            .map_err(|e| SweepError::BadReport {
                index: point.index,
                reason: e.to_string(),
            })?;
            let row = flat
                .into_iter()
                .map(|(name, cell)| {
                    let next = fixed + column_of.len();
                    (
                        *column_of.entry(name.clone()).or_insert_with(|| {
                            names.push(name);
                            next
                        }),
                        cell,
                    )
                })
                .collect();
            figures.push(row);
        }
        let mut rows = Vec::with_capacity(reports.len());
        for (point, figures) in spec.points.iter().zip(figures) {
            let mut row = vec![Cell::Null; names.len()];
            row[0] = Cell::Int(point.index as i64);
            row[1] = Cell::Str(point.hash.clone());
            for (j, v) in point.values.iter().enumerate() {
                row[2 + j] = toml_cell(v);
            }
            for (j, cell) in figures {
                row[j] = cell;
            }
            rows.push(row);
        }
        // A column null in every row (`power_loss` where nothing is persisted) says nothing.
        let keep: Vec<bool> = (0..names.len())
            .map(|j| j < fixed || rows.iter().any(|r| r[j] != Cell::Null))
            .collect();
        let names = names
            .into_iter()
            .zip(&keep)
            .filter_map(|(n, &k)| k.then_some(n))
            .collect();
        let rows = rows
            .into_iter()
            .map(|r| {
                r.into_iter()
                    .zip(&keep)
                    .filter_map(|(c, &k)| k.then_some(c))
                    .collect()
            })
            .collect();
        Ok(Table { names, rows })
    }

    pub fn kind(&self, column: usize) -> Kind {
        let mut kind = None;
        for row in &self.rows {
            let k = match &row[column] {
                Cell::Null => continue,
                Cell::Int(_) => Kind::Int,
                Cell::Float(_) => Kind::Float,
                Cell::Bool(_) => Kind::Bool,
                Cell::Str(_) => Kind::Str,
            };
            kind = Some(match (kind, k) {
                (None, k) => k,
                (Some(a), b) if a == b => a,
                (Some(Kind::Int | Kind::Float), Kind::Int | Kind::Float) => Kind::Float,
                _ => Kind::Str,
            });
        }
        kind.unwrap_or(Kind::Str)
    }

    /// The table as CSV: a header of the column names, then one line per point; a null is an
    /// empty field, a number in a column of fractions is written as one.
    pub fn to_csv(&self) -> Vec<u8> {
        let kinds: Vec<Kind> = (0..self.names.len()).map(|j| self.kind(j)).collect();
        let mut w = csv::Writer::from_writer(Vec::new());
        w.write_record(&self.names).expect("writing to memory");
        for row in &self.rows {
            w.write_record(row.iter().zip(&kinds).map(|(c, &k)| text(c, k)))
                .expect("writing to memory");
        }
        w.into_inner().expect("writing to memory")
    }

    /// The table as a Parquet file: one row group, a nullable column each (INT64, DOUBLE,
    /// BOOLEAN or UTF-8 text), uncompressed.
    pub fn to_parquet(&self) -> Result<Vec<u8>> {
        use parquet::basic::{LogicalType, Repetition, Type as Physical};
        use parquet::column::writer::ColumnWriter;
        use parquet::data_type::ByteArray;
        use parquet::file::properties::WriterProperties;
        use parquet::file::writer::SerializedFileWriter;
        use parquet::schema::types::Type;

        let kinds: Vec<Kind> = (0..self.names.len()).map(|j| self.kind(j)).collect();
        let fields = self
            .names
            .iter()
            .zip(&kinds)
            .map(|(name, kind)| {
                let (physical, logical) = match kind {
                    Kind::Int => (Physical::INT64, None),
                    Kind::Float => (Physical::DOUBLE, None),
                    Kind::Bool => (Physical::BOOLEAN, None),
                    Kind::Str => (Physical::BYTE_ARRAY, Some(LogicalType::String)),
                };
                Type::primitive_type_builder(name, physical)
                    .with_repetition(Repetition::OPTIONAL)
                    .with_logical_type(logical)
                    .build()
                    .map(Arc::new)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let schema = Arc::new(
            Type::group_type_builder("sweep")
                .with_fields(fields)
                .build()?,
        );
        let mut out = Vec::new();
        let mut writer =
            SerializedFileWriter::new(&mut out, schema, Arc::new(WriterProperties::new()))?;
        let mut group = writer.next_row_group()?;
        let mut j = 0;
        while let Some(mut column) = group.next_column()? {
            let cells = self.rows.iter().map(|r| &r[j]);
            let levels: Vec<i16> = cells.clone().map(|c| i16::from(*c != Cell::Null)).collect();
            match column.untyped() {
                ColumnWriter::Int64ColumnWriter(w) => {
                    let v: Vec<i64> = cells
                        .filter_map(|c| match c {
                            Cell::Int(i) => Some(*i),
                            _ => None,
                        })
                        .collect();
                    w.write_batch(&v, Some(&levels), None)?;
                }
                ColumnWriter::DoubleColumnWriter(w) => {
                    let v: Vec<f64> = cells.filter_map(number).collect();
                    w.write_batch(&v, Some(&levels), None)?;
                }
                ColumnWriter::BoolColumnWriter(w) => {
                    let v: Vec<bool> = cells
                        .filter_map(|c| match c {
                            Cell::Bool(b) => Some(*b),
                            _ => None,
                        })
                        .collect();
                    w.write_batch(&v, Some(&levels), None)?;
                }
                ColumnWriter::ByteArrayColumnWriter(w) => {
                    let v: Vec<ByteArray> = cells
                        .filter(|c| **c != Cell::Null)
                        .map(|c| ByteArray::from(text(c, Kind::Str).as_str()))
                        .collect();
                    w.write_batch(&v, Some(&levels), None)?;
                }
                _ => unreachable!("only the four kinds' writers are in the schema"),
            }
            column.close()?;
            j += 1;
        }
        group.close()?;
        writer.close()?;
        Ok(out)
    }
}

/// A cell as the CSV writes it in a column of `kind`.
fn text(cell: &Cell, kind: Kind) -> String {
    match cell {
        Cell::Null => String::new(),
        Cell::Int(i) if kind == Kind::Float => format!("{:?}", *i as f64),
        Cell::Int(i) => i.to_string(),
        // `{:?}` writes the shortest text that reads back as the same f64 (1e-7, 7.624, 3.0).
        Cell::Float(f) => format!("{f:?}"),
        Cell::Bool(b) => b.to_string(),
        Cell::Str(s) => s.clone(),
    }
}

fn number(cell: &Cell) -> Option<f64> {
    match cell {
        Cell::Int(i) => Some(*i as f64),
        Cell::Float(f) => Some(*f),
        _ => None,
    }
}

fn toml_cell(v: &toml::Value) -> Cell {
    match v {
        toml::Value::Integer(i) => Cell::Int(*i),
        toml::Value::Float(f) => Cell::Float(*f),
        toml::Value::Boolean(b) => Cell::Bool(*b),
        toml::Value::String(s) => Cell::Str(s.clone()),
        v => Cell::Str(v.to_string()),
    }
}

/// Collects a JSON document's scalars under their dotted paths, in document order (a
/// `serde_json::Value` would sort the keys). Lists are skipped: the table is one row a point.
struct Flatten<'a> {
    prefix: String,
    out: &'a mut Vec<(String, Cell)>,
}

impl<'de> DeserializeSeed<'de> for Flatten<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Flatten<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON report")
    }
    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        self.out.push((self.prefix, Cell::Bool(v)));
        Ok(())
    }
    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        self.out.push((self.prefix, Cell::Int(v)));
        Ok(())
    }
    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        let cell = i64::try_from(v).map_or(Cell::Float(v as f64), Cell::Int);
        self.out.push((self.prefix, cell));
        Ok(())
    }
    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        self.out.push((self.prefix, Cell::Float(v)));
        Ok(())
    }
    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        self.out.push((self.prefix, Cell::Str(v.to_string())));
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        self.out.push((self.prefix, Cell::Null));
        Ok(())
    }
    fn visit_none<E>(self) -> Result<(), E> {
        self.out.push((self.prefix, Cell::Null));
        Ok(())
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            if self.prefix.is_empty() && SKIPPED.contains(&key.as_str()) {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            let prefix = if self.prefix.is_empty() {
                key
            } else {
                format!("{}.{key}", self.prefix)
            };
            map.next_value_seed(Flatten {
                prefix,
                out: &mut *self.out,
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn spec(points: usize) -> Spec {
        let values: Vec<String> = (0..points)
            .map(|i| format!("{}", 0.07 + i as f64 / 100.0))
            .collect();
        Spec::parse(
            &format!(
                "[grid]\n\"capacity.over_provisioning\" = [{}]\n",
                values.join(", ")
            ),
            "t.toml",
            Path::new("/"),
        )
        .unwrap()
    }

    #[test]
    fn reports_flatten_in_order_and_columns_take_the_widest_kind() {
        let s = spec(2);
        let reports = [
            r#"{"ftlab_version":"x","waf":null,"requests":{"read":1,"write":2},"fdp":{"placements":[{"a":1}]},"mapping":{"table":"flat"},"config":{"a":1}}"#.to_string(),
            r#"{"ftlab_version":"x","waf":2.5,"requests":{"read":3,"write":4},"extra":true,"mapping":{"table":"flat"},"config":{"a":1}}"#.to_string(),
        ];
        let t = Table::build(&s, &reports).unwrap();
        assert_eq!(
            t.names,
            [
                "point",
                "config_hash",
                "capacity.over_provisioning",
                "waf",
                "requests.read",
                "requests.write",
                "mapping.table",
                "extra"
            ]
        );
        assert_eq!(t.rows[0][3], Cell::Null);
        assert_eq!(t.rows[1][3], Cell::Float(2.5));
        assert_eq!(t.kind(4), Kind::Int);
        assert_eq!(t.kind(3), Kind::Float);
        assert_eq!(t.rows[0][7], Cell::Null);
        let csv = String::from_utf8(t.to_csv()).unwrap();
        let mut lines = csv.lines();
        assert_eq!(
            lines.next().unwrap(),
            "point,config_hash,capacity.over_provisioning,waf,requests.read,requests.write,mapping.table,extra"
        );
        assert_eq!(
            lines.next().unwrap(),
            format!("0,{},0.07,,1,2,flat,", s.points[0].hash)
        );
    }

    #[test]
    fn a_column_null_everywhere_is_left_out() {
        let s = spec(1);
        let t = Table::build(&s, &[r#"{"power_loss":null,"waf":1.0}"#.to_string()]).unwrap();
        assert_eq!(t.names.last().unwrap(), "waf");
    }

    /// The Parquet file read back by the parquet crate's own reader (pyarrow reads it in the
    /// Python tests): every value where it was put.
    #[test]
    fn parquet_reads_back() {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let s = spec(3);
        let reports: Vec<String> = (0..3)
            .map(|i| {
                format!(
                    r#"{{"waf":{},"n":{i},"ok":{},"name":"p{i}"}}"#,
                    if i == 1 {
                        "null".to_string()
                    } else {
                        format!("{}.5", i)
                    },
                    i % 2 == 0
                )
            })
            .collect();
        let t = Table::build(&s, &reports).unwrap();
        let bytes = t.to_parquet().unwrap();
        let file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut &file, &bytes).unwrap();
        let reader = SerializedFileReader::new(file).unwrap();
        assert_eq!(reader.metadata().file_metadata().num_rows(), 3);
        let rows: Vec<String> = reader
            .get_row_iter(None)
            .unwrap()
            .map(|r| r.unwrap().to_string())
            .collect();
        assert!(rows[1].contains("waf: null"), "{}", rows[1]);
        assert!(rows[2].contains("waf: 2.5"), "{}", rows[2]);
        assert!(
            rows[2].contains("n: 2") && rows[2].contains("ok: true"),
            "{}",
            rows[2]
        );
        assert!(rows[0].contains(r#"name: "p0""#), "{}", rows[0]);
        assert!(
            rows[0].contains("capacity.over_provisioning: 0.07"),
            "{}",
            rows[0]
        );
    }
}
