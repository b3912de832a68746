//! Several `tally serve` processes on one real PostgreSQL (the issue "Past one machine"),
//! against one real mock provider, judged by the mock's ledger: provider capacity holds across
//! nodes, work submitted on one node is picked up by another, a node that dies is recovered by
//! its peer through its lock long before its leases could expire, and a chaos run (SIGKILL and
//! restart, `pg_terminate_backend` on a node's connections to force its self-fence, SIGSTOP
//! longer than a lease then SIGCONT) loses nothing and charges nothing twice.
//!
//! Each test gets its own database on the throw-away server (`scripts/with-postgres.sh`).

use std::collections::HashMap;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::{Daemon, Mock, OPENAI_MODEL, TempDir, free_port, submit, wait_for};
use crate::conformance::fixtures::pg_url;

/// A fresh database on the test server; its URL.
pub(crate) fn database(url: &str) -> String {
    crate::common::pg_database(url)
}

/// Run one query on the database (off the async threads: these tests are synchronous).
pub(crate) fn sql<T: Send + 'static>(url: &str, f: impl FnOnce(&mut postgres::Client) -> T + Send + 'static) -> T {
    let url = url.to_string();
    std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
        f(&mut c)
    })
    .join()
    .expect("sql thread")
}

/// A node: a daemon with `[storage] backend = "postgres"` and its own name and data dir.
pub(crate) fn node(db: &str, name: &str, engine: &str, providers: &str) -> Daemon {
    let dir = TempDir::new();
    let port = free_port();
    let data = dir.path().join("data");
    let config = dir.path().join("tally.toml");
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n\n[storage]\ndata_dir = \"{}\"\nbackend = \"postgres\"\npostgres_url = \"{db}\"\n\n\
         [node]\nname = \"{name}\"\n\n[engine]\nshutdown_deadline_secs = 1\n{engine}\n{providers}",
        data.display()
    );
    std::fs::write(&config, text).expect("write config");
    let mut d =
        Daemon { dir, port, data, config, child: None, env: vec![("TALLY_TEST_KEY".into(), "sk-test-nodes".into())] };
    d.spawn();
    d
}

pub(crate) fn openai(mock: &Mock, max_concurrency: usize) -> String {
    format!(
        "[[providers]]\nname = \"openai\"\nkind = \"openai_images\"\nbase_url = \"{}\"\nmodel = \"{OPENAI_MODEL}\"\n\
         api_key_env = \"TALLY_TEST_KEY\"\nmax_concurrency = {max_concurrency}\nrequest_timeout_ms = 5000\nconnect_timeout_ms = 1000\n",
        mock.base()
    )
}

fn replicate(mock: &Mock, max_concurrency: usize) -> String {
    format!(
        "[[providers]]\nname = \"replicate\"\nkind = \"replicate\"\nbase_url = \"{}\"\nmodel = \"black-forest-labs/flux-schnell\"\n\
         api_key_env = \"TALLY_TEST_KEY\"\nmax_concurrency = {max_concurrency}\npoll_interval_ms = 50\nrequest_timeout_ms = 5000\nconnect_timeout_ms = 1000\n",
        mock.base()
    )
}

pub(crate) fn status(d: &Daemon, id: &str) -> Option<String> {
    let r = crate::common::try_request(
        d.port,
        "GET",
        &format!("/v1/tasks/{id}"),
        &[("Authorization", format!("Bearer {}", d.token()).as_str())],
        None,
    )?;
    r.json()["status"].as_str().map(str::to_string)
}

pub(crate) fn settled(s: &str) -> bool {
    matches!(s, "succeeded" | "failed" | "canceled" | "unknown")
}

pub(crate) fn ts_ms(line: &serde_json::Value) -> i64 {
    let t = line["ts"].as_str().expect("ts");
    humantime::parse_rfc3339(t)
        .expect("rfc3339")
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after epoch")
        .as_millis() as i64
}

