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
//! Deliveries run through the same chaos (issue #26): the client makes a few sets on the demo
//! provider, chooses their images and delivers each set twice to a folder target of its own
//! (with the `original` profile, and rendered to a large PNG so that writes are in flight when
//! the daemon dies; a delivery just made is often met by the next kill or freeze at once),
//! resending what lost its answer. At the end every item of every delivery must
//! have ended `delivered` or say why; each folder must hold exactly the delivered files, each
//! with its item's sha256 (for `original`, the chosen image's bytes), and its `manifest.csv`
//! and `manifest.json` must list exactly those files.
//!
//! Prunes race them (issue #43): now and then, just after a delivery was made, the client
//! prunes everything settled (`POST /v1/prune`, see `prune`): a set whose delivery is not yet
//! ended must be kept (no item may end "no longer stored"), a set pruned after its deliveries
//! is still checked through its deliveries' ids, and a tracked task a prune took must have been
//! seen settled first. One shipment's images are made at the mock while it answers giant
//! images (12,000 px a side, tiny on disk): its rendered delivery must refuse them in words,
//! and the daemon must never end by itself (each kill first checks it was still running).
//!
//! Runs on SQLite (`chaos_soak`) and with the daemon's data on PostgreSQL
//! (`chaos_soak_postgres`). Bounded for CI; `TALLY_SOAK_TASKS=2000 TALLY_SOAK_SECS=600` runs a
//! long one.

mod prune;
mod shipment;

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use crate::common::{Daemon, Mock, providers_with_drafts, submit, wait_for};
use prune::{MAX_PRUNES, Watch};
use shipment::{DeliveryReport, SHIPMENTS, Shipment, delivery_config, giant_mood};

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

