//! Hostile local clients against the real binary: idle connections that never send a request
//! must not take the daemon's file descriptors (saving a paid image once failed that way and
//! the result ended `unknown`), and a request that never finishes its head or body is closed.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Daemon, FAST_DEMO, wait_for};

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// Status of a task, read straight from the database (the API may be unreachable while the
/// idle connections fill the daemon's queue).
fn status_in_db(d: &Daemon, id: &str) -> Option<String> {
    let c = rusqlite::Connection::open_with_flags(d.data.join("tally.db"), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .ok()?;
    c.query_row("SELECT status FROM tasks WHERE id = ?1", [id], |r| r.get(0)).ok()
}

/// The daemon runs with 256 open files allowed; 400 idle connections used to take them all,
/// so the image of a task at the provider could not be saved and the paid result ended
/// `unknown`. Now connections are capped well below the limit (the rest wait in the kernel's
/// backlog) and idle ones are closed after the header timeout: the image is saved.
#[test]
fn idle_connections_exhausted_file_descriptors_and_lost_a_paid_image() {
    let slow = "[[providers]]\nname = \"demo\"\nkind = \"demo\"\nmax_concurrency = 2\ndelay_ms = 1500\n";
    let mut d = Daemon::configure(slow);
    // `prlimit` sets the limit for the daemon only (hard = soft: it cannot raise it).
    let log = std::fs::File::create(d.dir.path().join("serve.err")).expect("log");
    let child = Command::new("prlimit")
        .args(["--nofile=256:256", "--"])
        .arg(crate::common::EXE)
        .args(["serve", "--config"])
        .arg(&d.config)
        .env_remove("TALLY_DATA_DIR")
        .env_remove("TALLY_CONFIG")
        .env_remove("FAILPOINTS")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("prlimit runs tally serve");
    let pid = child.id();
    d.child = Some(child);
    let port = d.port;
    assert!(wait_for(Duration::from_secs(30), || TcpStream::connect(("127.0.0.1", port)).ok()).is_some());
    let r = d.call("POST", "/v1/tasks", Some(&serde_json::json!({"prompt": "saved under a flood"})));
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let id = r.json()["id"].as_str().expect("id").to_string();

    // While the provider works on it, 400 connections open and send nothing.
    let mut idle = Vec::new();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    for _ in 0..400 {
        if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            idle.push(s);
        }
    }
    assert!(idle.len() >= 300, "the kernel refused the idle connections: {}", idle.len());
    let fds = open_fds(pid);
    let done = wait_for(Duration::from_secs(20), || {
        status_in_db(&d, &id).filter(|s| ["succeeded", "failed", "unknown"].contains(&s.as_str()))
    });
    let fds = fds.max(open_fds(pid));
    assert_eq!(done.as_deref(), Some("succeeded"), "the paid image was not saved under the flood:\n{}", d.stderr());
    assert!(fds < 256 - 16, "the daemon holds {fds} descriptors of 256");

    // An idle connection that was accepted is closed by the daemon (header timeout).
    let first = &mut idle[0];
    first.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let started = Instant::now();
    let mut buf = [0u8; 16];
    let n = first.read(&mut buf);
    assert!(matches!(n, Ok(0) | Err(_)), "an idle connection stayed open: {n:?}");
    assert!(started.elapsed() < Duration::from_secs(25), "closed only after {:?}", started.elapsed());
    drop(idle);
    let t = d.call("GET", &format!("/v1/tasks/{id}"), None).json();
    let art = &t["artifacts"][0];
    let img = d.call("GET", art["url"].as_str().expect("url"), None);
    assert_eq!(crate::common::sha256_hex(&img.body), art["sha256"].as_str().expect("sha"));
    eprintln!("flood: {fds} descriptors at most while the image was saved");
    assert!(d.term().success());
}

/// A request head that never ends, and a body that never ends, are both cut off.
#[test]
fn a_request_that_never_finishes_is_closed() {
    let d = Daemon::start(FAST_DEMO);
    let mut head = TcpStream::connect(("127.0.0.1", d.port)).expect("connect");
    head.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n").expect("write");
    head.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let mut buf = Vec::new();
    let started = Instant::now();
    let _ = head.read_to_end(&mut buf);
    assert!(started.elapsed() < Duration::from_secs(25), "an unfinished head was kept open");

    let token = d.token();
    let mut body = TcpStream::connect(("127.0.0.1", d.port)).expect("connect");
    let req = format!(
        "POST /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"prompt\": "
    );
    body.write_all(req.as_bytes()).expect("write");
    body.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    let mut answer = Vec::new();
    let _ = body.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 400"), "a body that never ended: {text}");
    let list = d.call("GET", "/v1/tasks", None).json();
    assert_eq!(list["tasks"].as_array().map(Vec::len), Some(0), "a partial body made a task");
}