/// Two nodes with `max_concurrency = 2` each on one provider account never have more than two
/// requests at the provider at once: each request holds its slot for the mock's latency, so
/// among the creates in arrival order, every third one arrives at least that long after the
/// one two before it.
#[test]
fn two_nodes_never_run_more_calls_at_once_than_one_accounts_max_concurrency() {
    let Some(url) = pg_url() else { return };
    let db = database(&url);
    const LATENCY: i64 = 300;
    let mock = Mock::start(&["--latency-ms", &LATENCY.to_string()]);
    // Leases long enough that a loaded machine's late heartbeat never hands a call to the peer.
    let a = node(&db, "node-a", "workers = 4\nlease_secs = 15\nheartbeat_secs = 2", &openai(&mock, 2));
    let b = node(&db, "node-b", "workers = 4\nlease_secs = 15\nheartbeat_secs = 2", &openai(&mock, 2));
    let mut ids = Vec::new();
    for i in 0..12 {
        let d = if i % 2 == 0 { &a } else { &b };
        let (code, id) = submit(d, "openai", &format!("cap {i}"), &format!("cap-{i}")).expect("submitted");
        assert_eq!(code, 201);
        ids.push(id);
    }
    for id in &ids {
        let done = wait_for(Duration::from_secs(60), || status(&a, id).filter(|s| settled(s)));
        assert_eq!(done.as_deref(), Some("succeeded"), "{id}");
    }
    let mut creates: Vec<i64> = mock
        .lines()
        .iter()
        .filter(|l| l["charged"] == true && l["prompt"].as_str().is_some_and(|p| p.starts_with("cap ")))
        .map(ts_ms)
        .collect();
    creates.sort();
    assert_eq!(creates.len(), 12, "one charged create per task");
    for w in creates.windows(3) {
        assert!(w[2] - w[0] >= LATENCY - 40, "three requests at once at the provider: arrivals {w:?}");
    }
    // (Which node ran how many is up to who dispatches first; without the shared cap the
    // second node would start calls of its own while the first has two at the provider.)
}

/// A task submitted on a node with no free worker is picked up by the other node at once (a
/// NOTIFY, not a timer), and any node answers for any task and serves its image.
#[test]
fn a_task_submitted_on_a_busy_node_is_run_by_another_and_served_by_both() {
    let Some(url) = pg_url() else { return };
    let db = database(&url);
    let mock = Mock::start(&["--latency-ms", "2000"]);
    let a = node(&db, "node-a", "workers = 1\nlease_secs = 15\nheartbeat_secs = 2", &openai(&mock, 4));
    let b = node(&db, "node-b", "workers = 1\nlease_secs = 15\nheartbeat_secs = 2", &openai(&mock, 4));
    let (_, slow) = submit(&a, "openai", "slow one", "k-slow").expect("submitted");
    wait_for(Duration::from_secs(10), || status(&a, &slow).filter(|s| s == "running")).expect("the slow one runs");
    // Either node may have taken it (both were idle): the busy one is whichever runs it.
    let busy: String = {
        let s = slow.clone();
        sql(&db, move |c| c.query_one("SELECT node_id FROM executions WHERE task_id = $1", &[&s]).expect("row").get(0))
    };
    let (busy_node, other, other_name) = if busy == "node-a" { (&a, &b, "node-b") } else { (&b, &a, "node-a") };
    // The slow request must be at the provider (sleeping its 2 s) before the latency drops.
    wait_for(Duration::from_secs(10), || (mock.count("slow one").0 > 0).then_some(())).expect("slow request arrived");
    mock.behave(serde_json::json!({"latency_ms": 0}));
    let started = Instant::now();
    let (_, quick) = submit(busy_node, "openai", "quick one", "k-quick").expect("submitted");
    let done = wait_for(Duration::from_secs(10), || status(other, &quick).filter(|s| settled(s)));
    assert_eq!(done.as_deref(), Some("succeeded"));
    let took = started.elapsed();
    let ran_on: String = {
        let q = quick.clone();
        sql(&db, move |c| c.query_one("SELECT node_id FROM executions WHERE task_id = $1", &[&q]).expect("row").get(0))
    };
    assert_eq!(ran_on, other_name, "the node it was submitted on had no free worker");
    assert!(took < Duration::from_millis(1900), "picked up while a's only worker was still busy ({took:?})");
    let t = other.call("GET", &format!("/v1/tasks/{quick}"), None).json();
    let url = t["artifacts"][0]["url"].as_str().expect("artifact url").to_string();
    let path = &url[url.find("/v1/").expect("path")..];
    for d in [&a, &b] {
        let r = d.call("GET", path, None);
        assert_eq!(r.status, 200, "node on :{} serves the image", d.port);
        assert_eq!(crate::common::sha256_hex(&r.body), t["artifacts"][0]["sha256"].as_str().expect("sha"));
    }
}

