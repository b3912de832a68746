//! The chaos soak (DESIGN §9): a client submits tasks across every provider kind while the
//! mock provider turns slow, fails and drops answers, and a driver SIGKILLs the daemon at
//! random moments and restarts it, or freezes it (SIGSTOP) for longer than a lease and lets
//! it go on (SIGCONT), so its workers return after the reconciler may have taken their leases. A submit whose answer was lost is retried with the same
//! idempotency key. At the end every task the client saw accepted must be settled (terminal
//! or `unknown`), and the mock's ledger must show no prompt charged twice.
//!
//! On SQLite the soak also copies the database twice while it runs — `tally.db` by hand
//! (without its `-wal`) and with `tally backup` — and, once the daemon settled everything, serves
//! each copy in a new data directory against the same mock (the backup through `tally
//! restore`): the ledger must still show no prompt charged twice, and every job the copies hold
//! must say why (`crash::oldcopy::serve_older_copy`).
//!
//! Runs on SQLite (`chaos_soak`) and with the daemon's data on PostgreSQL
//! (`chaos_soak_postgres`). Bounded for CI; `TALLY_SOAK_TASKS=2000 TALLY_SOAK_SECS=600` runs a
//! long one.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::common::{Daemon, Mock, providers, submit, wait_for};

/// A small deterministic random source (xorshift64*), seeded and printed for reruns.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn kill(d: &mut Daemon) {
    if let Some(mut c) = d.child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// At most this many freezes per soak (each lasts longer than a lease).
const MAX_PAUSES: usize = 3;

/// SIGSTOP the daemon, wait `how_long` (the freeze itself, not a synchronisation), SIGCONT.
fn pause(d: &Daemon, how_long: Duration) {
    let pid = d.child.as_ref().expect("running").id().to_string();
    assert!(std::process::Command::new("kill").args(["-STOP", &pid]).status().expect("kill").success());
    std::thread::sleep(how_long);
    assert!(std::process::Command::new("kill").args(["-CONT", &pid]).status().expect("kill").success());
}

#[test]
fn chaos_soak() {
    let tasks = env_or("TALLY_SOAK_TASKS", 300) as usize;
    soak(tasks, Duration::from_secs(env_or("TALLY_SOAK_SECS", 90)), false);
}

/// The same soak with the daemon's data on PostgreSQL (one node that restarts under its name:
/// it recovers its own earlier run at once through its node lock). The
/// two-node chaos run (`pg_nodes::chaos_two_nodes_on_one_postgres`) covers peers.
#[test]
fn chaos_soak_postgres() {
    let tasks = env_or("TALLY_SOAK_TASKS", 300) as usize;
    soak(tasks, Duration::from_secs(env_or("TALLY_SOAK_SECS", 60)), true);
}

