//! A PostgreSQL node's self-fence, against the real binary, a real PostgreSQL and the mock
//! provider's ledger (issue 24, findings 5 and 6):
//!
//! - a node whose lock session is terminated while its calls are at the provider keeps every
//!   answer the provider gave (and charged for): none ends `unknown`, each is charged once,
//!   and the images download with their sha256;
//! - a node cut off from PostgreSQL without a reset (a proxy between them that stops
//!   forwarding but keeps both sockets open — packets dropped, as a dead path behind a load
//!   balancer or a firewall that drops) fences itself within its lease, then answers 503 at
//!   once; its peer takes its work; after healing, the answers it kept land and nothing was
//!   charged twice;
//! - the cluster-wide provider cap holds while a fenced node's sent calls finish (issue #43):
//!   under a partition, a pause and a terminated lock session, never more than the cap at the
//!   provider at once, by the mock's arrival times.
//!
//! Each test gets its own database on the throw-away server (`scripts/with-postgres.sh`).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::common::{Daemon, Mock, OPENAI_MODEL, sha256_hex, submit, wait_for};
use crate::conformance::fixtures::pg_url;
use crate::pg_nodes::{database, node, openai, settled, sql, status};

/// The server process of node `name`'s lock session: the session holding its advisory lock.
fn lock_session(db: &str, name: &'static str) -> Option<i32> {
    sql(db, move |c| {
        c.query_opt(
            "SELECT l.pid FROM pg_locks l JOIN nodes n ON n.lock_key::bigint = l.objid::bigint
             WHERE l.locktype = 'advisory' AND l.classid = $1::bigint::oid AND l.objsubid = 2 AND l.granted
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND n.name = $2",
            &[&i64::from(tally::store::postgres::LOCK_CLASS), &name],
        )
        .expect("query")
        .map(|r| r.get(0))
    })
}

/// Every task succeeded, each prompt was charged exactly once at the provider (and sent once),
/// and each image downloads (from `d`) with the sha256 the task names.
fn every_answer_kept(mock: &Mock, d: &Daemon, tasks: &[(String, String)]) {
    let lines = mock.lines();
    for (prompt, id) in tasks {
        let sent: Vec<_> = lines.iter().filter(|l| l["prompt"].as_str() == Some(prompt.as_str())).collect();
        let charged = sent.iter().filter(|l| l["charged"] == true).count();
        assert_eq!((sent.len(), charged), (1, 1), "{prompt}: sent {} time(s), charged {charged}", sent.len());
        let t = d.call("GET", &format!("/v1/tasks/{id}"), None).json();
        let art = &t["artifacts"][0];
        let url = art["url"].as_str().unwrap_or_else(|| panic!("{prompt}: no image: {t}"));
        let r = d.call("GET", &url[url.find("/v1/").expect("path")..], None);
        assert_eq!(r.status, 200, "{prompt}: the image downloads");
        assert_eq!(Some(sha256_hex(&r.body).as_str()), art["sha256"].as_str(), "{prompt}: its sha256");
    }
}

/// Finding 5: the lock session of a node is terminated (`pg_terminate_backend`) while several
/// of its calls are inside a slow provider call. The node fences itself and takes its lock
/// again, but the calls already sent finish and their answers land: no task ends `unknown`,
/// every image is kept, and nothing is sent again. Alone, the node's own recovery leaves its
/// live workers alone, so no task is even marked `unknown` on the way.
#[test]
fn a_lock_session_drop_mid_call_keeps_every_paid_answer() {
    flap(false);
}

/// The same flap with a peer: the peer sees the node's lock free and may mark the node's
/// calls `unknown` at once; the node's answers then land as late results of the same
/// executions, so every task still ends `succeeded`, charged once.
#[test]
fn a_lock_session_drop_mid_call_with_a_peer_keeps_every_paid_answer() {
    flap(true);
}

