//! Parameter sweeps (`ftlab sweep`, the Python package's `ftlab.sweep`): a sweep file's base
//! configuration and axes expanded into points ([`spec`]), each point's report kept under the
//! hash of its configuration so that nothing finished runs twice ([`run`]), and the reports
//! gathered into one table, CSV and Parquet ([`table`]). How points are scheduled is the
//! caller's: this machine's threads ([`run::run_here`]) or Dask's workers (the Python package).

pub mod run;
pub mod spec;
pub mod table;

pub use run::Store;

/// Why a sweep stopped, for a person: each names the sweep file's line, the point or the file.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// The sweep file, refused before anything ran: `FILE:LINE: what is wrong` (the line when
    /// one is to blame).
    #[error("{0}")]
    Spec(String),
    // `cause`, not `source`: thiserror would also make it the cause, printed twice by `{:#}`.
    #[error("{path}: {cause}")]
    Io { path: String, cause: std::io::Error },
    /// A point's simulation failed.
    #[error("point {index} ({label}): {cause}")]
    Point {
        index: usize,
        label: String,
        cause: ftlab_sim::sim::SimError,
    },
    #[error("point {index} ({label}) has no report in {dir}")]
    NoReport {
        index: usize,
        label: String,
        dir: String,
    },
    #[error("the report of point {index} is not an ftlab report: {reason}")]
    BadReport { index: usize, reason: String },
    /// A configuration refused outside a sweep file's lines (a preset, a TOML file).
    #[error(transparent)]
    Config(#[from] ftlab_core::config::ConfigError),
    #[error("writing the Parquet table: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
}

pub type Result<T, E = SweepError> = std::result::Result<T, E>;

/// An I/O error naming its file.
pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> SweepError + '_ {
    move |cause| SweepError::Io {
        path: path.display().to_string(),
        cause,
    }
}

/// A replacement that failed, naming its file.
pub(crate) fn atomic(e: ftlab_core::atomic_file::AtomicFileError) -> SweepError {
    SweepError::Io {
        path: e.path.display().to_string(),
        cause: e.cause,
    }
}
pub use spec::{Point, Spec};
pub use table::Table;
