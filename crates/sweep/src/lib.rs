//! Parameter sweeps (`ftlab sweep`, the Python package's `ftlab.sweep`): a sweep file's base
//! configuration and axes expanded into points ([`spec`]), each point's report kept under the
//! hash of its configuration so that nothing finished runs twice ([`run`]), and the reports
//! gathered into one table, CSV and Parquet ([`table`]). How points are scheduled is the
//! caller's: this machine's threads ([`run::run_here`]) or Dask's workers (the Python package).

pub mod run;
pub mod spec;
pub mod table;

pub use run::Store;
pub use spec::{Point, Spec};
pub use table::Table;