fn flap(peer: bool) {
    let Some(url) = pg_url() else { return };
    let db = database(&url);
    const N: usize = 6;
    const LATENCY: Duration = Duration::from_millis(3_000);
    let mock = Mock::start(&["--latency-ms", &LATENCY.as_millis().to_string()]);
    let engine = "workers = 8\nlease_secs = 15\nheartbeat_secs = 2";
    let a = node(&db, "node-a", engine, &openai(&mock, 8));
    let mut tasks = Vec::new();
    for i in 0..N {
        let prompt = format!("flap {i}");
        let (code, id) = submit(&a, "openai", &prompt, &format!("flap-{i}")).expect("submitted");
        assert_eq!(code, 201);
        tasks.push((prompt, id));
    }
    // Every request is at the provider (its ledger line is written on arrival; the answer
    // leaves `LATENCY` later).
    wait_for(Duration::from_secs(20), || (mock.count("flap ").0 == N).then_some(())).expect("all calls arrived");
    // The peer starts after A claimed everything; its watcher waits on A's lock.
    let b = peer.then(|| node(&db, "node-b", engine, &openai(&mock, 8)));
    let arrived = Instant::now();
    let pid = lock_session(&db, "node-a").expect("node-a holds its lock");
    let ended: bool = sql(&db, move |c| c.query_one("SELECT pg_terminate_backend($1)", &[&pid]).expect("q").get(0));
    assert!(ended, "the lock session was terminated");
    assert!(arrived.elapsed() < LATENCY, "the lock session ended while the calls were still at the provider");
    // The node noticed and took its lock again (a new session).
    wait_for(Duration::from_secs(20), || a.stderr().contains("took the node lock again").then_some(()))
        .unwrap_or_else(|| panic!("node-a never took its lock again:\n{}", a.stderr()));
    assert_ne!(lock_session(&db, "node-a"), Some(pid), "a new lock session");
    let mut outcome = Vec::new();
    for (prompt, id) in &tasks {
        // With a peer, `unknown` may be a way station (a late result resolves it).
        let s = wait_for(Duration::from_secs(30), || {
            status(&a, id).filter(|s| if peer { s == "succeeded" } else { settled(s) })
        });
        outcome.push((prompt.clone(), s.unwrap_or_else(|| status(&a, id).unwrap_or_default())));
    }
    let lost: Vec<_> = outcome.iter().filter(|(_, s)| s != "succeeded").collect();
    assert!(lost.is_empty(), "answers the provider gave (and charged for) were thrown away: {lost:?}");
    every_answer_kept(&mock, &a, &tasks);
    let mut late = 0;
    for (prompt, id) in &tasks {
        let events = a.call("GET", &format!("/v1/tasks/{id}/events"), None).json();
        let kinds: Vec<&str> =
            events["events"].as_array().into_iter().flatten().filter_map(|e| e["kind"].as_str()).collect();
        if kinds.contains(&"late_result") {
            late += 1;
        }
        if !peer {
            assert!(!kinds.contains(&"unknown"), "{prompt}: marked unknown on the way: {kinds:?}");
        }
    }
    drop(b);
    eprintln!(
        "lock-session drop mid-call (peer: {peer}): {N} calls at the provider, {N} succeeded ({late} as late results), \
         0 unknown, each charged once"
    );
}

/// The cluster-wide cap holds while a fenced node's calls finish (issue #43, item 3): node A
/// has its provider's 4 slots at the provider when a partition cuts it off from PostgreSQL
/// (packets dropped, no reset). A fences itself and lets its calls finish (their answers are
/// kept and land after healing); node B takes A's work over when A's leases run out, marking
/// those calls `unknown` — but their slots stay taken until their deadline (the provider's
/// request timeout), so B sends none of the 4 queued tasks while A's 4 are still out. Read
/// from the mock's ledger: among the creates in arrival order, every fifth arrives at least
/// the mock's latency after the one four before it. (Before, B sent all four at once: 8 out.)
#[test]
fn a_partitioned_nodes_calls_keep_their_slots_until_their_deadline() {
    cap_while_fenced(Cut::Partition);
}

/// The same with node A paused (`SIGSTOP`, as a VM stall or a long GC pause would): its lock
/// session stays up, but its leases run out, B takes its calls over, and their slots stay
/// taken until their deadline; A, resumed, finds itself fenced and lands its answers late.
#[test]
fn a_paused_nodes_calls_keep_their_slots_until_their_deadline() {
    cap_while_fenced(Cut::Pause);
}