/// One soak of at most `tasks` tasks and `budget` of submitting.
fn soak(tasks: usize, budget: Duration, postgres: bool) {
    let seed = env_or("TALLY_SOAK_SEED", uuid::Uuid::new_v4().as_u128() as u64 | 1);
    eprintln!("soak: seed={seed} (TALLY_SOAK_SEED to rerun)");
    let mut rng = Rng(seed);
    let mock = Mock::start(&["--job-duration-ms", "100", "--honor-idempotency-key"]);
    let engine = "dispatch_grace_secs = 1\nmax_attempts = 3\nbackoff_base_ms = 50\nbackoff_max_ms = 400\nrecovery_deadline_secs = 20\n";
    let mut d = Daemon::configure_with(engine, &providers(&mock));
    if postgres && d.on_postgres("soak-node").is_none() {
        return;
    }
    let on = if postgres { "postgres" } else { "sqlite" };
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-soak".into()));
    d.spawn();

    let kinds = ["openai", "replicate", "fal", "idem"];
    // prompt → (kind, idempotency key, task id once known)
    let mut accepted: HashMap<String, (String, String, Option<String>)> = HashMap::new();
    let mut unanswered: Vec<String> = Vec::new();
    let mut kills = 0;
    let mut pauses = 0;
    let started = Instant::now();
    let mut next_kill = Instant::now() + Duration::from_millis(500 + rng.below(1500));
    let mut submitted = 0;
    // Older copies taken mid-soak (SQLite): a hand copy of tally.db alone, and a `tally backup`.
    let copies = crate::common::TempDir::new();
    let (hand_copy, backup) = (copies.path().join("hand-copy.db"), copies.path().join("backup.db"));
    let mut copied = false;
    while submitted < tasks && started.elapsed() < budget {
        // Change the provider's mood now and then.
        if rng.below(10) == 0 {
            let mood = match rng.below(5) {
                0 => serde_json::json!({"latency_ms": rng.below(300), "drop_response": null, "fail_status": null}),
                1 => serde_json::json!({"drop_response": true, "drop_on": "create", "latency_ms": null}),
                2 => serde_json::json!({"drop_response": true, "drop_on": "poll"}),
                3 => serde_json::json!({"fail_status": 500, "drop_response": null}),
                _ => {
                    serde_json::json!({"latency_ms": null, "drop_response": null, "fail_status": null, "drop_on": null})
                }
            };
            mock.behave(mood);
        }
        let kind = kinds[rng.below(4) as usize].to_string();
        let prompt = format!("soak {submitted} {kind} {}", uuid::Uuid::new_v4());
        let key = uuid::Uuid::new_v4().to_string();
        submitted += 1;
        match submit(&d, &kind, &prompt, &key) {
            Some((201, id)) => {
                accepted.insert(prompt, (kind, key, Some(id)));
            }
            Some((code, _)) => panic!("submit answered {code}"),
            None => {
                // The answer was lost (maybe killed mid-request): retry with the same key later.
                accepted.insert(prompt.clone(), (kind, key, None));
                unanswered.push(prompt);
            }
        }
        if Instant::now() >= next_kill {
            if pauses == 0 || (pauses < MAX_PAUSES && rng.below(3) == 0) {
                // Freeze the daemon for longer than a lease (3 s), then let it go on: its
                // workers come back after their leases ran out, racing the reconciler.
                pause(&d, Duration::from_millis(3500 + rng.below(1500)));
                pauses += 1;
            } else {
                kill(&mut d);
                kills += 1;
                d.spawn();
            }
            next_kill = Instant::now() + Duration::from_millis(300 + rng.below(1000));
        }
        if !postgres && !copied && submitted >= tasks / 3 {
            // What SQLite's automatic checkpoint does, so the main file holds queued work; then
            // the two copies, while the daemon works on.
            crate::crash::oldcopy::checkpoint(&d.data.join("tally.db"));
            std::fs::copy(d.data.join("tally.db"), &hand_copy).expect("copy tally.db by hand");
            let b = d.cli(&["backup", backup.to_str().expect("utf-8")]);
            assert!(b.status.success(), "tally backup: {}", String::from_utf8_lossy(&b.stderr));
            copied = true;
        }
        std::thread::sleep(Duration::from_millis(rng.below(40)));
    }

    // Calm the provider, restart once more, and let everything settle.
    mock.behave(serde_json::json!({"latency_ms": null, "drop_response": null, "fail_status": null, "drop_on": null}));
    kill(&mut d);
    kills += 1;
    d.spawn();
    for prompt in &unanswered {
        let (kind, key, id) = accepted.get_mut(prompt).expect("tracked");
        if let Some((code, got)) = submit(&d, kind, prompt, key) {
            // 201: the first answer was lost before the commit (a new task now); 200: it was kept.
            assert!(code == 200 || code == 201, "resubmit answered {code}");
            *id = Some(got);
        }
    }
    let mut lost = 0;
    let (mut unknown, mut succeeded, mut failed) = (0, 0, 0);
    for (prompt, (_, _, id)) in &accepted {
        let Some(id) = id else {
            lost += 1;
            eprintln!("soak: no task for {prompt}");
            continue;
        };
        let path = format!("/v1/tasks/{id}");
        let settled = wait_for(Duration::from_secs(120), || {
            let t = d.call("GET", &path, None).json();
            let s = t["status"].as_str().unwrap_or("").to_string();
            ["succeeded", "failed", "unknown", "canceled"].contains(&s.as_str()).then_some(s)
        });
        match settled.as_deref() {
            Some("succeeded") => succeeded += 1,
            Some("failed") => failed += 1,
            Some("unknown") => unknown += 1,
            Some(_) => {}
            None => {
                lost += 1;
                eprintln!("soak: task {id} never settled");
            }
        }
    }
    let status = d.term();
    let mut older = Vec::new();
    if copied {
        let fresh = || {
            let mut c = Daemon::configure_with(engine, &providers(&mock));
            c.env.push(("TALLY_TEST_KEY".into(), "sk-test-soak".into()));
            c
        };
        older.push(crate::crash::oldcopy::serve_older_copy(fresh(), |c| {
            std::fs::copy(&hand_copy, c.data.join("tally.db")).expect("put the hand copy in place");
        }));
        older.push(crate::crash::oldcopy::serve_older_copy(fresh(), |c| {
            let r = c.cli(&["restore", backup.to_str().expect("utf-8")]);
            assert!(r.status.success(), "tally restore: {}", String::from_utf8_lossy(&r.stderr));
        }));
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut charged: HashMap<String, usize> = HashMap::new();
    let mut idem_replays = 0;
    for line in mock.lines() {
        let Some(prompt) = line["prompt"].as_str() else { continue };
        if line["charged"] == true {
            *charged.entry(prompt.to_string()).or_default() += 1;
        } else if line["idempotency_key"].is_string()
            && line["endpoint"].as_str().is_some_and(|e| e.starts_with("POST"))
        {
            idem_replays += 1;
        }
    }
    let duplicate_charges: usize = charged.values().map(|n| n.saturating_sub(1)).sum();
    let check = std::process::Command::new(crate::common::EXE)
        .args(["check", "--config"])
        .arg(&d.config)
        .output()
        .expect("check runs");
    println!(
        "soak {on}: tasks={} kills={kills} pauses={pauses} lost={lost} duplicate_charges={duplicate_charges} unknown={unknown} succeeded={succeeded} failed={failed}",
        accepted.len()
    );
    eprintln!("soak: create requests the mock did not charge (idempotent replays, refusals): {idem_replays}");
    eprintln!("soak: older copies served (jobs, held): hand copy and restored backup {older:?}");
    assert!(postgres || older.len() == 2, "the SQLite soak served both older copies");
    assert!(pauses > 0, "the soak never froze the daemon");
    assert!(kills > 1, "the soak never killed the daemon mid-flight");
    assert_eq!(lost, 0, "tasks were lost");
    assert_eq!(duplicate_charges, 0, "a prompt was charged twice");
    assert!(status.success(), "clean stop failed");
    assert!(check.status.success(), "tally check failed:\n{}", String::from_utf8_lossy(&check.stdout));
}
