//! Who may do what to which export: a policy file of allow and deny statements, evaluated as IAM
//! policies are (docs/serve.md, "Access policies"): a statement applies when one of its
//! principals, one of its actions and one of its exports match; an applicable `deny` wins over
//! any `allow`; with no applicable `allow` the answer is no (default deny).
//!
//! ```toml
//! [[statement]]
//! sid = "ops"                               # a name `ftlab policy check` shows
//! effect = "allow"
//! principals = ["cn:ops-*", "uid:0"]        # cn:, san:, uid:, gid:, anonymous, *
//! actions = ["*"]                           # read write trim flush list snapshot.create
//! exports = ["*"]                           #   snapshot.delete clone metrics; snapshot.*
//!
//! [[statement]]
//! effect = "deny"
//! principals = ["*"]
//! actions = ["write", "trim"]
//! exports = ["*@*"]                         # snapshots and clones: EXPORT@NAME
//! ```
//!
//! Patterns are globs: `*` any run of characters (none included), `?` one character; everything
//! else matches itself. A policy is checked whole when read (every effect, action and principal
//! kind known, no statement without principals, actions or exports), so a file with a mistake
//! never replaces a working one.

use serde::Deserialize;
use std::path::Path;

/// What a client may be allowed to do.
pub const ACTIONS: [&str; 10] = [
    "read",
    "write",
    "trim",
    "flush",
    "list",
    "snapshot.create",
    "snapshot.delete",
    "clone",
    "metrics",
    "policy.reload",
];

/// The actions a connection's commands need, as bits of its negotiated allowance.
pub const IO_ACTIONS: [(&str, u8); 4] = [("read", 1), ("write", 2), ("trim", 4), ("flush", 8)];
pub const IO_ALL: u8 = 15;

/// The kinds of principal a pattern may name (before the colon), besides `anonymous` and `*`.
const PRINCIPAL_KINDS: [&str; 4] = ["cn", "san", "uid", "gid"];

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("{path}: {cause}")]
    Io { path: String, cause: std::io::Error },
    /// The file, refused: `FILE:LINE: what`, or `FILE: statement N (sid): what`.
    #[error("{0}")]
    Invalid(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Effect {
    Allow,
    Deny,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Statement {
    #[serde(default)]
    pub sid: Option<String>,
    pub effect: Effect,
    pub principals: Vec<String>,
    pub actions: Vec<String>,
    pub exports: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default)]
    statement: Vec<Statement>,
}

/// A checked policy.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    pub statements: Vec<Statement>,
}

/// Who a client is: every name it goes by (`cn:alice`, `san:alice.example.org`, `uid:1000`,
/// `gid:1000`, ...), or none (anonymous).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Principal {
    pub names: Vec<String>,
}

impl Principal {
    pub fn anonymous() -> Self {
        Self::default()
    }

    /// The Unix peer at the other end of `stream` (`SO_PEERCRED`): `uid:N` and `gid:N`, or
    /// anonymous when the kernel does not say.
    #[cfg(target_os = "linux")]
    pub fn of_unix_peer(stream: &std::os::unix::net::UnixStream) -> Self {
        use std::os::fd::AsRawFd;
        let mut cred = libc::ucred {
            pid: 0,
            uid: 0,
            gid: 0,
        };
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: `cred` and `len` are valid for the kernel to write a ucred into; the fd is
        // open.
        let r = unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&mut cred as *mut libc::ucred).cast(),
                &mut len,
            )
        };
        if r != 0 {
            return Self::anonymous();
        }
        Self {
            names: vec![format!("uid:{}", cred.uid), format!("gid:{}", cred.gid)],
        }
    }

    /// The names as a JSON list (`["anonymous"]` for none), for logs: a list, not the names
    /// joined, since a certificate's CN may hold a comma (`cn:x,uid:0` must not read as a
    /// `uid:0`).
    pub fn to_json(&self) -> serde_json::Value {
        if self.names.is_empty() {
            serde_json::json!(["anonymous"])
        } else {
            serde_json::json!(self.names)
        }
    }

    /// `to_json` as text (for log lines).
    pub fn describe(&self) -> String {
        self.to_json().to_string()
    }
}

