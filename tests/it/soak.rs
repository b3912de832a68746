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
//! Runs on SQLite (`chaos_soak`) and with the daemon's data on PostgreSQL
//! (`chaos_soak_postgres`). Bounded for CI; `TALLY_SOAK_TASKS=2000 TALLY_SOAK_SECS=600` runs a
//! long one.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{Daemon, FAST_DEMO, Mock, providers_with_drafts, sha256_hex, submit, try_request, wait_for};

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
        match submit(&d, &kind, &prompt, &key) {
            // 201 for a task, 202 for a draft (its drafting call queued).
            Some((201 | 202, id)) => {
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
        }
        if rng.below(3) == 0 {
            for s in shipments.iter_mut().filter(|s| s.key.is_some()) {
                // A delivery was just made: SIGKILL the daemon while it delivers (always until
                // one kill met a delivery, then every other time).
                if s.step(&d) && (kills_mid_delivery == 0 || rng.below(2) == 0) {
                    kill_now = true;
                }
            }
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
    for prompt in &unanswered {
        let (kind, key, id) = accepted.get_mut(prompt).expect("tracked");
        if let Some((code, got)) = submit(&d, kind, prompt, key) {
            // 201 (202 for a draft): the first answer was lost before the commit (a new task
            // now); 200: it was kept.
            assert!([200, 201, 202].contains(&code), "resubmit answered {code}");
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
    // Every shipment made and delivered (on the calm daemon now), every delivery ended.
    for s in shipments.iter_mut() {
        s.key.get_or_insert_with(|| uuid::Uuid::new_v4().to_string());
        let made = wait_for(Duration::from_secs(120), || {
            s.step(&d);
            (s.deliveries == s.profiles.len()).then_some(())
        });
        assert!(made.is_some(), "shipment {} never got a delivery: {s:?}", s.target);
    }
    let mut delivery_report = DeliveryReport::default();
    for s in &shipments {
        s.check(&d, &mut delivery_report);
    }
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
    eprintln!("soak: create requests the mock did not charge (idempotent replays, refusals): {idem_replays}");
    eprintln!("soak: older copies served (jobs, held): hand copy and restored backup {older:?}");
    assert!(postgres || older.len() == 2, "the SQLite soak served both older copies");
    assert!(pauses > 0, "the soak never froze the daemon");
    assert!(kills > 1, "the soak never killed the daemon mid-flight");
    assert_eq!(lost, 0, "tasks were lost");
    assert!(kills_mid_delivery > 0, "the soak never killed the daemon while a delivery was open");
    assert_eq!(duplicate_charges, 0, "a prompt was charged twice");
    assert!(status.success(), "clean stop failed");
    assert!(check.status.success(), "tally check failed:\n{}", String::from_utf8_lossy(&check.stdout));
}

/// How many sets the soak delivers, each to a folder target of its own (`ship0`, …).
const SHIPMENTS: usize = 6;

/// The demo provider, the `soak` profile (a 1000×1000 PNG: rendering takes a while, so a kill
/// can land during a delivery) and one folder target per shipment.
fn delivery_config(shipments: &[Shipment]) -> String {
    let mut c = format!(
        "{FAST_DEMO}\n[[delivery.profiles]]\nname = \"soak\"\nwidth = 1000\nheight = 1000\nfit = \"pad\"\n\
         background = \"#ffffff\"\nformat = \"png\"\nfile_name = \"{{product}}_{{role}}_{{profile}}.{{ext}}\"\n\n"
    );
    for s in shipments {
        c.push_str(&format!(
            "[[delivery.targets]]\nname = \"{}\"\nkind = \"folder\"\npath = \"{}\"\n\n",
            s.target,
            s.folder.display()
        ));
    }
    c
}

/// A request that may find the daemon dead (`None`), with its JSON answer when it has one.
fn try_call(d: &Daemon, method: &str, path: &str, body: Option<&Value>) -> Option<(u16, Value)> {
    let auth = format!("Bearer {}", d.token());
    let body = body.map(Value::to_string);
    let mut headers = vec![("Authorization", auth.as_str())];
    if body.is_some() {
        headers.push(("Content-Type", "application/json"));
    }
    let r = try_request(d.port, method, path, &headers, body.as_deref().map(str::as_bytes))?;
    Some((r.status, serde_json::from_slice(&r.body).unwrap_or(Value::Null)))
}

/// One set on its way to its folder: made (with an idempotency key, so a lost answer is
/// resent safely), each shot's image chosen, delivered. Each step may meet a dead daemon; it
/// is tried again later.
#[derive(Debug)]
struct Shipment {
    /// The target's name, and the shipment's number in it.
    target: String,
    folder: PathBuf,
    /// The profiles it is delivered with, one delivery each, in order.
    profiles: [&'static str; 2],
    /// Set once the shipment is started.
    key: Option<String>,
    set: Option<String>,
    chosen: bool,
    /// Deliveries this client saw made (a lost answer may have made one more: all of a set's
    /// deliveries are checked at the end).
    deliveries: usize,
}

impl Shipment {
    fn new(i: usize, root: &Path) -> Shipment {
        Shipment {
            target: format!("ship{i}"),
            folder: root.join(format!("ship{i}")),
            // The first delivery made renders (slow: the forced kill meets it open).
            profiles: if i.is_multiple_of(2) { ["soak", "original"] } else { ["original", "soak"] },
            key: None,
            set: None,
            chosen: false,
            deliveries: 0,
        }
    }

    /// The next step, if the daemon answers; whether it made a delivery.
    fn step(&mut self, d: &Daemon) -> bool {
        let Some(key) = self.key.clone() else { return false };
        let Some(set) = self.set.clone() else {
            let body = json!({"product": format!("soak {}", self.target), "provider": "demo", "idempotency_key": key,
                "shots": [{"role": "main", "prompt": format!("{key} on white")},
                          {"role": "scene", "prompt": format!("{key} on a shelf")}]});
            if let Some((200 | 201, v)) = try_call(d, "POST", "/v1/sets", Some(&body)) {
                self.set = v["id"].as_str().map(str::to_string);
            }
            return false;
        };
        if !self.chosen {
            let Some((200, v)) = try_call(d, "GET", &format!("/v1/sets/{set}"), None) else { return false };
            let Some(shots) = v["shots"].as_array() else { return false };
            let mut all = true;
            for (i, shot) in shots.iter().enumerate() {
                let cands = shot["candidates"].as_array().cloned().unwrap_or_default();
                let ok = cands.iter().find(|c| c["status"] == "succeeded" && c["artifact"]["id"].is_string());
                let open = cands.iter().any(|c| {
                    !["succeeded", "failed", "unknown", "canceled"].contains(&c["status"].as_str().unwrap_or(""))
                });
                match ok {
                    Some(c) => {
                        let body = json!({"artifact_id": c["artifact"]["id"]});
                        let r = try_call(d, "PUT", &format!("/v1/sets/{set}/shots/{i}/choice"), Some(&body));
                        all &= matches!(r, Some((200, _)));
                    }
                    None => {
                        all = false;
                        if !open {
                            // Every candidate ended without an image (a crash mid-call can end
                            // one `unknown`): another one, free on the demo provider.
                            let body = json!({"count": 1});
                            let _ = try_call(d, "POST", &format!("/v1/sets/{set}/shots/{i}/candidates"), Some(&body));
                        }
                    }
                }
            }
            self.chosen = all;
            return false;
        }
        let Some(profile) = self.profiles.get(self.deliveries) else { return false };
        let body = json!({"profile": profile, "target": self.target, "force": true});
        match try_call(d, "POST", &format!("/v1/sets/{set}/deliveries"), Some(&body)) {
            Some((201, _)) => {
                self.deliveries += 1;
                true
            }
            Some((409, v)) => panic!("{}: the delivery was refused: {v}", self.target),
            _ => false,
        }
    }

    /// Whether a delivery of the set is queued or being delivered (false if the daemon does
    /// not answer).
    fn open(&self, d: &Daemon) -> bool {
        let Some(set) = &self.set else { return false };
        let Some((200, v)) = try_call(d, "GET", &format!("/v1/sets/{set}/deliveries"), None) else { return false };
        v["deliveries"]
            .as_array()
            .is_some_and(|ds| ds.iter().any(|x| ["queued", "delivering"].contains(&x["state"].as_str().unwrap_or(""))))
    }

    /// Wait until every delivery of the set ended, then check its items and its folder (see
    /// the module docs), adding to `r`.
    fn check(&self, d: &Daemon, r: &mut DeliveryReport) {
        let set = self.set.as_deref().expect("made");
        let path = format!("/v1/sets/{set}/deliveries");
        let mut last = Value::Null;
        let all = wait_for(Duration::from_secs(120), || {
            last = d.call("GET", &path, None).json();
            let ds = last["deliveries"].as_array()?.clone();
            ds.iter()
                .all(|x| !["queued", "delivering"].contains(&x["state"].as_str().unwrap_or("queued")))
                .then_some(ds)
        })
        .unwrap_or_else(|| panic!("{}: deliveries never ended: {last}", self.target));
        assert!(!all.is_empty(), "{}: no delivery", self.target);
        r.deliveries += all.len();
        // name → sha256 of every delivered item; each not delivered says why.
        let mut delivered: BTreeMap<String, String> = BTreeMap::new();
        for x in &all {
            for item in x["items"].as_array().expect("items") {
                r.items += 1;
                r.attempted_again += usize::from(item["attempts"].as_i64().unwrap_or(0) > 1);
                let name = item["file_name"].as_str().expect("name").to_string();
                if item["state"] == "delivered" {
                    r.delivered += 1;
                    let sha = item["sha256"].as_str().expect("a delivered item's sha256").to_string();
                    let before = delivered.insert(name.clone(), sha.clone());
                    assert!(before.is_none_or(|b| b == sha), "{}: {name} delivered with two contents", self.target);
                    if x["profile"] == "original" {
                        let art = item["artifact_id"].as_str().expect("artifact");
                        let a = d.call("GET", &format!("/v1/artifacts/{art}"), None);
                        assert_eq!(sha256_hex(&a.body), sha, "{}: {name} is not the chosen image", self.target);
                    }
                } else {
                    r.not_delivered += 1;
                    let why = item["why"].as_str().unwrap_or("");
                    assert!(!why.is_empty(), "{}: item {name} ended {} without saying why", self.target, item["state"]);
                    eprintln!("soak: {} {name} not delivered: {why}", self.target);
                }
            }
        }
        let mut files = BTreeMap::new();
        for e in std::fs::read_dir(&self.folder).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                // A write killed before its rename leaves its temporary name (never reused).
                r.temp_files += 1;
            } else {
                files.insert(name, std::fs::read(e.path()).expect("read a delivered file"));
            }
        }
        let mut want: BTreeSet<String> = delivered.keys().cloned().collect();
        if !delivered.is_empty() {
            want.extend(["manifest.csv".to_string(), "manifest.json".to_string()]);
        }
        // Each delivery that delivered anything keeps its own manifest beside the latest one.
        for x in &all {
            if x["items"].as_array().is_some_and(|i| i.iter().any(|i| i["state"] == "delivered")) {
                let id = x["id"].as_str().expect("a delivery's id");
                want.extend([format!("manifest-{id}.csv"), format!("manifest-{id}.json")]);
            }
        }
        assert_eq!(files.keys().cloned().collect::<BTreeSet<_>>(), want, "{}: the folder holds", self.target);
        for (name, sha) in &delivered {
            assert_eq!(&sha256_hex(&files[name]), sha, "{}: {name} is not what was delivered", self.target);
        }
        // The manifest is the last settled delivery's that delivered anything.
        if let Some(newest) = all
            .iter()
            .filter(|x| x["items"].as_array().is_some_and(|i| i.iter().any(|i| i["state"] == "delivered")))
            .max_by_key(|x| x["updated_at"].as_i64())
        {
            let items = newest["items"].as_array().expect("items").clone();
            crate::delivery_crash::check_manifests(&self.target, &files, &items);
        }
    }
}

/// What the soak's deliveries came to.
#[derive(Debug, Default)]
struct DeliveryReport {
    deliveries: usize,
    items: usize,
    delivered: usize,
    not_delivered: usize,
    /// Items whose write was recorded more than once (a kill between `writing` and the put).
    attempted_again: usize,
    temp_files: usize,
}
