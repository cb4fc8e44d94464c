//! `ftlab policy`: a policy file checked and one decision explained, or a served directory's
//! policy reloaded.

use anyhow::Result;
use clap::Subcommand;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Check a policy file and explain one decision: allowed or denied, by which statement (or by
    /// default: what no statement allows is denied). Exit 0 when allowed, 3 when denied, 1 when
    /// the file is refused.
    #[command(after_help = "Examples:\n  \
ftlab policy check policy.toml --principal cn:ops-alice --action write --export db\n  \
ftlab policy check policy.toml --principal uid:1000 --principal gid:100 --action read --export db@monday\n  \
ftlab policy check policy.toml --action list --export db          # an anonymous client")]
    Check {
        /// The policy file (docs/serve.md, "Access policies").
        file: PathBuf,
        /// A name the client goes by: cn:NAME or san:NAME (its TLS certificate), uid:N or gid:N
        /// (its Unix socket credentials); repeat for each. None: anonymous.
        #[arg(long = "principal", value_name = "KIND:NAME")]
        principals: Vec<String>,
        /// read, write, trim, flush, list, snapshot.create, snapshot.delete, clone, metrics.
        #[arg(long, value_parser = ftlab_device::policy::ACTIONS)]
        action: String,
        /// The export (NAME, or NAME@SNAPSHOT for a snapshot or clone).
        #[arg(long)]
        export: String,
    },
    /// Make the server running on a durable directory (`serve --data DIR --policy FILE`) read
    /// its policy file again, through its control socket (as SIGHUP does): checked whole first,
    /// a refused file leaves the old policy in force and the error is printed (exit 1).
    Reload {
        /// The served device directory.
        dir: PathBuf,
    },
}

pub fn run(command: PolicyCommand) -> Result<()> {
    match command {
        PolicyCommand::Check {
            file,
            principals,
            action,
            export,
        } => check(&file, principals, &action, &export),
        PolicyCommand::Reload { dir } => crate::volumes_cmd::reload_policy(&dir),
    }
}

/// `ftlab policy check`: prints the decision and exits 3 when it is a denial.
fn check(file: &std::path::Path, names: Vec<String>, action: &str, export: &str) -> Result<()> {
    use ftlab_device::policy::{Policy, Principal};
    let policy = Policy::load(file)?;
    let principal = Principal { names };
    let decision = policy.decide(&principal, action, export);
    // The names as given on the command line (the logs write them as a JSON list).
    let who = if principal.names.is_empty() {
        "anonymous".to_string()
    } else {
        principal.names.join(" ")
    };
    println!("{who} {action} on {export}: {}", decision.explain(&policy));
    if !decision.allowed {
        std::process::exit(3);
    }
    Ok(())
}