/// The same with node A's lock session terminated (`pg_terminate_backend`) while its calls are
/// at the provider and node B runs: A fences itself and takes its lock again, B may take its
/// work, and still no more than the cap is at the provider at once; every answer is kept.
#[test]
fn a_killed_lock_sessions_calls_keep_their_slots() {
    cap_while_fenced(Cut::SessionKill);
}

/// How node A is taken out of the cluster for a while.
#[derive(Clone, Copy)]
enum Cut {
    /// Its PostgreSQL traffic is dropped (no reset).
    Partition,
    /// Its process is stopped (`SIGSTOP`) and later continued.
    Pause,
    /// Its lock session is terminated on the server (it takes its lock again at once).
    SessionKill,
}

fn cap_while_fenced(how: Cut) {
    let Some(url) = pg_url() else { return };
    let db = database(&url);
    let hostport = db.split('@').nth(1).and_then(|r| r.split('/').next()).expect("host:port in the URL").to_string();
    let proxy = Blackhole::start(hostport.clone());
    let via = db.replacen(&hostport, &format!("127.0.0.1:{}", proxy.port), 1);
    const CAP: usize = 4;
    const N: usize = 8;
    const LEASE: Duration = Duration::from_secs(4);
    const LATENCY: Duration = Duration::from_millis(8_000);
    let mock = Mock::start(&["--latency-ms", &LATENCY.as_millis().to_string()]);
    let provider = format!(
        "[[providers]]\nname = \"openai\"\nkind = \"openai_images\"\nbase_url = \"{}\"\nmodel = \"{OPENAI_MODEL}\"\n\
         api_key_env = \"TALLY_TEST_KEY\"\nmax_concurrency = {CAP}\nrequest_timeout_ms = 10000\nconnect_timeout_ms = 1000\n",
        mock.base()
    );
    let engine = format!("workers = 8\nlease_secs = {}\nheartbeat_secs = 1", LEASE.as_secs());
    let a = node(&via, "node-a", &engine, &provider);
    let mut tasks = Vec::new();
    for i in 0..N {
        let prompt = format!("capcut {i}");
        let (code, id) = submit(&a, "openai", &prompt, &format!("capcut-{i}")).expect("submitted");
        assert_eq!(code, 201);
        tasks.push((prompt, id));
    }
    wait_for(Duration::from_secs(20), || (mock.count("capcut ").0 == CAP).then_some(()))
        .expect("the cap's calls arrived");
    let b = node(&db, "node-b", &engine, &provider);
    let pid = a.child.as_ref().map(|c| c.id().to_string()).expect("node A runs");
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill").args([sig, &pid]).status().is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    };
    match how {
        Cut::Partition => proxy.set(true),
        Cut::Pause => signal("-STOP"),
        Cut::SessionKill => {
            let session = lock_session(&db, "node-a").expect("node-a holds its lock");
            let ended: bool =
                sql(&db, move |c| c.query_one("SELECT pg_terminate_backend($1)", &[&session]).expect("q").get(0));
            assert!(ended, "the lock session was terminated");
        }
    }
    // B takes A's calls over (unknown: the provider proves nothing) and, in time, runs the rest.
    for (prompt, id) in &tasks {
        wait_for(Duration::from_secs(60), || status(&b, id).filter(|s| settled(s)))
            .unwrap_or_else(|| panic!("{prompt}: never settled; B's log:\n{}", b.stderr()));
    }
    match how {
        Cut::Partition => proxy.set(false),
        Cut::Pause => signal("-CONT"),
        Cut::SessionKill => {}
    }
    match how {
        // A kept its answers through the partition or the lost session: they land (as late
        // results where B had taken the tasks over).
        Cut::Partition | Cut::SessionKill => {
            for (prompt, id) in &tasks {
                let s = wait_for(Duration::from_secs(30), || status(&b, id).filter(|s| s == "succeeded"));
                assert!(s.is_some(), "{prompt}: {:?}; A's log:\n{}", status(&b, id), a.stderr());
            }
            every_answer_kept(&mock, &b, &tasks);
        }
        // A paused past its calls' request timeout may find them timed out when it resumes
        // (the answer waited in a socket it did not read): those stay `unknown`, honestly.
        // Nothing is charged twice either way.
        Cut::Pause => {
            for (prompt, _) in &tasks {
                let charged = mock.lines().iter().filter(|l| l["charged"] == true && l["prompt"] == *prompt).count();
                assert_eq!(charged, 1, "{prompt} charged {charged} times");
            }
        }
    }
    let mut creates: Vec<i64> = mock
        .lines()
        .iter()
        .filter(|l| l["charged"] == true && l["prompt"].as_str().is_some_and(|p| p.starts_with("capcut ")))
        .map(crate::pg_nodes::ts_ms)
        .collect();
    creates.sort();
    assert_eq!(creates.len(), N, "one charged create per task");
    for w in creates.windows(CAP + 1) {
        assert!(
            w[CAP] - w[0] >= LATENCY.as_millis() as i64 - 40,
            "{} requests at once at the provider with a cap of {CAP}: arrivals {w:?}",
            CAP + 1
        );
    }
}