/// A node killed mid-call is recovered by its peer through the node lock: with leases of 30 s,
/// the peer has settled the dead node's work within a few seconds, which only the lock can
/// explain. The provider here cannot prove anything, so the interrupted calls end `unknown`,
/// never resent.
#[test]
fn a_killed_node_is_recovered_by_its_peer_long_before_its_leases_expire() {
    let Some(url) = pg_url() else { return };
    let db = database(&url);
    let mock = Mock::start(&["--latency-ms", "20000"]);
    let engine = "workers = 2\nlease_secs = 30\nheartbeat_secs = 5";
    let mut a = node(&db, "node-a", engine, &openai(&mock, 2));
    let b = node(&db, "node-b", engine, &openai(&mock, 2));
    let mut ids = Vec::new();
    for i in 0..2 {
        ids.push(submit(&a, "openai", &format!("doomed {i}"), &format!("doomed-{i}")).expect("submitted").1);
    }
    for id in &ids {
        wait_for(Duration::from_secs(10), || status(&a, id).filter(|s| s == "running")).expect("running on a");
    }
    let calling_on_a: i64 = sql(&db, |c| {
        c.query_one("SELECT count(*) FROM executions WHERE node_id = 'node-a' AND phase = 'calling'", &[])
            .expect("q")
            .get(0)
    });
    if let Some(mut child) = a.child.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let killed = Instant::now();
    for id in &ids {
        let s = wait_for(Duration::from_secs(10), || status(&b, id).filter(|s| s != "running"));
        assert!(
            s.is_some(),
            "{id} still running on the dead node after {:?}; the peer's log:\n{}",
            killed.elapsed(),
            b.stderr()
        );
    }
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(25), "recovered by expiry, not by the lock ({took:?})");
    eprintln!("failover: the peer recovered {} in-flight task(s) {took:?} after SIGKILL", ids.len());
    if std::env::var("PG_DEBUG").is_ok() {
        eprintln!("{}", b.stderr());
    }
    for id in &ids {
        let s = wait_for(Duration::from_secs(10), || status(&b, id).filter(|s| settled(s))).expect("settled");
        if calling_on_a == 2 {
            assert_eq!(s, "unknown", "{id}: a call that may have left, on a provider that proves nothing");
        }
    }
    let (all, charged) = mock.count("doomed");
    assert!(charged <= 2 && all <= 2, "nothing was sent again: {all} requests, {charged} charged");
}

