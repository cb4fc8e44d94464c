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
            serde_json::json!({"principal": principal.to_json(), "address": address, "tls": false}),
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
            self.denied(principal, action, export, &d.explain(&policy));
        }
        d.allowed
    }

    /// Counts a denial and audits it: in full the first time in a minute that `principal` is
    /// denied `action`, then counted, and written as one `denied_repeated` line once the
    /// minute is over (at the next denial of anyone), so that a flood of refused requests
    /// grows the audit log by two lines a minute per principal and action, not one a request.
    pub fn denied(&self, principal: &policy::Principal, action: &str, export: &str, reason: &str) {
        self.denied_total.fetch_add(1, Ordering::Relaxed);
        let now = std::time::Instant::now();
        let key = (principal.names.clone(), action.to_string());
        let (write, ended) = {
            let mut w = self.denials.lock().unwrap_or_else(|e| e.into_inner());
            let ended = w.take_ended(now);
            (w.note(key, now), ended)
        };
        for ((names, action), repeated) in ended {
            self.audit(
                "denied_repeated",
                serde_json::json!({
                    "principal": policy::Principal { names }.to_json(),
                    "action": action,
                    "repeated": repeated,
                    "window_s": DENIAL_WINDOW.as_secs(),
                }),
            );
        }
        if write {
            self.audit(
                "denied",
                serde_json::json!({
                    "principal": principal.to_json(),
                    "action": action,
                    "export": export,
                    "reason": reason,
                }),
            );
        }
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

/// A denial of the same principal and action is written in full once per this long.
pub(crate) const DENIAL_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

/// Windows kept at most: beyond, the oldest is closed early (its count written), so that a
/// flood of ever new principals is bounded in memory too.
const DENIAL_WINDOWS: usize = 256;

type DenialKey = (Vec<String>, String);

/// The denials of each principal and action in their current window: when it began, and the
/// denials since its first (not written yet).
#[derive(Default)]
pub(crate) struct DenialWindows {
    open: std::collections::HashMap<DenialKey, (std::time::Instant, u64)>,
}

impl DenialWindows {
    /// Notes a denial; whether it is written in full (the first of its window).
    fn note(&mut self, key: DenialKey, now: std::time::Instant) -> bool {
        if let Some((_, repeated)) = self.open.get_mut(&key) {
            *repeated += 1;
            return false;
        }
        self.open.insert(key, (now, 0));
        true
    }

    /// The windows that are over (and, beyond `DENIAL_WINDOWS`, the oldest), with the denials
    /// they did not write; those with none are closed silently.
    fn take_ended(&mut self, now: std::time::Instant) -> Vec<(DenialKey, u64)> {
        let mut ended: Vec<DenialKey> = self
            .open
            .iter()
            .filter(|(_, &(since, _))| now.duration_since(since) >= DENIAL_WINDOW)
            .map(|(k, _)| k.clone())
            .collect();
        if self.open.len() - ended.len() >= DENIAL_WINDOWS {
            let mut by_age: Vec<(&DenialKey, std::time::Instant)> = self
                .open
                .iter()
                .map(|(k, &(since, _))| (k, since))
                .collect();
            by_age.sort_by_key(|&(_, since)| since);
            let extra = self.open.len() - ended.len() + 1 - DENIAL_WINDOWS;
            ended.extend(
                by_age
                    .into_iter()
                    .map(|(k, _)| k.clone())
                    .filter(|k| !ended.contains(k))
                    .take(extra)
                    .collect::<Vec<_>>(),
            );
        }
        let mut out: Vec<(DenialKey, u64)> = ended
            .into_iter()
            .filter_map(|k| self.open.remove_entry(&k))
            .filter(|(_, (_, repeated))| *repeated > 0)
            .map(|(k, (_, repeated))| (k, repeated))
            .collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn key(name: &str) -> DenialKey {
        (vec![name.to_string()], "metrics".to_string())
    }

    /// A flood from one principal is one line in full and one count per window; another
    /// principal has its own window; ever new principals are bounded.
    #[test]
    fn denials_are_written_once_a_window_and_counted() {
        let mut w = DenialWindows::default();
        let t0 = Instant::now();
        assert!(w.note(key("a"), t0));
        for i in 1..1000 {
            assert!(!w.note(key("a"), t0 + Duration::from_millis(i)));
        }
        assert!(w.note(key("b"), t0 + Duration::from_secs(1)));
        assert!(w.take_ended(t0 + Duration::from_secs(30)).is_empty());
        let later = t0 + DENIAL_WINDOW;
        // a's window is over with 999 unwritten; b's has none to tell (and is still open).
        assert_eq!(w.take_ended(later), vec![(key("a"), 999)]);
        assert!(w.note(key("a"), later));
        assert!(!w.note(key("b"), later));
        for i in 0..(2 * DENIAL_WINDOWS) {
            let k = key(&format!("n{i}"));
            w.take_ended(later);
            w.note(k.clone(), later + Duration::from_millis(i as u64));
            w.note(k, later + Duration::from_millis(i as u64));
        }
        assert!(w.open.len() <= DENIAL_WINDOWS);
    }
}
