//! Hostile world, round three (issue #43), the parts kept here: a session's live stream ends
//! when the session does; a lost write-ahead log after `kill -9` is said where the owner looks
//! (`GET /v1/held`, `tally held list`) with how many commits, their window and the providers to
//! check, until dismissed; bodies the OpenAPI document allows are taken.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{Daemon, FAST_DEMO, Mock, TempDir, request, sha256_hex, wait_for};
use crate::web::printed_sign_in_url;

/// Sign a browser in with a new one-time link (`tally sign-in`); its session cookie (`name=value`).
fn session_cookie(d: &Daemon) -> String {
    let out = d.cli(&["sign-in"]);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    let url = said.split_whitespace().find(|w| w.contains("/login?code=")).expect("a sign-in link").to_string();
    let path = url.split_once(&format!("127.0.0.1:{}", d.port)).map(|(_, p)| p.to_string()).expect("path");
    let r = request(d.port, "GET", &path, &[], None);
    let cookie = r.header("set-cookie").expect("a session cookie");
    cookie.split(';').next().unwrap_or_default().to_string()
}

/// Open `GET /v1/stream` with `cookie`; the socket, after its 200 head.
fn open_stream(d: &Daemon, cookie: &str) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", d.port)).expect("connect");
    let req = format!(
        "GET /v1/stream HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAccept: text/event-stream\r\nCookie: {cookie}\r\n\r\n",
        d.port
    );
    s.write_all(req.as_bytes()).expect("send");
    s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let mut head = [0u8; 512];
    let n = s.read(&mut head).expect("head");
    assert!(String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head[..n]));
    s
}

/// Whether the stream's connection ends (EOF, or the chunked body's last chunk) within `limit`.
fn ends_within(s: &mut TcpStream, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    s.set_read_timeout(Some(Duration::from_millis(200))).expect("timeout");
    let mut buf = [0u8; 4096];
    while Instant::now() < end {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(n) if buf[..n].windows(5).any(|w| w == b"0\r\n\r\n") => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return true,
        }
    }
    false
}

