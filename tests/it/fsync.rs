//! A failed fsync stops the daemon (pipelined group commit, `store::sqlite::flush`): the real
//! binary with the `fsync-fails` failpoint, which makes the flusher's fdatasync of the WAL fail
//! after a number of good ones. What must hold, seen from outside: no submit is answered
//! "accepted" by the failed fsync or after it, the daemon says why and exits 1 as for any
//! database it cannot use, and after a restart (the process died, the disk kept its page cache)
//! every task it did accept is there, each charged at most once by the mock provider, and each
//! one that succeeded downloads with its sha256.
//!
//! Needs a binary built with `--features failpoints`.

use std::process::Command;
use std::time::Duration;

use crate::common::{Daemon, EXE, Mock, providers, sha256_hex, try_request, wait_for};

#[test]
fn a_failed_fsync_stops_the_daemon_with_exit_1_and_keeps_what_it_accepted() {
    let mock = Mock::start(&["--job-duration-ms", "50", "--honor-idempotency-key"]);
    let mut d = Daemon::configure(&providers(&mock));
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-fsync".into()));
    // Thirty good fsyncs (start-up's and the first tasks'), then every one fails.
    d.env.push(("FAILPOINTS".into(), "fsync-fails=30*off->return".into()));
    d.spawn();
    let run = uuid::Uuid::new_v4();
    let auth = format!("Bearer {}", d.token());
    let mut accepted = Vec::new();
    let mut refused = None;
    for i in 0..1000 {
        let prompt = format!("fsync {i} of {run}");
        let key = uuid::Uuid::new_v4().to_string();
        let body = serde_json::json!({"prompt": prompt, "provider": "idem", "idempotency_key": key}).to_string();
        let headers = [("Authorization", auth.as_str()), ("Content-Type", "application/json")];
        match try_request(d.port, "POST", "/v1/tasks", &headers, Some(body.as_bytes())) {
            Some(r) if r.status == 201 => {
                let id = r.json()["id"].as_str().expect("id").to_string();
                accepted.push((id, prompt));
            }
            // The daemon refused it or was gone already: either way not accepted.
            other => {
                refused = Some(other.map(|r| (r.status, String::from_utf8_lossy(&r.body).into_owned())));
                break;
            }
        }
    }
    let refused = refused.unwrap_or_else(|| panic!("1000 submits accepted: the fsync never failed\n{}", d.stderr()));
    if let Some((status, body)) = &refused {
        assert_eq!(*status, 503, "the submit the failed fsync answered: {body}");
    }
    eprintln!("{} submits accepted before the failed fsync; then {:?}", accepted.len(), refused.as_ref().map(|r| r.0));
    assert!(accepted.len() >= 3, "only {} submits accepted before the failure:\n{}", accepted.len(), d.stderr());

    let exited = wait_for(Duration::from_secs(30), || d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()));
    let status = exited.unwrap_or_else(|| panic!("the daemon kept running after a failed fsync:\n{}", d.stderr()));
    d.child = None;
    assert_eq!(status.code(), Some(1), "exit as for a database it cannot use:\n{}", d.stderr());
    let log = d.stderr();
    assert!(
        log.contains("ERROR")
            && log.contains("the disk failed to save data: fsync of")
            && log.contains("tally stopped writing to avoid losing data"),
        "the daemon did not say why it stopped:\n{log}"
    );

    // Restarted without the failpoint: everything it accepted is there and ends once.
    d.env.retain(|(k, _)| k != "FAILPOINTS");
    d.spawn();
    for (id, prompt) in &accepted {
        let t = d.wait_status(id, &["succeeded", "failed", "unknown", "canceled"]);
        let (_, charged) = mock.count(prompt);
        assert!(charged <= 1, "{id}: charged {charged} times: {t}");
        if t["status"] == "succeeded" {
            assert_eq!(charged, 1, "{id}: succeeded without a charge: {t}");
            let art = &t["artifacts"][0];
            let img = d.call("GET", art["url"].as_str().expect("url"), None);
            assert_eq!(sha256_hex(&img.body), art["sha256"].as_str().expect("sha256"), "{id}");
        }
    }
    assert!(d.term().success(), "clean stop after the restart:\n{}", d.stderr());
    let check = Command::new(EXE).args(["check", "--config"]).arg(&d.config).output().expect("check runs");
    assert!(check.status.success(), "tally check:\n{}", String::from_utf8_lossy(&check.stdout));
}
