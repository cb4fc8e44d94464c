//! `serve --metrics` under abuse: a client that trickles its request head, a silent one, and a
//! flood of scrapes the policy denies.

use crate::support::temp_dir;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A server, killed on drop (a failing test leaves none behind).
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `ftlab serve --metrics 127.0.0.1:0` with `extra`; the server and the metrics address.
fn serve(dir: &Path, extra: &[&str]) -> (Server, String) {
    let log = dir.join("serve.log");
    let server = Server(
        Command::new(env!("CARGO_BIN_EXE_ftlab"))
            .args(["serve", "--no-tcp", "--unix"])
            .arg(dir.join("nbd.sock"))
            .args(["--set", "capacity.logical_bytes=16777216"])
            .args(["--metrics", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    for _ in 0..500 {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(at) = text.find("metrics on http://") {
            let rest = &text[at + "metrics on http://".len()..];
            let addr = rest[..rest.find('/').unwrap()].to_string();
            return (server, addr);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!(
        "no metrics address: {}",
        std::fs::read_to_string(&log).unwrap()
    );
}

/// One scrape; its status line and how long it took.
fn scrape(addr: &str) -> (String, Duration) {
    let started = Instant::now();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    let status = answer.lines().next().unwrap_or("").to_string();
    (status, started.elapsed())
}

/// A client sending its head a byte every 300 ms, and one that sends nothing, delay no one
/// else's scrape (they were answered one at a time, each read waiting up to 5 s: the trickling
/// client held every scrape for as long as it went on); each is cut off at its deadline.
#[test]
fn slow_and_silent_clients_delay_no_scrape() {
    let dir = temp_dir("metrics-abuse");
    let (_server, addr) = serve(dir.path(), &[]);
    let silent = TcpStream::connect(&addr).unwrap();
    let trickle_addr = addr.clone();
    let trickler = std::thread::spawn(move || {
        let mut s = TcpStream::connect(&trickle_addr).unwrap();
        let started = Instant::now();
        for b in b"GET /metrics HTTP/1.1\r\nX-Slow: ".iter().cycle().take(40) {
            if s.write_all(&[*b]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        started.elapsed()
    });
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..5 {
        let (status, took) = scrape(&addr);
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert!(took < Duration::from_secs(1), "a scrape took {took:?}");
    }
    // The trickler is cut off at the head's deadline: its writes fail once the server closed.
    let trickled = trickler.join().unwrap();
    assert!(trickled < Duration::from_secs(11), "{trickled:?}");
    let mut buf = [0u8; 1];
    silent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(
        (&silent).read(&mut buf).unwrap_or(0),
        0,
        "the silent client is closed"
    );
}

/// Denied scrapes flood the audit log no more: the first denial of a principal and action in
/// a minute is written in full, the rest are counted (each scrape wrote a line), and the
/// principal is a JSON list.
#[test]
fn a_flood_of_denied_scrapes_is_audited_once_a_minute() {
    let dir = temp_dir("metrics-denied");
    let policy = dir.join("policy.toml");
    std::fs::write(
        &policy,
        "[[statement]]\neffect = \"allow\"\nprincipals = [\"*\"]\nactions = [\"read\"]\nexports = [\"*\"]\n",
    )
    .unwrap();
    let audit = dir.join("audit.log");
    let (server, addr) = serve(
        dir.path(),
        &[
            "--policy",
            policy.to_str().unwrap(),
            "--audit",
            audit.to_str().unwrap(),
        ],
    );
    for _ in 0..200 {
        assert_eq!(scrape(&addr).0, "HTTP/1.1 403 Forbidden");
    }
    drop(server);
    let denied: Vec<serde_json::Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["event"] == "denied" && e["action"] == "metrics")
        .collect();
    assert_eq!(denied.len(), 1, "{denied:?}");
    assert_eq!(denied[0]["principal"], serde_json::json!(["anonymous"]));
}