/// Why a request is allowed or not, and which statement said so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// The deciding statement's index: the first applicable `deny`, else the first applicable
    /// `allow`; `None` when nothing applied (denied by default).
    pub statement: Option<usize>,
}

impl Decision {
    /// "allowed by statement 2 (ops)", "denied by statement 0", "denied: no statement allows it".
    pub fn explain(&self, policy: &Policy) -> String {
        match self.statement {
            Some(i) => {
                let s = &policy.statements[i];
                format!(
                    "{} by statement {i}{}",
                    if self.allowed { "allowed" } else { "denied" },
                    s.sid
                        .as_ref()
                        .map_or(String::new(), |sid| format!(" ({sid})"))
                )
            }
            None => "denied: no statement allows it (default deny)".into(),
        }
    }
}

impl Policy {
    /// Reads and checks a policy file.
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|cause| PolicyError::Io {
            path: path.display().to_string(),
            cause,
        })?;
        Policy::parse(&text, &path.display().to_string())
    }

    /// Checks a policy given as text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Policy, PolicyError> {
        let file: PolicyFile = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| {
                text.as_bytes()[..s.start.min(text.len())]
                    .iter()
                    .filter(|&&b| b == b'\n')
                    .count()
                    + 1
            });
            PolicyError::Invalid(format!(
                "{origin}{}: {}",
                line.map_or(String::new(), |l| format!(":{l}")),
                e.message()
            ))
        })?;
        for (i, s) in file.statement.iter().enumerate() {
            let at = || {
                format!(
                    "{origin}: statement {i}{}",
                    s.sid
                        .as_ref()
                        .map_or(String::new(), |sid| format!(" ({sid})"))
                )
            };
            for (what, list) in [
                ("principals", &s.principals),
                ("actions", &s.actions),
                ("exports", &s.exports),
            ] {
                if list.is_empty() {
                    return Err(PolicyError::Invalid(format!(
                        "{}: `{what}` is empty (a statement that names nothing applies to nothing)",
                        at()
                    )));
                }
            }
            for a in &s.actions {
                if !ACTIONS.iter().any(|known| glob(a, known)) {
                    return Err(PolicyError::Invalid(format!(
                        "{}: action `{a}` matches none of {}",
                        at(),
                        ACTIONS.join(", ")
                    )));
                }
            }
            for p in &s.principals {
                let known = p == "*"
                    || p == "anonymous"
                    || p.split_once(':').is_some_and(|(kind, name)| {
                        PRINCIPAL_KINDS.contains(&kind) && !name.is_empty()
                    });
                if !known {
                    return Err(PolicyError::Invalid(format!(
                        "{}: principal `{p}`: expected cn:NAME, san:NAME, uid:N, gid:N, \
                         anonymous or *",
                        at()
                    )));
                }
            }
        }
        Ok(Policy {
            statements: file.statement,
        })
    }

    /// May `principal` do `action` to `export` (`NAME` or `NAME@SNAPSHOT`)?
    pub fn decide(&self, principal: &Principal, action: &str, export: &str) -> Decision {
        let mut allow = None;
        for (i, s) in self.statements.iter().enumerate() {
            let applies = s.actions.iter().any(|a| glob(a, action))
                && s.exports.iter().any(|e| glob(e, export))
                && s.principals.iter().any(|p| principal_matches(p, principal));
            if !applies {
                continue;
            }
            match s.effect {
                Effect::Deny => {
                    return Decision {
                        allowed: false,
                        statement: Some(i),
                    }
                }
                Effect::Allow => {
                    allow.get_or_insert(i);
                }
            }
        }
        Decision {
            allowed: allow.is_some(),
            statement: allow,
        }
    }
}

/// `*` matches everyone, `anonymous` a client with no name, any other pattern one of its names.
fn principal_matches(pattern: &str, principal: &Principal) -> bool {
    match pattern {
        "*" => true,
        "anonymous" => principal.names.is_empty(),
        p => principal.names.iter().any(|n| glob(p, n)),
    }
}