/// A TCP proxy that can drop the path without a reset: cut, it stops forwarding (and connects
/// nothing new upstream) but keeps every socket open, so neither side sees an error — the
/// bytes wait, as in a network that drops packets; healed, it forwards what waited.
struct Blackhole {
    port: u16,
    cut: Arc<(Mutex<bool>, Condvar)>,
}

impl Blackhole {
    fn start(upstream: String) -> Blackhole {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let cut = Arc::new((Mutex::new(false), Condvar::new()));
        let c = cut.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (c, upstream) = (c.clone(), upstream.clone());
                std::thread::spawn(move || {
                    wait_open(&c);
                    let Ok(server) = TcpStream::connect(&upstream) else { return };
                    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else { return };
                    let c3 = c.clone();
                    std::thread::spawn(move || pump(c2, s2, &c3));
                    pump(server, client, &c);
                });
            }
        });
        Blackhole { port, cut }
    }

    fn set(&self, cut: bool) {
        *self.cut.0.lock().unwrap_or_else(|e| e.into_inner()) = cut;
        self.cut.1.notify_all();
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        self.set(false);
    }
}

fn wait_open(cut: &(Mutex<bool>, Condvar)) {
    let mut g = cut.0.lock().unwrap_or_else(|e| e.into_inner());
    while *g {
        g = cut.1.wait(g).unwrap_or_else(|e| e.into_inner());
    }
}

/// Forward `from` → `to`; while cut, hold what was read.
fn pump(mut from: TcpStream, mut to: TcpStream, cut: &(Mutex<bool>, Condvar)) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from.read(&mut buf).unwrap_or(0);
        wait_open(cut);
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            let _ = to.shutdown(Shutdown::Write);
            return;
        }
    }
}

/// The status of one request to `port`, or `None` if no answer came within `limit`.
fn answer_within(port: u16, limit: Duration, method: &str, path: &str, token: &str, body: &str) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(limit)).ok()?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).ok()?;
    let mut first = [0u8; 12];
    s.read_exact(&mut first).ok()?;
    std::str::from_utf8(&first[9..12]).ok()?.parse().ok()
}