/// SIGKILL the daemon, which must still be running: one that ended by itself (an abort on a
/// giant image, say) fails the soak.
fn kill(d: &mut Daemon) {
    if let Some(mut c) = d.child.take() {
        if let Ok(Some(status)) = c.try_wait() {
            panic!("the daemon ended by itself ({status}):\n{}", d.stderr());
        }
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
    let out = crate::common::TempDir::new();
    let mut shipments: Vec<Shipment> = (0..SHIPMENTS).map(|i| Shipment::new(i, out.path())).collect();
    let mut d =
        Daemon::configure_with(engine, &format!("{}{}", providers_with_drafts(&mock), delivery_config(&shipments)));
    if postgres && d.on_postgres("soak-node").is_none() {
        return;
    }
    let on = if postgres { "postgres" } else { "sqlite" };
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-soak".into()));
    d.spawn();

    // Generations, and edits and cutouts (issue #35), on each kind of recovery.
    let kinds = [
        "openai",
        "replicate",
        "fal",
        "idem",
        "openai:edit",
        "kontext:edit",
        "idem:edit",
        "faledit:edit",
        "dsedit:edit",
        "gemini:edit",
        "bfledit:edit",
        "photoroom:cutout",
        // Drafting calls (issue #36): background and fetched by id, and two synchronous kinds.
        "oadraft:draft",
        "dsdraft:draft",
        "gmdraft:draft",
    ];
    // prompt → (kind, idempotency key, task id once known)
    let mut accepted: HashMap<String, (String, String, Option<String>)> = HashMap::new();
    let mut unanswered: Vec<String> = Vec::new();
    let mut kills = 0;
    let mut pauses = 0;
    // Kills and freezes that met a delivery queued or being delivered.
    let (mut kills_mid_delivery, mut pauses_mid_delivery) = (0, 0);
    // Kill at once (a delivery was just made).
    let mut kill_now = false;
    let started = Instant::now();
    let mut next_kill = Instant::now() + Duration::from_millis(500 + rng.below(1500));
    let mut submitted = 0;
    // Older copies taken mid-soak (SQLite): a hand copy of tally.db alone, and a `tally backup`.
    let copies = crate::common::TempDir::new();
    let (hand_copy, backup) = (copies.path().join("hand-copy.db"), copies.path().join("backup.db"));
    let mut copied = false;
    let mut watch = Watch::default();
    let mut giant_on = false;
    let mut prune_soon = false;
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
        let kind = kinds[rng.below(kinds.len() as u64) as usize].to_string();
        let prompt = format!("soak {submitted} {kind} {}", uuid::Uuid::new_v4());
        let key = uuid::Uuid::new_v4().to_string();
        submitted += 1;
        let sent = SystemTime::now();
        match submit(&d, &kind, &prompt, &key) {
            // 201 for a task, 202 for a draft (its drafting call queued).
            Some((201 | 202, id)) => {
                watch.accepted(&id, sent);
                accepted.insert(prompt, (kind, key, Some(id)));
            }
            Some((code, _)) => panic!("submit answered {code}"),
            None => {
                // The answer was lost (maybe killed mid-request): retry with the same key later.
                accepted.insert(prompt.clone(), (kind, key, None));
                unanswered.push(prompt);
            }
        }
        // Start the next shipment once its share of the tasks is submitted; move each on a step.
        let started_shipments = shipments.iter().filter(|s| s.key.is_some()).count();
        if started_shipments < SHIPMENTS && submitted * SHIPMENTS >= started_shipments * tasks {
            shipments[started_shipments].key = Some(uuid::Uuid::new_v4().to_string());
            giant_mood(&mock, &shipments, &mut giant_on);
        }
        if rng.below(3) == 0 {
            let mut made = false;
            for s in shipments.iter_mut().filter(|s| s.key.is_some()) {
                made |= s.step(&d);
            }
            giant_mood(&mock, &shipments, &mut giant_on);
            // A delivery was just made: SIGKILL the daemon while it delivers (until one kill
            // met a delivery, then every other time), or prune (once the submits that lost
            // their answers are resent).
            if made && (kills_mid_delivery == 0 || rng.below(2) == 0) {
                kill_now = true;
            } else if made {
                prune_soon = true;
            }
        }
        // Now and then, and after a delivery was made, prune as soon as the soak can (see
        // `prune`): until then, at each turn resend what lost its answer and try again.
        prune_soon |= rng.below(60) == 0;
        if prune_soon && watch.prunes < MAX_PRUNES {
            resend(&d, &mut accepted, &mut unanswered, &mut watch);
            prune_soon = !watch.prune(&d, unanswered.len(), &shipments);
        }
        if kill_now || Instant::now() >= next_kill {
            let mid = shipments.iter().any(|s| s.open(&d));
            if !kill_now && (pauses == 0 || (pauses < MAX_PAUSES && rng.below(3) == 0)) {
                // Freeze the daemon for longer than a lease (3 s), then let it go on: its
                // workers come back after their leases ran out, racing the reconciler.
                pause(&d, Duration::from_millis(3500 + rng.below(1500)));
                pauses += 1;
                pauses_mid_delivery += usize::from(mid);
            } else {
                kill(&mut d);
                kills += 1;
                kills_mid_delivery += usize::from(mid);
                d.spawn();
            }
            kill_now = false;
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
    resend(&d, &mut accepted, &mut unanswered, &mut watch);
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
            let r = d.call("GET", &path, None);
            if r.status == 404 {
                // Pruned: only what this client saw settled may have been (see `prune`).
                let seen = watch.settled.get(id).cloned();
                assert!(seen.is_some(), "task {id} was pruned before it was seen settled");
                return seen;
            }
            let s = r.json()["status"].as_str().unwrap_or("").to_string();
            prune::settled(&s).then_some(s)
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
    // Every shipment made and delivered (on the calm daemon now), every delivery ended.
    for i in 0..shipments.len() {
        shipments[i].key.get_or_insert_with(|| uuid::Uuid::new_v4().to_string());
        giant_mood(&mock, &shipments, &mut giant_on);
        let made = wait_for(Duration::from_secs(120), || {
            shipments[i].step(&d);
            giant_mood(&mock, &shipments, &mut giant_on);
            (shipments[i].deliveries == shipments[i].profiles.len()).then_some(())
        });
        assert!(made.is_some(), "shipment {} never got a delivery: {:?}", shipments[i].target, shipments[i]);
    }
    let mut delivery_report = DeliveryReport::default();
    for s in &shipments {
        s.check(&d, &mut delivery_report);
    }
    // Every delivery has ended: a last prune takes the demo sets (their deliveries are then
    // found by id), and the folders are checked again.
    assert!(watch.prune(&d, unanswered.len(), &shipments), "the last prune was not answered");
    for s in &shipments {
        s.check(&d, &mut DeliveryReport::default());
    }
    let giant = shipments.iter().find_map(|s| s.giant_requests(&d)).expect("the giant shipment");
    let status = d.term();
    let mut older = Vec::new();
    if copied {
        let fresh = || {
            let mut c = Daemon::configure_with(engine, &providers_with_drafts(&mock));
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
    // The giant shipment's prompts: charged at most once per candidate its shots have.
    let mut giant_charged = 0;
    for line in mock.lines() {
        let Some(prompt) = line["prompt"].as_str() else { continue };
        if line["charged"] == true && prompt.contains(&giant.0) {
            giant_charged += 1;
        } else if line["charged"] == true {
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
    let r = &delivery_report;
    println!(
        "soak {on}: tasks={} kills={kills} pauses={pauses} lost={lost} duplicate_charges={duplicate_charges} unknown={unknown} succeeded={succeeded} failed={failed} deliveries={} items={} delivered={} not_delivered={} attempted_again={} temp_files={} kills_mid_delivery={kills_mid_delivery} pauses_mid_delivery={pauses_mid_delivery}",
        accepted.len(),
        r.deliveries,
        r.items,
        r.delivered,
        r.not_delivered,
        r.attempted_again,
        r.temp_files
    );
    let w = &watch;
    println!(
        "soak {on}: prunes={} prunes_mid_delivery={} sets_pruned={} tasks_pruned={} giant_refused_for_size={} giant_charged={giant_charged} giant_candidates={}",
        w.prunes, w.prunes_mid_delivery, w.sets_pruned, w.tasks_pruned, r.refused_for_size, giant.1
    );
    eprintln!("soak: create requests the mock did not charge (idempotent replays, refusals): {idem_replays}");
    eprintln!("soak: older copies served (jobs, held): hand copy and restored backup {older:?}");
    assert!(postgres || older.len() == 2, "the SQLite soak served both older copies");
    assert!(pauses > 0, "the soak never froze the daemon");
    assert!(kills > 1, "the soak never killed the daemon mid-flight");
    assert_eq!(lost, 0, "tasks were lost");
    assert!(kills_mid_delivery > 0, "the soak never killed the daemon while a delivery was open");
    assert_eq!(duplicate_charges, 0, "a prompt was charged twice");
    assert!(
        giant_charged <= giant.1,
        "the giant shipment's prompts were charged {giant_charged} times for {} candidates",
        giant.1
    );
    assert!(r.refused_for_size > 0, "the giant shipment's rendered delivery did not refuse its images for their size");
    assert!(w.sets_pruned > 0, "no prune took a delivered set");
    assert!(status.success(), "clean stop failed");
    assert!(check.status.success(), "tally check failed:\n{}", String::from_utf8_lossy(&check.stdout));
}

/// Resend each submit whose answer was lost, with its idempotency key; those answered now are
/// watched from now on (their task may be older than the resend).
fn resend(
    d: &Daemon,
    accepted: &mut HashMap<String, (String, String, Option<String>)>,
    unanswered: &mut Vec<String>,
    watch: &mut Watch,
) {
    unanswered.retain(|prompt| {
        let (kind, key, id) = accepted.get_mut(prompt).expect("tracked");
        let Some((code, got)) = submit(d, kind, prompt, key) else { return true };
        // 201 (202 for a draft): the first answer was lost before the commit (a new task now);
        // 200: it was kept.
        assert!([200, 201, 202].contains(&code), "resubmit answered {code}");
        watch.answered_again(&got);
        *id = Some(got);
        false
    });
}