#[test]
fn a_live_stream_ends_within_a_second_of_its_session_ending() {
    let mut d = Daemon::start(crate::common::FAST_DEMO);
    // Two browsers signed in, each with its live stream.
    let _ = printed_sign_in_url(&d);
    let mine = session_cookie(&d);
    let mut s = open_stream(&d, &mine);
    let other = session_cookie(&d);
    let mut t = open_stream(&d, &other);
    // `sign-out --all` ends every session, and so each session's stream.
    let out = d.cli(&["sign-out", "--all"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(ends_within(&mut s, Duration::from_secs(1)), "the stream stayed open after sign-out --all");
    assert!(ends_within(&mut t, Duration::from_secs(1)), "the other stream stayed open");
    // A stream opened with the API token is not a session's: it stays.
    let token = format!("Bearer {}", d.token());
    let mut u = TcpStream::connect(("127.0.0.1", d.port)).expect("connect");
    let req = format!("GET /v1/stream HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: {token}\r\n\r\n", d.port);
    u.write_all(req.as_bytes()).expect("send");
    let out = d.cli(&["sign-out", "--all"]);
    assert!(out.status.success());
    assert!(!ends_within(&mut u, Duration::from_millis(800)), "the token's stream ended with the sessions");
    d.term();
}

#[test]
fn a_lost_write_ahead_log_is_said_in_held_until_dismissed() {
    let mock = Mock::start(&["--job-duration-ms", "60000", "--latency-ms", "100"]);
    let providers = format!(
        "[[providers]]\nname = \"rep\"\nkind = \"replicate\"\nbase_url = \"{}\"\nmodel = \"acme/flux\"\n\
         api_key_env = \"TALLY_TEST_KEY\"\nmax_concurrency = 8\n",
        mock.base()
    );
    let mut d = Daemon::configure(&providers);
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-wal".into()));
    d.spawn();
    for i in 0..4 {
        let r = d.call("POST", "/v1/tasks", Some(&json!({"prompt": format!("wal tail {i}"), "provider": "rep"})));
        assert_eq!(r.status, 201);
    }
    let sent = wait_for(Duration::from_secs(20), || (mock.count("wal tail").1 >= 4).then_some(()));
    assert!(sent.is_some(), "the mock was not asked for all four");
    d.kill();
    let wal = d.data.join("tally.db-wal");
    assert!(std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0), "a WAL to delete");
    std::fs::remove_file(&wal).expect("delete the WAL");
    d.spawn();
    let held = d.call("GET", "/v1/held", None).json();
    let notices = held["notices"].as_array().cloned().unwrap_or_default();
    assert_eq!(notices.len(), 1, "{held}");
    let n = &notices[0];
    assert_eq!(n["kind"], "lost_tail");
    assert!(n["missing_commits"].as_i64().unwrap_or(0) >= 1, "{n}");
    assert_eq!(n["providers"], json!(["rep"]), "the providers to check: {n}");
    assert!(n["until"].is_string(), "{n}");
    let message = n["message"].as_str().unwrap_or_default();
    assert!(message.contains("lost") && message.contains("rep"), "{message}");
    let out = d.cli(&["held", "list"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("commit(s) were lost") && text.contains("rep"), "{text}");
    // Dismissed once checked; a second dismissal finds nothing.
    let id = n["id"].as_i64().expect("id");
    assert_eq!(d.call("POST", &format!("/v1/held/notices/{id}/dismiss"), Some(&json!({}))).status, 200);
    assert_eq!(d.call("GET", "/v1/held", None).json()["notices"], json!([]));
    assert_eq!(d.call("POST", &format!("/v1/held/notices/{id}/dismiss"), Some(&json!({}))).status, 404);
    // The lost submits were charged at the provider and are gone from tally; nothing is sent again.
    assert_eq!(mock.count("wal tail").1, 4, "nothing sent twice");
    d.term();
}

#[test]
fn bodies_the_document_allows_are_taken() {
    let mut d = Daemon::start(crate::common::FAST_DEMO);
    let s = d.call(
        "POST",
        "/v1/sets",
        Some(&json!({"product": "mug", "shots": [{"role": "main", "prompt": "a mug", "candidates": 1.0}]})),
    );
    assert_eq!(s.status, 201, "{}", String::from_utf8_lossy(&s.body));
    let id = s.json()["id"].as_str().expect("id").to_string();
    let r = d.call("POST", &format!("/v1/sets/{id}/shots/0/candidates"), Some(&json!({"count": 1.0})));
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let r = d.call("POST", &format!("/v1/sets/{id}/shots/0/candidates"), Some(&json!({"count": 1.5})));
    assert_eq!(r.status, 422, "a fraction is not a count");
    let r = d.call("POST", "/v1/held/release", Some(&json!({"all": false, "ids": []})));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json(), json!({"released": [], "not_held": []}));
    d.term();
}

/// Prune and the retention timer leave a set alone while a delivery of it has not ended (a
/// prune one second into a 20-file delivery used to delete the set: 13 of 20 files failed "the
/// chosen image … is no longer stored"), and take it once the delivery has ended. The delivery
/// is held open by a pause before each file is made (`deliver-before-render=sleep(…)`).
#[test]
fn prune_waits_for_a_delivery_of_the_set_to_end() {
    let tmp = TempDir::new();
    let out = tmp.path().join("out");
    let mut d = Daemon::configure(&format!(
        "{FAST_DEMO}\n[[delivery.targets]]\nname = \"out\"\nkind = \"folder\"\npath = \"{}\"\n",
        out.display()
    ));
    d.env.push(("FAILPOINTS".into(), "deliver-before-render=sleep(1500)".into()));
    d.spawn();
    let (set, arts) = crate::deliveries::chosen_set(&d, true);
    let delivery = crate::deliveries::deliver(&d, &set, "original", "out", false);

    // While the delivery is open (its first file waits 1.5 s), prune everything settled.
    let open = d.call("GET", &format!("/v1/deliveries/{delivery}"), None).json();
    assert!(["queued", "delivering"].contains(&open["state"].as_str().unwrap_or_default()), "{open}");
    let r = d.call("POST", "/v1/prune", Some(&serde_json::json!({"older_than": "0s"})));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let report = r.json();
    assert_eq!(report["sets"], 0, "a set with an open delivery was pruned: {report}");
    assert!(report["kept_in_sets"].as_u64().unwrap_or(0) >= 2, "{report}");
    assert_eq!(d.call("GET", &format!("/v1/sets/{set}"), None).status, 200);

    // The delivery ends with every file written, byte for byte.
    let ended = crate::deliveries::ended(&d, &delivery);
    assert_eq!(ended["state"], "delivered", "{ended}");
    let mut written: Vec<String> = std::fs::read_dir(&out)
        .expect("out")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".png"))
        .map(|e| sha256_hex(&std::fs::read(e.path()).expect("read")))
        .collect();
    written.sort();
    let mut want: Vec<String> = arts.iter().map(|(_, sha)| sha.clone()).collect();
    want.sort();
    assert_eq!(written, want, "each chosen image delivered once, intact");

    // Once it has ended, the next prune takes the set; its images are then a clean 404.
    let r = d.call("POST", "/v1/prune", Some(&serde_json::json!({"older_than": "0s"})));
    assert_eq!(r.json()["sets"], 1, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(d.call("GET", &format!("/v1/sets/{set}"), None).status, 404);
    for (a, _) in &arts {
        let r = d.call("GET", &format!("/v1/artifacts/{a}"), None);
        assert_eq!((r.status, r.error_code()), (404, "not_found".to_string()), "{}", String::from_utf8_lossy(&r.body));
    }
}
