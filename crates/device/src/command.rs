//! What a front end asks of the device, and why the device refused: the device's own
//! vocabulary, so that no wire format reaches its API (the NBD server maps its requests and
//! error codes to these in one place each).

/// What a command does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommandKind {
    Read,
    Write,
    /// Zeroes over the range: whole pages deallocated (as a trim) unless `no_hole` asks for
    /// them to be written.
    WriteZeroes,
    Trim,
    Flush,
    /// A hint to bring the range near (there is nothing nearer than RAM).
    Cache,
}

impl CommandKind {
    /// Its name in messages (the NBD spec's, without the `NBD_CMD_` prefix).
    pub fn name(self) -> &'static str {
        match self {
            CommandKind::Read => "READ",
            CommandKind::Write => "WRITE",
            CommandKind::WriteZeroes => "WRITE_ZEROES",
            CommandKind::Trim => "TRIM",
            CommandKind::Flush => "FLUSH",
            CommandKind::Cache => "CACHE",
        }
    }

    /// Whether it changes what the device holds.
    pub fn changes_data(self) -> bool {
        matches!(
            self,
            CommandKind::Write | CommandKind::WriteZeroes | CommandKind::Trim
        )
    }
}

/// One command on an export: a byte range (a flush's is ignored) and its flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Command {
    pub kind: CommandKind,
    /// Within the export.
    pub offset: u64,
    pub length: u32,
    /// Durable before it is answered (NVMe's and NBD's force unit access).
    pub fua: bool,
    /// With `WriteZeroes`: write the zeroes rather than deallocate the pages.
    pub no_hole: bool,
    /// When the host submitted it (an NBD request's header read): the model's arrival, so the
    /// time the server spends before the model takes it is inside the modelled latency, as a
    /// device's controller time is. None: when the model takes it.
    pub arrival: Option<std::time::Instant>,
}

/// Why a command failed. Each has the POSIX errno both NBD and the SQLite VFS report it as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IoError {
    /// A change to a read-only export, snapshot or device.
    #[error("read-only")]
    ReadOnly,
    /// The page store or the device log failed, or the device has failed (`Device::failure`).
    #[error("I/O error")]
    Io,
    /// Beyond the end of the export, or the page store is at its memory limit.
    #[error("no space")]
    NoSpace,
    /// Out of range, or naming no stream or export the device has.
    #[error("invalid request")]
    Invalid,
}

impl IoError {
    /// Its POSIX errno (Linux's numbers, which the NBD spec's error codes equal).
    pub fn errno(self) -> u32 {
        match self {
            IoError::ReadOnly => 1, // EPERM
            IoError::Io => 5,       // EIO
            IoError::NoSpace => 28, // ENOSPC
            IoError::Invalid => 22, // EINVAL
        }
    }
}

/// A command of an in-process client (`Device::local`), on the first export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalCommand {
    Read,
    Write,
    Trim,
    Flush,
}

/// What a page of an export holds, as block status reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allocation {
    /// Never written, or trimmed: a hole reading as zeros.
    Hole,
    /// Stored as zeros.
    Zeros,
    Data,
}