/// Finding 6: node A reaches PostgreSQL through a proxy that then drops the path without a
/// reset. A notices within its lease (its lock session's liveness check goes unanswered),
/// fences itself, and from then on its API answers 503 within a second instead of hanging;
/// node B, connected directly, takes A's work when A's leases run out. After healing, the
/// answers A received meanwhile land, every task succeeded, and nothing was charged twice.
#[test]
fn a_node_cut_off_without_a_reset_fences_itself_and_answers_503_at_once() {
    let Some(url) = pg_url() else { return };
    let db = database(&url);
    // postgres://user@host:port/db → host:port
    let hostport = db.split('@').nth(1).and_then(|r| r.split('/').next()).expect("host:port in the URL").to_string();
    let proxy = Blackhole::start(hostport.clone());
    let via = db.replacen(&hostport, &format!("127.0.0.1:{}", proxy.port), 1);
    const LEASE: Duration = Duration::from_secs(6);
    const N: usize = 3;
    // The calls are at the provider for the whole partition: their answers arrive while A
    // cannot store them.
    let mock = Mock::start(&["--latency-ms", "12000"]);
    let provider = format!(
        "[[providers]]\nname = \"openai\"\nkind = \"openai_images\"\nbase_url = \"{}\"\nmodel = \"{OPENAI_MODEL}\"\n\
         api_key_env = \"TALLY_TEST_KEY\"\nmax_concurrency = 4\nrequest_timeout_ms = 30000\nconnect_timeout_ms = 1000\n",
        mock.base()
    );
    let engine = format!("workers = 4\nlease_secs = {}\nheartbeat_secs = 1", LEASE.as_secs());
    let a = node(&via, "node-a", &engine, &provider);
    let mut tasks = Vec::new();
    for i in 0..N {
        let prompt = format!("cut {i}");
        let (code, id) = submit(&a, "openai", &prompt, &format!("cut-{i}")).expect("submitted");
        assert_eq!(code, 201);
        tasks.push((prompt, id));
    }
    wait_for(Duration::from_secs(20), || (mock.count("cut ").0 == N).then_some(())).expect("A's calls arrived");
    // B starts after A claimed everything (A's lock is held, so B leaves A's leases alone).
    let b = node(&db, "node-b", &engine, &provider);
    let token = a.token();
    let (first, _) = &tasks[0];
    let path = format!("/v1/tasks/{}", tasks[0].1);
    assert_eq!(answer_within(a.port, Duration::from_secs(5), "GET", &path, &token, ""), Some(200), "{first}");

    proxy.set(true);
    let cut = Instant::now();
    // A notices within its lease: its API answers 503 (a request sent before it noticed is
    // answered 503 the moment it does).
    let fenced = wait_for(LEASE + Duration::from_secs(10), || {
        (answer_within(a.port, Duration::from_millis(1_500), "GET", &path, &token, "") == Some(503))
            .then(|| cut.elapsed())
    })
    .unwrap_or_else(|| panic!("node A never answered 503 while cut off; its log:\n{}", a.stderr()));
    assert!(fenced < LEASE, "node A noticed only after {fenced:?}, not within its {LEASE:?} lease");
    assert!(a.stderr().contains("did not answer the node's liveness check"), "{}", a.stderr());
    // From then on every answer comes at once.
    let submit_body = serde_json::json!({"prompt": "cut late", "provider": "openai", "idempotency_key": "cut-late"});
    for _ in 0..3 {
        for (method, p, body) in [("GET", path.as_str(), String::new()), ("POST", "/v1/tasks", submit_body.to_string())]
        {
            let t = Instant::now();
            let got = answer_within(a.port, Duration::from_secs(5), method, p, &token, &body);
            assert_eq!(got, Some(503), "{method} {p} while cut off");
            assert!(t.elapsed() < Duration::from_secs(1), "{method} {p} took {:?}", t.elapsed());
        }
    }
    // B takes A's work when A's leases run out (the provider here proves nothing, so B marks
    // the calls `unknown`; it sends nothing again).
    for (prompt, id) in &tasks {
        wait_for(LEASE * 3, || status(&b, id).filter(|s| settled(s)))
            .unwrap_or_else(|| panic!("{prompt}: node B never took it over; B's log:\n{}", b.stderr()));
    }
    let partition = cut.elapsed();
    proxy.set(false);
    // A can reach the database again, and the answers it kept land as late results.
    wait_for(Duration::from_secs(30), || {
        (answer_within(a.port, Duration::from_secs(5), "GET", &path, &token, "") == Some(200)).then_some(())
    })
    .unwrap_or_else(|| panic!("node A never answered again after healing; its log:\n{}", a.stderr()));
    for (prompt, id) in &tasks {
        let s = wait_for(Duration::from_secs(30), || status(&b, id).filter(|s| s == "succeeded"));
        assert!(s.is_some(), "{prompt}: the answer A kept did not land; A's log:\n{}", a.stderr());
    }
    every_answer_kept(&mock, &b, &tasks);
    // The submit A refused while cut off never ran.
    assert_eq!(mock.count("cut late").0, 0, "a submit answered 503 must not run later");
    eprintln!(
        "blackhole: node A answered 503 {fenced:?} after the cut (lease {LEASE:?}), then each request within 1 s; \
         B took over; healed after {partition:?}; {N} answers kept, each charged once"
    );
}