/// Glob matching with `*` and `?`, linear in time: the classic two-pointer walk that remembers
/// the last `*` and retries from one character further (no backtracking explosion on `a*a*a*b`).
pub fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < t.len() {
        if i < p.len() && (p[i] == '?' || p[i] == t[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some((i, j));
            i += 1;
        } else if let Some((si, sj)) = star {
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const EXAMPLE: &str = r#"
[[statement]]
sid = "ops"
effect = "allow"
principals = ["cn:ops-*", "uid:0"]
actions = ["*"]
exports = ["*"]

[[statement]]
sid = "readers"
effect = "allow"
principals = ["*"]
actions = ["read", "list"]
exports = ["db", "db@*"]

[[statement]]
sid = "snapshots-are-read-only"
effect = "deny"
principals = ["*"]
actions = ["write", "trim"]
exports = ["*@*"]
"#;

    fn who(names: &[&str]) -> Principal {
        Principal {
            names: names.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn deny_wins_and_nothing_allowed_is_denied() {
        let p = Policy::parse(EXAMPLE, "p.toml").unwrap();
        let ops = who(&["cn:ops-alice", "san:alice.example.org"]);
        assert_eq!(p.decide(&ops, "write", "db").statement, Some(0));
        assert!(p.decide(&ops, "write", "db").allowed);
        let d = p.decide(&ops, "write", "db@monday");
        assert!(!d.allowed);
        assert_eq!(
            d.explain(&p),
            "denied by statement 2 (snapshots-are-read-only)"
        );
        let anon = Principal::anonymous();
        assert!(p.decide(&anon, "read", "db@monday").allowed);
        let d = p.decide(&anon, "write", "db");
        assert_eq!((d.allowed, d.statement), (false, None));
        assert!(d.explain(&p).contains("default deny"));
        assert!(
            p.decide(&who(&["uid:0"]), "snapshot.create", "other")
                .allowed
        );
        assert!(
            !p.decide(&who(&["uid:1000"]), "snapshot.create", "db")
                .allowed
        );
    }

    #[test]
    fn a_bad_policy_is_refused_naming_where() {
        let cases = [
            ("[[statement]]\neffect = \"alow\"\nprincipals = [\"*\"]\nactions = [\"read\"]\nexports = [\"*\"]\n", "p.toml:2:"),
            ("[[statement]]\neffect = \"allow\"\nprincipals = [\"*\"]\nactions = [\"reed\"]\nexports = [\"*\"]\n", "action `reed`"),
            ("[[statement]]\neffect = \"allow\"\nprincipals = [\"user:bob\"]\nactions = [\"read\"]\nexports = [\"*\"]\n", "principal `user:bob`"),
            ("[[statement]]\neffect = \"allow\"\nprincipals = []\nactions = [\"read\"]\nexports = [\"*\"]\n", "`principals` is empty"),
            ("[[statement]]\neffect = \"allow\"\nprincipals = [\"*\"]\nactions = [\"read\"]\n", "p.toml:1:"),
            ("[[statment]]\n", "p.toml:1:"),
        ];
        for (text, expected) in cases {
            let e = Policy::parse(text, "p.toml").unwrap_err().to_string();
            assert!(e.contains(expected), "{text:?}: {e}");
        }
    }

    #[test]
    fn globs() {
        assert!(glob("*", ""));
        assert!(glob("db@*", "db@monday"));
        assert!(!glob("db@*", "db"));
        assert!(glob("a*a*a*b", "aaaaaaaaaaaaaaaab"));
        assert!(!glob("a*a*a*b", "aaaaaaaaaaaaaaaaa"));
        assert!(glob("snapshot.?reate", "snapshot.create"));
        assert!(glob("*.create", "snapshot.create"));
    }

    /// The reference: matching by regular expressions built from the globs (an independent
    /// matcher), and the rule stated as sets: denied if any applicable deny, else allowed iff any
    /// applicable allow.
    fn reference(policy: &Policy, principal: &Principal, action: &str, export: &str) -> bool {
        let re = |g: &str| {
            let mut s = String::from("^");
            for c in g.chars() {
                match c {
                    '*' => s.push_str(".*"),
                    '?' => s.push('.'),
                    c => s.push_str(&regex_escape(c)),
                }
            }
            s.push('$');
            s
        };
        let m = |g: &str, t: &str| simple_regex_match(&re(g), t);
        let applies = |s: &Statement| {
            s.actions.iter().any(|a| m(a, action))
                && s.exports.iter().any(|e| m(e, export))
                && s.principals.iter().any(|p| match p.as_str() {
                    "*" => true,
                    "anonymous" => principal.names.is_empty(),
                    p => principal.names.iter().any(|n| m(p, n)),
                })
        };
        let applicable: Vec<&Statement> = policy.statements.iter().filter(|s| applies(s)).collect();
        !applicable.iter().any(|s| s.effect == Effect::Deny)
            && applicable.iter().any(|s| s.effect == Effect::Allow)
    }

    fn regex_escape(c: char) -> String {
        if c.is_alphanumeric() {
            c.to_string()
        } else {
            format!("\\{c}")
        }
    }

    /// A backtracking matcher for the regexes `reference` builds (`.`, `.*`, escaped literals).
    fn simple_regex_match(re: &str, text: &str) -> bool {
        let mut tokens = Vec::new(); // (literal or None for any, starred)
        let chars: Vec<char> = re
            .trim_start_matches('^')
            .trim_end_matches('$')
            .chars()
            .collect();
        let mut i = 0;
        while i < chars.len() {
            let tok = match chars[i] {
                '\\' => {
                    i += 1;
                    Some(chars[i])
                }
                '.' => None,
                c => Some(c),
            };
            i += 1;
            let starred = chars.get(i) == Some(&'*');
            if starred {
                i += 1;
            }
            tokens.push((tok, starred));
        }
        fn go(tokens: &[(Option<char>, bool)], text: &[char]) -> bool {
            match tokens.split_first() {
                None => text.is_empty(),
                Some((&(tok, true), rest)) => (0..=text.len()).any(|k| {
                    text[..k].iter().all(|&c| tok.is_none_or(|t| t == c)) && go(rest, &text[k..])
                }),
                Some((&(tok, false), rest)) => {
                    !text.is_empty() && tok.is_none_or(|t| t == text[0]) && go(rest, &text[1..])
                }
            }
        }
        let text: Vec<char> = text.chars().collect();
        go(&tokens, &text)
    }

    fn pattern() -> impl Strategy<Value = String> {
        prop::sample::select(vec![
            "*", "a*", "*b", "a?", "ab", "b", "a*b", "?", "*@*", "ab@*",
        ])
        .prop_map(String::from)
    }

    fn statement() -> impl Strategy<Value = Statement> {
        (
            prop::bool::ANY,
            prop::collection::vec(
                prop::sample::select(vec![
                    "*",
                    "anonymous",
                    "cn:a*",
                    "cn:ab",
                    "uid:1",
                    "gid:?",
                    "san:*b",
                ]),
                1..3,
            ),
            prop::collection::vec(
                prop::sample::select(vec!["*", "read", "write", "snapshot.*", "s*", "clone"]),
                1..3,
            ),
            prop::collection::vec(pattern(), 1..3),
        )
            .prop_map(|(deny, principals, actions, exports)| Statement {
                sid: None,
                effect: if deny { Effect::Deny } else { Effect::Allow },
                principals: principals.into_iter().map(String::from).collect(),
                actions: actions.into_iter().map(String::from).collect(),
                exports,
            })
    }

    proptest! {
        #[test]
        fn decisions_match_the_reference_evaluator(
            statements in prop::collection::vec(statement(), 0..6),
            names in prop::collection::vec(prop::sample::select(vec!["cn:ab", "cn:a", "uid:1", "uid:2", "gid:7", "san:xb"]), 0..3),
            action in prop::sample::select(ACTIONS.to_vec()),
            export in prop::sample::select(vec!["ab", "a", "b", "ab@x", "@", "abb"]),
        ) {
            let policy = Policy { statements };
            let principal = Principal { names: names.into_iter().map(String::from).collect() };
            let d = policy.decide(&principal, action, export);
            prop_assert_eq!(d.allowed, reference(&policy, &principal, action, export));
            // Deny wins: a deciding deny is an applicable deny; an allow is never beside one.
            if let Some(i) = d.statement {
                prop_assert_eq!(policy.statements[i].effect == Effect::Allow, d.allowed);
            } else {
                prop_assert!(!d.allowed, "default deny");
            }
            // No statement, no access.
            prop_assert!(!Policy::default().decide(&principal, action, export).allowed);
        }
    }
}
