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
    let mut s = match std::os::unix::net::UnixStream::connect(&path) {
        Ok(s) => s,
        // The server's socket is its owner's only (mode 0600): saying "in use by another
        // ftlab" after the offline open fails would hide that this user may not ask it.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(std::io::Error::new(
                e.kind(),
                format!(
                    "{}: permission denied: a server runs on this directory and its control \
                     socket is its owner's only; run this as that user",
                    path.display()
                ),
            ))
        }
        Err(_) => return Ok(None),
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
    #[error(
        "not a control request ({0}): one JSON object a line, {{\"command\": \"create\", \"name\": N, \
         \"clone\": false, \"from\": F}}, {{\"command\": \"delete\", \"name\": N}}, \
         {{\"command\": \"list\"}} or {{\"command\": \"reload-policy\"}}"
    )]
    Json(String),
    /// A name the rule refuses (`ftlab_store::durable::NAME_RULE`), its message.
    #[error("{0}")]
    Name(String),
}

/// One control request, parsed: what `ftlab snapshot` sends and the server executes. On the
/// socket it is one JSON object a line (`Control::line`): a name holding a newline or a space is
/// a JSON string, never a second request or a second word.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "command", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Control {
    Create {
        name: String,
        clone: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
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
    /// The request as its line on the socket: JSON, without a newline.
    pub fn line(&self) -> String {
        serde_json::to_string(self).expect("a request serialises")
    }

    /// The request as a person reads it (logs, `ftlab snapshot`'s output).
    pub fn describe(&self) -> String {
        match self {
            Control::Create { name, clone, from } => format!(
                "create {name} {}{}",
                if *clone { "clone" } else { "snapshot" },
                from.as_ref()
                    .map(|f| format!(" from {f}"))
                    .unwrap_or_default()
            ),
            Control::Delete { name } => format!("delete {name}"),
            Control::List => "list".into(),
            Control::ReloadPolicy => "reload-policy".into(),
        }
    }

    /// Checks the names a request carries against the one rule
    /// (`ftlab_store::durable::check_volume_name`): the client before sending, the server
    /// before executing.
    pub fn check(&self) -> Result<(), ControlError> {
        let check = |name: &str| {
            ftlab_store::durable::check_volume_name(name)
                .map_err(|e| ControlError::Name(e.to_string()))
        };
        match self {
            Control::Create { name, from, .. } => {
                check(name)?;
                if let Some(f) = from {
                    check(f)?;
                }
            }
            Control::Delete { name } => check(name)?,
            Control::List | Control::ReloadPolicy => {}
        }
        Ok(())
    }

    /// A request line, parsed and its names checked.
    pub fn parse(line: &str) -> Result<Control, ControlError> {
        let c: Control =
            serde_json::from_str(line).map_err(|e| ControlError::Json(e.to_string()))?;
        c.check()?;
        Ok(c)
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
        if let Err(e) = c.check() {
            return serde_json::json!({"ok": false, "error": e.to_string()});
        }
        // Every request is decided and audited, `list` and `reload-policy` as the rest.
        let (action, name) = match c {
            Control::Create { name, clone, .. } => (
                if *clone { "clone" } else { "snapshot.create" },
                name.as_str(),
            ),
            Control::Delete { name } => ("snapshot.delete", name.as_str()),
            Control::List => ("list", ""),
            Control::ReloadPolicy => ("policy.reload", ""),
        };
        let target = match c {
            Control::Create { .. } | Control::Delete { .. } => device.volume_export_name(name),
            // What `list` shows is filtered below, one volume at a time.
            Control::List => String::from("*"),
            Control::ReloadPolicy => String::from("-"),
        };
        let audit = |result: &Result<(), String>| {
            device.audit(
                if action == "list" || action == "policy.reload" {
                    "control"
                } else {
                    "volume"
                },
                serde_json::json!({
                    "action": action,
                    "name": name,
                    "request": c.describe(),
                    "principal": principal.to_json(),
                    "ok": result.is_ok(),
                    "error": result.as_ref().err(),
                }),
            );
        };
        if !matches!(c, Control::List) && !device.allows(principal, action, &target) {
            let e = format!(
                "the access policy does not allow {} to {action} `{}`",
                principal.describe(),
                if name.is_empty() { &target } else { name }
            );
            return serde_json::json!({"ok": false, "error": e});
        }
        if matches!(c, Control::ReloadPolicy) {
            let Some(path) = policy else {
                let e = "this server has no --policy file".to_string();
                audit(&Err(e.clone()));
                return serde_json::json!({"ok": false, "error": e});
            };
            let reloaded = device
                .reload_policy(path)
                .map_err(|e| format!("not reloaded, the old policy stays: {e}"));
            audit(&reloaded.as_ref().map(|_| ()).map_err(Clone::clone));
            return match reloaded {
                Ok(statements) => serde_json::json!({"ok": true, "statements": statements}),
                Err(e) => serde_json::json!({"ok": false, "error": e}),
            };
        }
        let result = match c {
            Control::Create { name, clone, from } => device
                .create_volume(from.as_deref(), name, *clone)
                .map(|_| ()),
            Control::Delete { name } => device.delete_volume(name),
            Control::List | Control::ReloadPolicy => Ok(()),
        }
        .map_err(|e| e.to_string());
        audit(&result);
        // The volumes this principal may list (NBD `LIST`'s rule): the device itself by the
        // first export's name, each snapshot and clone as EXPORT@NAME.
        let volumes: Vec<_> = device
            .volumes()
            .into_iter()
            .filter(|v| {
                let export = if v.name.is_empty() {
                    device
                        .export_sizes()
                        .first()
                        .map(|(n, _)| n.clone())
                        .unwrap_or_default()
                } else {
                    device.volume_export_name(&v.name)
                };
                device.allows_quietly(principal, "list", &export)
            })
            .collect();
        match result {
            Ok(()) => serde_json::json!({
                "ok": true,
                "elapsed_ms": started.elapsed().as_secs_f64() * 1e3,
                "volumes": volumes,
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
        for junk in [
            "",
            "create",
            "list",
            "{\"command\": \"create\", \"name\": \"x\"}",
            "{\"command\": \"delete\", \"name\": \"x\", \"extra\": 1}",
            "{\"command\": \"rm\"}",
        ] {
            assert!(Control::parse(junk).is_err(), "{junk}");
        }
        // A name is one JSON string: a newline in it is not a second request, a space not a
        // second word; the name rule then refuses it (and `..`) before anything runs.
        for name in ["zz\nsnapshot\ndelete CON", "a b", "..", ".hidden", ""] {
            let c = Control::Delete { name: name.into() };
            assert!(!c.line().contains('\n'));
            let e = Control::parse(&c.line()).unwrap_err();
            assert!(matches!(e, ControlError::Name(_)), "{name:?}: {e}");
        }
    }
}
