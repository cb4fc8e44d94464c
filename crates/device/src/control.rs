//! The control protocol of a served durable device (`DIR/control.sock`: one request line, one
//! JSON reply line) and its authorisation: snapshot and clone requests decided by the access
//! policy and audited, a policy reload. The socket itself is the caller's.

use crate::policy::Principal;
use crate::Device;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The control socket of a served directory.
pub fn control_path(dir: &Path) -> PathBuf {
    dir.join("control.sock")
}

/// Sends `c` to the control socket of the server of `dir` and returns its reply (what
/// [`Device::control`] answered); None when nothing answers there (no server runs on `dir`).
pub fn send(dir: &Path, c: &Control) -> std::io::Result<Option<serde_json::Value>> {
    use std::io::{BufRead, Write};
    let path = control_path(dir);
    let Ok(mut s) = std::os::unix::net::UnixStream::connect(&path) else {
        return Ok(None);
    };
    s.set_read_timeout(Some(std::time::Duration::from_secs(60)))?;
    writeln!(s, "{}", c.line())?;
    let mut reply = String::new();
    std::io::BufReader::new(s).read_line(&mut reply)?;
    serde_json::from_str(&reply).map(Some).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: a reply that is not JSON", path.display()),
        )
    })
}

/// A control request is one line of at most this many bytes.
pub const MAX_CONTROL_LINE_BYTES: u64 = 4096;

/// Why a request line is not a request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    #[error("`{0}`: snapshot or clone")]
    Kind(String),
    #[error(
        "`{0}`: the requests are `create NAME snapshot|clone [FROM]`, `delete NAME`, `list`, \
         `reload-policy`"
    )]
    Unknown(String),
}

/// One control request, parsed: what `ftlab snapshot` sends and the server executes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Control {
    Create {
        name: String,
        clone: bool,
        from: Option<String>,
    },
    Delete {
        name: String,
    },
    List,
    /// Read the `--policy` file again (checked whole first), as SIGHUP does.
    ReloadPolicy,
}

impl Control {
    /// The request as its line on the socket.
    pub fn line(&self) -> String {
        match self {
            Control::Create { name, clone, from } => format!(
                "create {name} {}{}",
                if *clone { "clone" } else { "snapshot" },
                from.as_ref().map(|f| format!(" {f}")).unwrap_or_default()
            ),
            Control::Delete { name } => format!("delete {name}"),
            Control::List => "list".into(),
            Control::ReloadPolicy => "reload-policy".into(),
        }
    }

    /// A request line, checked.
    pub fn parse(line: &str) -> Result<Control, ControlError> {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words[..] {
            ["list"] => Ok(Control::List),
            ["reload-policy"] => Ok(Control::ReloadPolicy),
            ["delete", name] => Ok(Control::Delete { name: name.into() }),
            ["create", name, kind] | ["create", name, kind, _] => Ok(Control::Create {
                name: name.into(),
                clone: match kind {
                    "clone" => true,
                    "snapshot" => false,
                    other => return Err(ControlError::Kind(other.to_string())),
                },
                from: words.get(3).map(|s| s.to_string()),
            }),
            _ => Err(ControlError::Unknown(line.chars().take(80).collect())),
        }
    }
}

impl Device {
    /// Executes a control request on the device for `principal`, as the access policy allows
    /// (snapshot actions are audited whether they succeed or not); the reply's JSON. `policy`:
    /// the policy file a reload reads.
    pub fn control(
        &self,
        policy: Option<&Path>,
        principal: &Principal,
        c: &Control,
    ) -> serde_json::Value {
        let device = self;
        let started = Instant::now();
        if matches!(c, Control::ReloadPolicy) {
            // The socket is its directory owner's only (mode 0600): who may edit the file.
            let Some(path) = policy else {
                return serde_json::json!({"ok": false, "error": "this server has no --policy file"});
            };
            return match device.reload_policy(path) {
                Ok(statements) => serde_json::json!({"ok": true, "statements": statements}),
                Err(e) => {
                    serde_json::json!({"ok": false, "error": format!("not reloaded, the old policy stays: {e}")})
                }
            };
        }
        let (action, name) = match c {
            Control::Create { name, clone, .. } => (
                if *clone { "clone" } else { "snapshot.create" },
                name.as_str(),
            ),
            Control::Delete { name } => ("snapshot.delete", name.as_str()),
            Control::List | Control::ReloadPolicy => ("list", ""),
        };
        if !matches!(c, Control::List)
            && !device.allows(principal, action, &device.volume_export_name(name))
        {
            return serde_json::json!({
                "ok": false,
                "error": format!("the access policy does not allow {} to {action} `{name}`", principal.describe()),
            });
        }
        let result = match c {
            Control::Create { name, clone, from } => device
                .create_volume(from.as_deref(), name, *clone)
                .map(|_| ()),
            Control::Delete { name } => device.delete_volume(name),
            Control::List | Control::ReloadPolicy => Ok(()),
        }
        .map_err(|e| e.to_string());
        if !matches!(c, Control::List) {
            device.audit(
                "volume",
                serde_json::json!({
                    "action": action,
                    "name": name,
                    "request": c.line(),
                    "principal": principal.describe(),
                    "ok": result.is_ok(),
                    "error": result.as_ref().err(),
                }),
            );
        }
        match result {
            Ok(()) => serde_json::json!({
                "ok": true,
                "elapsed_ms": started.elapsed().as_secs_f64() * 1e3,
                "volumes": device.volumes(),
            }),
            Err(e) => serde_json::json!({ "ok": false, "error": e }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_requests_round_trip_and_junk_is_refused() {
        for c in [
            Control::List,
            Control::ReloadPolicy,
            Control::Delete { name: "a".into() },
            Control::Create {
                name: "b".into(),
                clone: true,
                from: Some("a".into()),
            },
            Control::Create {
                name: "c".into(),
                clone: false,
                from: None,
            },
        ] {
            assert_eq!(Control::parse(&c.line()).unwrap(), c);
        }
        for junk in ["", "create", "create x maybe", "rm -rf /", "list extra"] {
            assert!(Control::parse(junk).is_err(), "{junk}");
        }
    }
}
