//! Who may do what: the access policy in force (swapped whole on reload), the decisions taken
//! with it, and the audit log they are written to.

use crate::{policy, Device, Target};
use std::io::Write;
use std::sync::atomic::Ordering;

impl Device {
    /// Puts `policy` in force for connections made from now on (None: no policy).
    pub fn set_policy(&self, policy: Option<policy::Policy>) {
        *self.policy.write().unwrap_or_else(|e| e.into_inner()) = policy.map(std::sync::Arc::new);
    }

    /// The policy in force now (it may be replaced at any moment: a reload).
    fn current_policy(&self) -> Option<std::sync::Arc<policy::Policy>> {
        self.policy
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Counts a connection admitted (for the metrics) and audits it.
    pub fn connected(&self, principal: &policy::Principal, address: &str) {
        self.connections_total.fetch_add(1, Ordering::Relaxed);
        self.audit(
            "connect",
            serde_json::json!({"principal": principal.describe(), "address": address, "tls": false}),
        );
    }

    /// Appends the audit log's lines to `file` from now on.
    pub fn set_audit(&self, file: std::fs::File) {
        *self.audit.lock().unwrap_or_else(|e| e.into_inner()) = Some(file);
    }

    /// Writes one audit line: `event` and `fields`, with the wall-clock time. An audit log that
    /// cannot be written is reported once on stderr and no longer written (the device goes on).
    pub fn audit(&self, event: &str, fields: serde_json::Value) {
        let mut guard = self.audit.lock().unwrap_or_else(|e| e.into_inner());
        let Some(file) = guard.as_mut() else {
            return;
        };
        let mut line = serde_json::json!({
            "time_unix_ms": std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            "event": event,
        });
        if let (Some(l), serde_json::Value::Object(f)) = (line.as_object_mut(), fields) {
            l.extend(f);
        }
        let mut text = line.to_string();
        text.push('\n');
        if let Err(e) = file.write_all(text.as_bytes()) {
            eprintln!("ftlab serve: the audit log: {e}; no longer written");
            *guard = None;
        }
    }

    /// May `principal` do `action` on `export`? Yes for everyone without a policy; a denial is
    /// written to the audit log with the statement (or default) that decided it.
    pub fn allows(&self, principal: &policy::Principal, action: &str, export: &str) -> bool {
        let policy = self.current_policy();
        let Some(policy) = policy else {
            return true;
        };
        let d = policy.decide(principal, action, export);
        if !d.allowed {
            self.denied_total.fetch_add(1, Ordering::Relaxed);
            self.audit(
                "denied",
                serde_json::json!({
                    "principal": principal.describe(),
                    "action": action,
                    "export": export,
                    "reason": d.explain(&policy),
                }),
            );
        }
        d.allowed
    }

    /// As `allows`, without counting or auditing a denial: what a listing leaves out.
    pub fn allows_quietly(
        &self,
        principal: &policy::Principal,
        action: &str,
        export: &str,
    ) -> bool {
        self.current_policy()
            .is_none_or(|p| p.decide(principal, action, export).allowed)
    }

    /// The `policy::IO_*` bits `principal` is allowed on `target`, decided once at
    /// negotiation (a denial is audited when a command meets it, or when none is allowed).
    pub fn io_allowed(&self, principal: &policy::Principal, target: Target) -> u8 {
        let policy = self.current_policy();
        let Some(policy) = policy else {
            return policy::IO_ALL;
        };
        let name = self.target_name(target);
        let bits = policy::IO_ACTIONS
            .iter()
            .filter(|(action, _)| policy.decide(principal, action, &name).allowed)
            .fold(0, |bits, (_, bit)| bits | bit);
        if bits == 0 {
            self.allows(principal, "read", &name);
        }
        bits
    }

    /// Reads the policy file at `path` and puts it in force for connections made from now on;
    /// a file that does not check leaves the policy in force as it was. Either way the audit
    /// log says so. Returns the new policy's statements.
    pub fn reload_policy(&self, path: &std::path::Path) -> Result<usize, policy::PolicyError> {
        match policy::Policy::load(path) {
            Ok(p) => {
                let statements = p.statements.len();
                self.set_policy(Some(p));
                self.audit(
                    "policy_reload",
                    serde_json::json!({"file": path.display().to_string(), "statements": statements}),
                );
                Ok(statements)
            }
            Err(e) => {
                self.audit(
                    "policy_refused",
                    serde_json::json!({"file": path.display().to_string(), "reason": e.to_string()}),
                );
                Err(e)
            }
        }
    }
}