/// The chaos run: two nodes, a client submitting through both (a submit whose answer was lost
/// is sent again with the same key, to either node), and a driver that at random SIGKILLs and
/// restarts a node, terminates a node's database connections (it must fence itself and come
/// back), or SIGSTOPs a node for longer than a lease and SIGCONTs it. At the end every task the
/// client saw accepted is settled or `unknown`, no prompt was charged twice, every success was
/// charged once, and `tally check` on the shared database is clean.
#[test]
fn chaos_two_nodes_on_one_postgres() {
    let Some(url) = pg_url() else { return };
    let db = database(&url);
    let tasks: usize = std::env::var("TALLY_PG_CHAOS_TASKS").ok().and_then(|v| v.parse().ok()).unwrap_or(80);
    const MIN_CHAOS: usize = 6;
    let budget =
        Duration::from_secs(std::env::var("TALLY_PG_CHAOS_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(60));
    let mock = Mock::start(&["--latency-ms", "100", "--job-duration-ms", "400"]);
    let engine = "workers = 4\nlease_secs = 3\nheartbeat_secs = 1\ndispatch_grace_secs = 1\nmax_attempts = 3\nbackoff_base_ms = 50\nbackoff_max_ms = 400\nrecovery_deadline_secs = 20";
    let providers = format!("{}\n{}", replicate(&mock, 3), openai(&mock, 3));
    let mut nodes = [node(&db, "node-a", engine, &providers), node(&db, "node-b", engine, &providers)];
    let seed = uuid::Uuid::new_v4().as_u128() as u64 | 1;
    eprintln!("pg chaos: seed {seed}");
    let mut rng = seed;
    let mut rand = move |n: u64| {
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        rng.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    };
    let mut accepted: HashMap<String, (String, Option<String>)> = HashMap::new(); // prompt -> (key, id)
    let (mut kills, mut fences, mut stops) = (0, 0, 0);
    let started = Instant::now();
    let mut next_chaos = Instant::now() + Duration::from_millis(800);
    let mut i = 0;
    let mut round = 0u64;
    while started.elapsed() < budget
        && (i < tasks || accepted.values().any(|(_, id)| id.is_none()) || kills + fences + stops < MIN_CHAOS)
    {
        if i < tasks {
            let prompt = format!("chaos {i}");
            let kind = if i % 2 == 0 { "replicate" } else { "openai" };
            accepted.entry(prompt.clone()).or_insert((format!("chaos-key-{i}"), None));
            let d = &nodes[(rand(2)) as usize];
            if d.child.is_some() {
                let key = accepted[&prompt].0.clone();
                if let Some((code, id)) = submit(d, kind, &prompt, &key)
                    && (code == 200 || code == 201)
                {
                    accepted.get_mut(&prompt).expect("entry").1 = Some(id);
                }
            }
            i += 1;
        } else {
            // Resend the ones whose answer was lost, with the same key, to a live node.
            for (prompt, (key, id)) in accepted.iter_mut().filter(|(_, (_, id))| id.is_none()) {
                let n: usize = prompt.trim_start_matches("chaos ").parse().unwrap_or(0);
                let kind = if n.is_multiple_of(2) { "replicate" } else { "openai" };
                if let Some(d) = nodes.iter().find(|d| d.child.is_some())
                    && let Some((code, got)) = submit(d, kind, prompt, key)
                    && (code == 200 || code == 201)
                {
                    *id = Some(got);
                }
            }
        }
        if Instant::now() >= next_chaos {
            let k = rand(2) as usize;
            round += 1;
            match round % 3 {
                0 => {
                    if let Some(mut c) = nodes[k].child.take() {
                        let _ = c.kill();
                        let _ = c.wait();
                    }
                    kills += 1;
                    nodes[k].spawn();
                }
                1 => {
                    let app = format!("tally node-{}", if k == 0 { "a" } else { "b" });
                    let n: i64 = sql(&db, move |c| {
                        c.query_one(
                            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                             WHERE application_name = $1 AND datname = current_database() AND pid <> pg_backend_pid()) t",
                            &[&app],
                        )
                        .expect("terminate")
                        .get(0)
                    });
                    if n > 0 {
                        fences += 1;
                    }
                }
                _ => {
                    if let Some(c) = nodes[k].child.as_ref() {
                        let pid = c.id().to_string();
                        let _ = std::process::Command::new("kill").args(["-STOP", &pid]).status();
                        std::thread::sleep(Duration::from_millis(3_500)); // longer than the 3 s lease
                        let _ = std::process::Command::new("kill").args(["-CONT", &pid]).status();
                        stops += 1;
                    }
                }
            }
            next_chaos = Instant::now() + Duration::from_millis(1_000 + rand(2_000));
        }
        std::thread::sleep(Duration::from_millis(80));
    }
    // Calm: both nodes up, wait for every task to settle.
    for d in nodes.iter_mut() {
        if d.child.is_none() {
            d.spawn();
        }
    }
    let ids: Vec<(String, String)> =
        accepted.iter().filter_map(|(p, (_, id))| id.clone().map(|id| (p.clone(), id))).collect();
    let lost: Vec<&String> = accepted.iter().filter(|(_, (_, id))| id.is_none()).map(|(p, _)| p).collect();
    assert!(lost.is_empty(), "submits never answered by any node: {lost:?}");
    let mut outcome: HashMap<String, String> = HashMap::new();
    for (prompt, id) in &ids {
        let s = wait_for(Duration::from_secs(60), || nodes.iter().find_map(|d| status(d, id)).filter(|s| settled(s)));
        let s = s.unwrap_or_else(|| panic!("{prompt} ({id}) never settled"));
        outcome.insert(prompt.clone(), s);
    }
    let lines = mock.lines();
    let mut charged: HashMap<&str, usize> = HashMap::new();
    for l in &lines {
        if l["charged"] == true
            && let Some(p) = l["prompt"].as_str()
        {
            *charged.entry(p).or_default() += 1;
        }
    }
    let twice: Vec<_> = charged.iter().filter(|(p, n)| p.starts_with("chaos ") && **n > 1).collect();
    assert!(twice.is_empty(), "charged more than once: {twice:?}");
    for (prompt, s) in &outcome {
        if s == "succeeded" {
            assert_eq!(
                charged.get(prompt.as_str()).copied().unwrap_or(0),
                1,
                "{prompt} succeeded without a charged create"
            );
        }
    }
    for d in nodes.iter_mut() {
        d.term();
    }
    let check = nodes[0].cli(&["check"]);
    assert!(
        check.status.success(),
        "tally check: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for s in outcome.values() {
        *counts.entry(s.as_str()).or_default() += 1;
    }
    eprintln!(
        "pg chaos: {} tasks ({counts:?}), {kills} SIGKILLs, {fences} connection terminations (self-fences), {stops} SIGSTOPs, lost 0, charged twice 0",
        outcome.len()
    );
    assert!(kills > 0 && fences > 0 && stops > 0, "the run exercised every kind of chaos");
    let _ = TcpStream::connect(("127.0.0.1", nodes[0].port));
}

/// Two nodes with one daily budget on one account: together they send exactly as many paid
/// requests as the budget allows (the mock's ledger counts them), hold the rest back as
/// `waiting` with the budget's words and no attempt counted, and either node's
/// `GET /v1/spend` reports what both sent. (Each node checks the budget in the transaction
/// that records `calling`, under the cluster-wide budget lock; without it the two could each
/// see the same last room.)
#[test]
fn two_nodes_together_never_overshoot_a_budget_and_both_report_the_spend() {
    let Some(url) = pg_url() else { return };
    let db = database(&url);
    let mock = Mock::start(&["--latency-ms", "50"]);
    // $0.04 an image, $0.17 a day: four requests fit, the fifth would not.
    let priced = format!("{}price_per_image = 0.04\n", openai(&mock, 8));
    let engine = "workers = 8\nlease_secs = 15\nheartbeat_secs = 2\n\n[budget]\ndaily = 0.17\n";
    let a = node(&db, "node-a", engine, &priced);
    let b = node(&db, "node-b", engine, &priced);
    let mut ids = Vec::new();
    for i in 0..10 {
        let d = if i % 2 == 0 { &a } else { &b };
        let (code, id) = submit(d, "openai", &format!("budget {i}"), &format!("budget-{i}")).expect("submitted");
        assert_eq!(code, 201);
        ids.push(id);
    }
    let task = |d: &Daemon, id: &str| d.call("GET", &format!("/v1/tasks/{id}"), None).json();
    let quiet = wait_for(Duration::from_secs(60), || {
        let all: Vec<serde_json::Value> = ids.iter().map(|id| task(&a, id)).collect();
        let done = all.iter().filter(|t| t["status"] == "succeeded").count();
        let held = all
            .iter()
            .filter(|t| t["status"] == "waiting" && t["reason"].as_str().is_some_and(|r| r.contains("budget")))
            .count();
        (done + held == ids.len()).then_some((done, held, all))
    });
    let (done, held, all) = quiet.expect("every task succeeded or is held by the budget");
    assert_eq!((done, held), (4, 6), "four fit in the budget");
    for t in all.iter().filter(|t| t["status"] == "waiting") {
        assert_eq!(t["attempts"], 0, "a held task counted no attempt: {t}");
        assert_eq!(t["charge"]["state"], "none", "nothing was sent for it: {t}");
    }
    let charged = mock.lines().iter().filter(|l| l["charged"] == true).count();
    assert_eq!(charged, 4, "the ledger: exactly what the budget allows reached the provider");
    for d in [&a, &b] {
        let spend = d.call("GET", "/v1/spend?group=provider", None);
        assert_eq!(spend.status, 200, "{}", String::from_utf8_lossy(&spend.body));
        let totals = &spend.json()["totals"];
        assert_eq!(totals["charged"]["count"], 4, "{totals}");
        assert!((totals["charged"]["amount"].as_f64().unwrap_or(0.0) - 0.16).abs() < 1e-9, "{totals}");
        let budgets = spend.json()["budgets"].clone();
        assert!(budgets.to_string().contains("0.16"), "the budget's use counts both nodes: {budgets}");
    }
}

/// `tally prune` on PostgreSQL: through node A's daemon (its data dir is locked, so it goes
/// through `POST /v1/prune`), what it deleted is gone on node B too (tasks and images: B
/// answers 404), and with A stopped the CLI prunes the shared database as node A while B
/// runs; `tally check` is clean after. (A provider that never bills: what retention keeps
/// for this month's spend is the conformance suite's `prune` group.)
#[test]
fn tally_prune_works_on_postgres_through_a_node_and_as_a_node_while_another_runs() {
    let Some(url) = pg_url() else { return };
    let db = database(&url);
    let engine = "workers = 2\nlease_secs = 15\nheartbeat_secs = 2\n";
    let mut a = node(&db, "node-a", engine, crate::common::FAST_DEMO);
    let b = node(&db, "node-b", engine, crate::common::FAST_DEMO);
    let mut ids = Vec::new();
    for (i, d) in [&a, &b, &a].into_iter().enumerate() {
        let (code, id) = submit(d, "demo", &format!("to prune {i}"), &format!("prune-{i}")).expect("submitted");
        assert_eq!(code, 201);
        ids.push(id);
    }
    let tasks: Vec<serde_json::Value> = ids.iter().map(|id| b.wait_status(id, &["succeeded"])).collect();
    let image = tasks[1]["artifacts"][0]["url"].as_str().expect("artifact url").to_string();
    assert_eq!(b.call("GET", &image, None).status, 200);
    let out = a.cli(&["prune", "--older-than", "0s", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        (r["tasks"].as_u64(), r["images"].as_u64(), r["freed_bytes"].as_i64()),
        (Some(3), Some(3), Some(0)),
        "{r}"
    );
    for id in &ids {
        assert_eq!(b.call("GET", &format!("/v1/tasks/{id}"), None).status, 404, "{id} is still there on node B");
    }
    assert_eq!(b.call("GET", &image, None).status, 404, "the image went with its task");

    // Node A stopped: the CLI connects as node A, while node B runs.
    let (code, late) = submit(&b, "demo", "pruned by the CLI", "prune-late").expect("submitted");
    assert_eq!(code, 201);
    b.wait_status(&late, &["succeeded"]);
    assert!(a.term().success());
    let dry = a.cli(&["prune", "--older-than", "0s", "--dry-run", "--json"]);
    assert!(dry.status.success(), "{}", String::from_utf8_lossy(&dry.stderr));
    let r: serde_json::Value = serde_json::from_slice(&dry.stdout).expect("JSON");
    assert_eq!((r["dry_run"].as_bool(), r["tasks"].as_u64()), (Some(true), Some(1)), "{r}");
    assert_eq!(b.call("GET", &format!("/v1/tasks/{late}"), None).status, 200, "a dry run deleted it");
    let out = a.cli(&["prune", "--older-than", "0s"]);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success() && said.contains("deleted 1 job(s)"),
        "{said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(b.call("GET", &format!("/v1/tasks/{late}"), None).status, 404);
    let check = b.cli(&["check"]);
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stdout));
}
