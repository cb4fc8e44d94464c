//! SQLite through the ftlab VFS on a durable device, killed for real.

use crate::support::temp_dir;
use rusqlite::{Connection, OpenFlags};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

/// `ftlab sqlite-bench --device DIR` is killed with SIGKILL in the middle of its transactions,
/// twice per journal mode (the second run goes on with the recovered database): reopening the
/// device then gives a database that passes integrity_check and holds every transaction whose
/// COMMIT had returned (its `commits` counter at least the commits the runs printed, at most
/// one more per run: a COMMIT may return just before the kill and not be printed).
#[test]
fn a_killed_sqlite_process_keeps_every_committed_transaction() {
    ftlab_sqlite::register().unwrap();
    for (m, mode) in ["delete", "wal", "truncate", "persist"].iter().enumerate() {
        let dir = temp_dir(&format!("sqlite-kill-{mode}"));
        let device = dir.join("dev");
        let mut printed = 0u64;
        for run in 0..2u64 {
            let mut child = Command::new(env!("CARGO_BIN_EXE_ftlab"))
                .args(["sqlite-bench", "--journal-mode", mode, "--device"])
                .arg(&device)
                .args([
                    "--log-commits",
                    "--no-baseline",
                    "--transactions",
                    "100000000",
                ])
                .args(["--seed", &(run + 1).to_string()])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let target = 60 + 47 * run + 23 * m as u64;
            let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
            let mut last = 0;
            for line in lines.by_ref() {
                let line = line.unwrap();
                last = line.strip_prefix("committed ").unwrap().parse().unwrap();
                if last >= target {
                    break;
                }
            }
            assert!(last >= target, "{mode}: the run ended after {last} commits");
            child.kill().unwrap();
            child.wait().unwrap();
            // What was printed before the kill still counts.
            for line in lines {
                last = line
                    .unwrap()
                    .strip_prefix("committed ")
                    .unwrap()
                    .parse()
                    .unwrap();
            }
            printed += last;
        }
        let c = Connection::open_with_flags(
            format!(
                "file:bench.db?vfs=ftlab&size=128M&device={}",
                device.display()
            ),
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_URI,
        )
        .unwrap();
        let check: String = c
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok", "{mode}");
        let n: u64 = c
            .query_row("SELECT n FROM commits", [], |r| r.get(0))
            .unwrap();
        assert!(
            n >= printed && n <= printed + 2,
            "{mode}: {n} transactions in the database, {printed} were told committed"
        );
        let orders: i64 = c
            .query_row("SELECT count(*) FROM orders", [], |r| r.get(0))
            .unwrap();
        assert!(orders > 0);
    }
}
