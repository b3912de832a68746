//! Older copies of the database in the crash matrix (issue 24, finding 1): a copy of
//! `tally.db` taken while the real daemon runs (without its `-wal`) and served in a new data
//! directory; a `tally backup` taken while work is queued and in flight, restored after the
//! original finished that work; a `tally.db-wal` deleted after a kill -9; and the control, a
//! kill -9 with the WAL kept. Each counts the charges in the mock's ledger: no job is charged
//! twice by anything automatic, every job held is explained, and releasing one sends it (one
//! more charge, as the owner asked).
//!
//! Where the provider can show the requests it got (Replicate), the copy looks its held jobs
//! up there instead of asking (`engine::lookup`): one found is fetched, never sent again.
//!
//! The mock answers slowly (`--latency-ms`), so while the copy is taken some jobs are queued
//! and some in flight. SQLite copies what its WAL holds into the main file every ~4 MB
//! (automatic checkpoint); the tests run that checkpoint by hand from a connection of their own,
//! so that the main file — what a hand copy takes — holds the queued jobs.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{Daemon, Mock, OPENAI_MODEL, sha256_hex, submit, wait_for};

/// One OpenAI-style provider (no idempotency key, no lookup: a call that may have left can
/// only become `unknown`) with two slots, against `mock`.
fn provider(mock: &Mock) -> String {
    format!(
        "[[providers]]\nname = \"openai\"\nkind = \"openai_images\"\nbase_url = \"{}\"\nmodel = \"{OPENAI_MODEL}\"\n\
         api_key_env = \"TALLY_TEST_KEY\"\nmax_concurrency = 2\nrequest_timeout_ms = 20000\nconnect_timeout_ms = 1000\n",
        mock.base()
    )
}

fn daemon(mock: &Mock) -> Daemon {
    let mut d = Daemon::configure(&provider(mock));
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-oldcopy".into()));
    d
}

/// One Replicate provider (a FLUX model that takes a seed: held jobs can be looked up) with
/// two slots, against `mock`.
fn replicate_daemon(mock: &Mock) -> Daemon {
    let mut d = Daemon::configure(&format!(
        "[[providers]]\nname = \"replicate\"\nkind = \"replicate\"\nbase_url = \"{}\"\n\
         model = \"black-forest-labs/flux-schnell\"\napi_key_env = \"TALLY_TEST_KEY\"\nmax_concurrency = 2\n\
         poll_interval_ms = 50\nrequest_timeout_ms = 20000\nconnect_timeout_ms = 1000\n",
        mock.base()
    ));
    d.env.push(("TALLY_TEST_KEY".into(), "r8-test-oldcopy".into()));
    d
}

/// Submit `n` jobs tagged `tag` to provider `openai`; their ids and prompts.
fn submit_jobs(d: &Daemon, tag: &str, n: usize) -> Vec<(String, String)> {
    submit_jobs_to(d, "openai", tag, n)
}

/// Submit `n` jobs tagged `tag` to `provider`; their ids and prompts.
fn submit_jobs_to(d: &Daemon, provider: &str, tag: &str, n: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|i| {
            let prompt = format!("oldcopy {tag} job {i}");
            let (code, id) = submit(d, provider, &prompt, &format!("{tag}-{i}")).expect("submit answered");
            assert_eq!(code, 201, "submit {i}");
            (id, prompt)
        })
        .collect()
}

/// Copy everything the WAL holds into the main database file, as SQLite's automatic
/// checkpoint does, from a connection of the test's own.
pub(crate) fn checkpoint(db: &Path) {
    let c = rusqlite::Connection::open(db).expect("open the live database");
    c.busy_timeout(Duration::from_secs(5)).expect("busy timeout");
    let done = wait_for(Duration::from_secs(20), || {
        let (busy, log, moved): (i64, i64, i64) = c
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .expect("checkpoint");
        (busy == 0 && log == moved).then_some(())
    });
    assert!(done.is_some(), "the checkpoint never caught up with the WAL");
}

/// Charged ledger lines per prompt.
fn charges(mock: &Mock, jobs: &[(String, String)]) -> Vec<usize> {
    jobs.iter().map(|(_, p)| mock.count(p).1).collect()
}

/// Wait until at least `n` of `jobs` were charged.
fn wait_charged(mock: &Mock, jobs: &[(String, String)], n: usize) {
    let ok = wait_for(Duration::from_secs(60), || (charges(mock, jobs).iter().sum::<usize>() >= n).then_some(()));
    assert!(ok.is_some(), "fewer than {n} jobs were charged: {:?}", charges(mock, jobs));
}

/// Every job of `d`, once each is settled or held (nothing else moving): id → task JSON.
fn settled_or_held(d: &Daemon, jobs: &[(String, String)]) -> Vec<Value> {
    let mut last = Vec::new();
    let done = wait_for(Duration::from_secs(60), || {
        last = jobs.iter().map(|(id, _)| d.call("GET", &format!("/v1/tasks/{id}"), None).json()).collect();
        last.iter()
            .all(|t| {
                !t["held"].is_null()
                    || ["succeeded", "failed", "unknown", "canceled"].contains(&t["status"].as_str().unwrap_or(""))
            })
            .then_some(())
    });
    assert!(done.is_some(), "jobs still moving: {last:?}\nstderr:\n{}", d.stderr());
    last
}

/// The held ones among `tasks`, each checked to be explained: a reason naming `why`, on the
/// owner's list, with what sending it again may cost.
fn held_explained(tasks: &[Value], why: &str) -> Vec<String> {
    let mut held = Vec::new();
    for t in tasks.iter().filter(|t| !t["held"].is_null()) {
        assert_eq!(t["status"], "waiting", "a held job waits: {t}");
        let reason = t["held"]["reason"].as_str().unwrap_or("");
        assert!(reason.contains(why) && reason.contains("Send it again?"), "unexplained hold: {t}");
        assert_eq!(t["waiting_for"].as_str(), Some(reason), "{t}");
        assert_eq!(t["needs_attention"], true, "{t}");
        assert!(t["held"]["note"].as_str().unwrap_or("").contains("charge"), "the possible cost is stated: {t}");
        held.push(t["id"].as_str().unwrap_or("").to_string());
    }
    held
}

/// Serve an older copy of a soak's database — `prepare` puts it into the new daemon's data
/// directory — against the same mock, wait until each of its jobs is settled or held, and
/// check every held one is explained. Returns (jobs, held). Used by the chaos soak.
pub(crate) fn serve_older_copy(mut c: Daemon, prepare: impl FnOnce(&Daemon)) -> (usize, usize) {
    std::fs::create_dir_all(&c.data).expect("data dir");
    prepare(&c);
    c.spawn();
    let mut tasks: Vec<Value> = Vec::new();
    let done = wait_for(Duration::from_secs(120), || {
        tasks.clear();
        let mut before = String::new();
        loop {
            let page = c.call("GET", &format!("/v1/tasks?limit=500{before}"), None).json();
            tasks.extend(page["tasks"].as_array().cloned().unwrap_or_default());
            match page["next"].as_str() {
                Some(n) => before = format!("&before={n}"),
                None => break,
            }
        }
        tasks
            .iter()
            .all(|t| {
                !t["held"].is_null()
                    || ["succeeded", "failed", "unknown", "canceled"].contains(&t["status"].as_str().unwrap_or(""))
            })
            .then_some(())
    });
    assert!(done.is_some(), "the copy's jobs kept moving; stderr:\n{}", c.stderr());
    let held = tasks.iter().filter(|t| !t["held"].is_null()).count();
    for t in tasks.iter().filter(|t| !t["held"].is_null()) {
        assert!(t["held"]["reason"].as_str().is_some_and(|r| r.contains("Send it again?")), "unexplained hold: {t}");
        assert_eq!(t["needs_attention"], true, "{t}");
    }
    assert!(c.term().success(), "the copy's daemon did not stop cleanly");
    (tasks.len(), held)
}

fn held_ids(d: &Daemon) -> Vec<String> {
    let list = d.call("GET", "/v1/held", None).json();
    let mut ids: Vec<String> = list["tasks"]
        .as_array()
        .expect("held tasks")
        .iter()
        .map(|t| t["id"].as_str().unwrap_or("").to_string())
        .collect();
    ids.sort();
    assert_eq!(list["total"].as_u64(), Some(ids.len() as u64), "{list}");
    ids
}

fn out(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Release one held job (the owner's "send it again"): it is sent, and charged, once more.
fn release_one_is_charged_once_more(d: &Daemon, mock: &Mock, jobs: &[(String, String)], held: &[String]) {
    let id = &held[0];
    let prompt = &jobs.iter().find(|(j, _)| j == id).expect("a job of the test").1;
    let before = mock.count(prompt).1;
    let o = d.cli(&["held", "release", id]);
    assert!(o.status.success(), "tally held release: {}", out(&o));
    assert!(out(&o).contains(&format!("released {id}")), "{}", out(&o));
    let t = d.wait_status(id, &["succeeded", "failed", "unknown"]);
    assert_eq!(t["status"], "succeeded", "{t}");
    assert_eq!(mock.count(prompt).1, before + 1, "the release sent it once");
    let o = d.cli(&["held", "list"]);
    assert!(o.status.success(), "tally held list: {}", out(&o));
    for other in &held[1..] {
        assert!(out(&o).contains(other.as_str()), "{other} is still listed: {}", out(&o));
    }
    assert!(!out(&o).contains(&format!("{id}  ")), "the released job is not listed any more: {}", out(&o));
}

/// "Copy the file while running, serve the copy": `cp tally.db` (no `-wal`) while the daemon
/// works, the original finishes and pays for every job, then the copy is served in a new data
/// directory against the same provider. Nothing is charged twice; what was queued in the copy
/// is held and explained; what was in flight goes through recovery (`unknown` here).
#[test]
fn a_copy_taken_while_running_served_elsewhere_pays_nothing_twice() {
    let mock = Mock::start(&["--latency-ms", "300"]);
    let mut a = daemon(&mock);
    a.spawn();
    let tag = uuid::Uuid::new_v4().to_string();
    let jobs = submit_jobs(&a, &tag, 8);
    checkpoint(&a.data.join("tally.db"));
    let mut b = daemon(&mock);
    std::fs::create_dir_all(&b.data).expect("new data dir");
    std::fs::copy(a.data.join("tally.db"), b.data.join("tally.db")).expect("copy tally.db alone");
    for (id, _) in &jobs {
        a.wait_status(id, &["succeeded"]);
    }
    assert!(a.term().success());
    assert_eq!(charges(&mock, &jobs), vec![1; jobs.len()], "the original paid for each job once");

    b.spawn();
    assert!(b.stdout().contains("older database"), "start-up says what it noticed: {}", b.stdout());
    let tasks = settled_or_held(&b, &jobs);
    assert_eq!(charges(&mock, &jobs), vec![1; jobs.len()], "the copy sent nothing again");
    let held = held_explained(&tasks, "copy of the database taken while tally was running");
    assert!(!held.is_empty(), "the copy held queued jobs (else this test tested nothing): {tasks:?}");
    // The start-up look at the provider: OpenAI lists no requests, so each held job stays held
    // and says which provider could not settle it.
    for id in &held {
        let said = wait_for(Duration::from_secs(30), || {
            let t = b.call("GET", &format!("/v1/tasks/{id}"), None).json();
            let reason = t["held"]["reason"].as_str().unwrap_or("").to_string();
            reason.contains("provider `openai` cannot settle it").then_some(reason)
        });
        let reason = said.unwrap_or_else(|| panic!("{id}: the look is not in its reason; stderr:\n{}", b.stderr()));
        assert!(reason.contains("offers no listing") && reason.contains("Send it again?"), "{reason}");
    }
    let tasks = settled_or_held(&b, &jobs);
    let _ = held_explained(&tasks, "copy of the database taken while tally was running");
    let o = b.cli(&["held", "check"]);
    assert!(o.status.success(), "tally held check: {}", out(&o));
    let want = format!("looked up {n} held job(s): 0 found at their provider", n = held.len());
    assert!(out(&o).contains(&want) && out(&o).contains("tally held list"), "{}", out(&o));
    assert_eq!(charges(&mock, &jobs), vec![1; jobs.len()], "a check sends nothing");
    let mut sorted = held.clone();
    sorted.sort();
    assert_eq!(held_ids(&b), sorted, "GET /v1/held lists exactly the held jobs");
    release_one_is_charged_once_more(&b, &mock, &jobs, &held);
    assert!(b.term().success());
}

/// A copy of `tally.db` taken while a daemon sends `n` jobs to Replicate, checkpointed so it
/// holds the queued ones, then the original finishes every job as `status` and stops: the
/// copy's daemon (not started), the jobs, and the original's view of each.
fn copy_while_running_at_replicate(mock: &Mock, n: usize, status: &str) -> (Daemon, Vec<(String, String)>, Vec<Value>) {
    let mut a = replicate_daemon(mock);
    a.spawn();
    let tag = uuid::Uuid::new_v4().to_string();
    let jobs = submit_jobs_to(&a, "replicate", &tag, n);
    checkpoint(&a.data.join("tally.db"));
    let b = replicate_daemon(mock);
    std::fs::create_dir_all(&b.data).expect("new data dir");
    std::fs::copy(a.data.join("tally.db"), b.data.join("tally.db")).expect("copy tally.db alone");
    let originals: Vec<Value> = jobs.iter().map(|(id, _)| a.wait_status(id, &[status])).collect();
    assert!(a.term().success());
    assert_eq!(charges(mock, &jobs), vec![1; jobs.len()], "the original paid for each job once");
    (b, jobs, originals)
}

/// The same copy against Replicate, which can show the requests it got: the copy's held jobs
/// are looked up at start-up, each found as the prediction the original made (by the seed
/// tally derives from the job's attempt key) and fetched from it. The mock's ledger shows one
/// charge per job, nothing is left held, and every image downloads with the sha256 the
/// original stored.
#[test]
fn a_copy_settles_held_jobs_by_looking_them_up_at_replicate() {
    let mock = Mock::start(&["--latency-ms", "300"]);
    let (mut b, jobs, originals) = copy_while_running_at_replicate(&mock, 6, "succeeded");
    let originals: Vec<String> =
        originals.iter().map(|t| t["artifacts"][0]["sha256"].as_str().unwrap_or("").to_string()).collect();
    b.spawn();
    assert!(b.stdout().contains("older database"), "start-up says what it noticed: {}", b.stdout());
    let mut found = 0;
    for ((id, _), sha) in jobs.iter().zip(&originals) {
        let t = b.wait_status(id, &["succeeded", "failed", "unknown"]);
        assert_eq!(t["status"], "succeeded", "{t}\nstderr:\n{}", b.stderr());
        assert!(t["held"].is_null(), "{t}");
        assert_eq!(t["artifacts"][0]["sha256"].as_str(), Some(sha.as_str()), "the original's image: {t}");
        let url = t["artifacts"][0]["url"].as_str().expect("artifact url");
        let r = b.call("GET", url, None);
        assert_eq!((r.status, sha256_hex(&r.body)), (200, sha.clone()), "{url} downloads whole");
        let events = b.call("GET", &format!("/v1/tasks/{id}/events"), None).json();
        let kinds: Vec<&str> =
            events["events"].as_array().expect("events").iter().filter_map(|e| e["kind"].as_str()).collect();
        if kinds.contains(&"found_at_provider") {
            found += 1;
            assert!(kinds.contains(&"held"), "found after being held: {kinds:?}");
        }
    }
    assert!(found >= 1, "at least one queued job was held and found (else this tested nothing)");
    assert_eq!(charges(&mock, &jobs), vec![1; jobs.len()], "looked up and fetched, never sent again");
    assert!(held_ids(&b).is_empty(), "nothing is left held");
    let o = b.cli(&["check"]);
    assert!(o.status.success(), "tally check: {}", out(&o));
    assert!(b.term().success());
}

/// A held job whose prediction failed at Replicate: the copy finds it and fails it with the
/// provider's words and the same charge evidence the original had, sending nothing.
#[test]
fn a_copy_fails_a_held_job_that_failed_at_replicate() {
    let mock = Mock::start(&["--latency-ms", "300"]);
    mock.behave(json!({"job_error": "NSFW content detected"}));
    let (mut b, jobs, originals) = copy_while_running_at_replicate(&mock, 4, "failed");
    b.spawn();
    let mut found = 0;
    for ((id, _), original) in jobs.iter().zip(&originals) {
        let t = b.wait_status(id, &["succeeded", "failed", "unknown"]);
        assert_eq!(t["status"], "failed", "{t}\nstderr:\n{}", b.stderr());
        assert!(t["reason"].as_str().unwrap_or("").contains("NSFW content detected"), "{t}");
        assert_eq!(t["charge"], original["charge"], "the same evidence as the original's: {t}");
        let events = b.call("GET", &format!("/v1/tasks/{id}/events"), None).json();
        found +=
            events["events"].as_array().expect("events").iter().filter(|e| e["kind"] == "found_at_provider").count();
    }
    assert!(found >= 1, "at least one queued job was held and found");
    assert_eq!(charges(&mock, &jobs), vec![1; jobs.len()], "nothing sent again");
    assert!(held_ids(&b).is_empty());
    assert!(b.term().success());
}

/// An image set copied while its first shot runs at Replicate: the copy holds the later shots,
/// finds each at Replicate, and fetches them one shot after another (a found shot waits while
/// another of its set is live, and the look runs again when it settles). One charge per shot.
#[test]
fn a_copy_settles_a_held_image_set_one_shot_at_a_time() {
    let mock = Mock::start(&["--latency-ms", "300"]);
    let mut a = replicate_daemon(&mock);
    a.spawn();
    let tag = uuid::Uuid::new_v4().to_string();
    let body = json!({"product": "oldcopy lamp", "shots": [
        {"role": "main", "prompt": format!("oldcopy set {tag} main")},
        {"role": "scene", "prompt": format!("oldcopy set {tag} scene")},
        {"role": "selling_point", "prompt": format!("oldcopy set {tag} detail")}]});
    let r = a.call("POST", "/v1/sets", Some(&body));
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let shots: Vec<(String, String)> = r.json()["shots"]
        .as_array()
        .expect("shots")
        .iter()
        .map(|t| (t["id"].as_str().unwrap_or("").to_string(), t["prompt"].as_str().unwrap_or("").to_string()))
        .collect();
    assert_eq!(shots.len(), 3, "{shots:?}");
    checkpoint(&a.data.join("tally.db"));
    let mut b = replicate_daemon(&mock);
    std::fs::create_dir_all(&b.data).expect("new data dir");
    std::fs::copy(a.data.join("tally.db"), b.data.join("tally.db")).expect("copy tally.db alone");
    for (id, _) in &shots {
        a.wait_status(id, &["succeeded"]);
    }
    assert!(a.term().success());
    assert_eq!(charges(&mock, &shots), vec![1; 3], "the original paid for each shot once");

    b.spawn();
    let mut found = 0;
    for (id, _) in &shots {
        let t = b.wait_status(id, &["succeeded", "failed", "unknown"]);
        assert_eq!(t["status"], "succeeded", "{t}\nstderr:\n{}", b.stderr());
        let events = b.call("GET", &format!("/v1/tasks/{id}/events"), None).json();
        found +=
            events["events"].as_array().expect("events").iter().filter(|e| e["kind"] == "found_at_provider").count();
    }
    assert!(found >= 2, "the later shots were held and found: {found}");
    assert_eq!(charges(&mock, &shots), vec![1; 3], "nothing sent again");
    assert!(held_ids(&b).is_empty());
    assert!(b.term().success());
}

/// "Restore an older backup while work is queued / in flight": `tally backup` right after
/// the submits, the original finishes (and pays for) everything, then the backup is restored
/// into the same data directory and served. `tally restore` and `tally check` say how many
/// jobs would be held; serving holds them; nothing is charged twice.
#[test]
fn a_restored_backup_holds_what_the_original_already_paid_for() {
    let mock = Mock::start(&["--latency-ms", "300"]);
    let mut a = daemon(&mock);
    a.spawn();
    let tag = uuid::Uuid::new_v4().to_string();
    let jobs = submit_jobs(&a, &tag, 8);
    let backup = a.dir.path().join("backup.db");
    let o = a.cli(&["backup", backup.to_str().expect("utf-8")]);
    assert!(o.status.success(), "tally backup: {}", out(&o));
    for (id, _) in &jobs {
        a.wait_status(id, &["succeeded"]);
    }
    assert!(a.term().success());
    assert_eq!(charges(&mock, &jobs), vec![1; jobs.len()]);

    let o = a.cli(&["check", backup.to_str().expect("utf-8")]);
    assert!(o.status.success(), "tally check: {}", out(&o));
    assert!(out(&o).contains("would hold"), "tally check says what serving it would hold: {}", out(&o));
    let o = a.cli(&["restore", backup.to_str().expect("utf-8")]);
    assert!(o.status.success(), "tally restore: {}", out(&o));
    let said = out(&o);
    let n: usize = said
        .split("would hold ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("tally restore names how many jobs would be held: {said}"));
    assert!(n >= 1, "work was queued at backup time: {said}");

    a.spawn();
    let tasks = settled_or_held(&a, &jobs);
    assert_eq!(charges(&mock, &jobs), vec![1; jobs.len()], "the restored backup sent nothing again");
    let held = held_explained(&tasks, "queued when the backup was taken");
    assert_eq!(held.len(), n, "exactly the jobs tally restore announced are held: {tasks:?}");
    release_one_is_charged_once_more(&a, &mock, &jobs, &held);
    // Held jobs stay held across a clean restart, and the restart itself holds nothing more.
    assert!(a.term().success());
    a.spawn();
    assert!(!a.stdout().contains("older database"), "a clean restart is not an older database: {}", a.stdout());
    assert_eq!(held_ids(&a).len(), held.len() - 1);
    let o = a.cli(&["held", "release", "no-such-job"]);
    assert!(!o.status.success() && out(&o).contains("not held: no-such-job"), "a wrong id says so: {}", out(&o));
    // Neither ids nor all: nothing named, nothing released (the document allows it).
    let r = a.call("POST", "/v1/held/release", Some(&json!({})));
    assert_eq!((r.status, r.json()), (200, json!({"released": [], "not_held": []})), "neither ids nor all");
    assert_eq!(held_ids(&a).len(), held.len() - 1, "nothing was released");
    let r = a.call("POST", "/v1/held/release", Some(&json!({"all": true})));
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["released"].as_array().map(Vec::len), Some(held.len() - 1));
    assert!(a.term().success());
}

/// The control: a kill -9 with the WAL kept is an ordinary crash. Nothing is held, nothing
/// charged twice, and the restart says nothing about an older database.
#[test]
fn a_kill_with_the_wal_kept_holds_nothing() {
    let mock = Mock::start(&["--latency-ms", "300"]);
    let mut a = daemon(&mock);
    a.spawn();
    let tag = uuid::Uuid::new_v4().to_string();
    let jobs = submit_jobs(&a, &tag, 6);
    wait_charged(&mock, &jobs, 2);
    let mut child = a.child.take().expect("running");
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    a.spawn();
    let tasks = settled_or_held(&a, &jobs);
    assert!(tasks.iter().all(|t| t["held"].is_null()), "a crash holds nothing: {tasks:?}");
    assert!(held_ids(&a).is_empty());
    assert!(!a.stdout().contains("older database"), "{}", a.stdout());
    assert!(charges(&mock, &jobs).iter().all(|&c| c <= 1), "{:?}", charges(&mock, &jobs));
    let o = a.cli(&["check"]);
    assert!(out(&o).contains("holds nothing new"), "tally check: {}", out(&o));
    assert!(a.term().success());
}

/// After a kill -9, deleting `tally.db-wal` (to "fix" the database) leaves the state of the
/// last checkpoint: jobs charged since look queued. The start-up notices, holds them, and
/// nothing is charged twice.
#[test]
fn a_wal_deleted_after_a_kill_is_noticed() {
    let mock = Mock::start(&["--latency-ms", "300"]);
    let mut a = daemon(&mock);
    a.spawn();
    let tag = uuid::Uuid::new_v4().to_string();
    let jobs = submit_jobs(&a, &tag, 12);
    checkpoint(&a.data.join("tally.db"));
    // Charged after the checkpoint: with two slots at most two calls whose `calling` the
    // checkpoint already holds can reach the ledger after it (submits on the one-commit
    // pickup record `calling` with the submit), so the third new charge is a job the
    // checkpoint holds as queued.
    let at = charges(&mock, &jobs).iter().sum::<usize>();
    assert!(at + 3 <= jobs.len(), "too much ran before the checkpoint: {at} charged");
    wait_charged(&mock, &jobs, at + 3);
    let mut child = a.child.take().expect("running");
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    for f in ["tally.db-wal", "tally.db-shm"] {
        let _ = std::fs::remove_file(a.data.join(f));
    }
    let o = a.cli(&["check"]);
    assert!(out(&o).contains("would hold"), "tally check tells before serving: {}", out(&o));
    a.spawn();
    assert!(a.stdout().contains("older database"), "{}", a.stdout());
    let tasks = settled_or_held(&a, &jobs);
    let held = held_explained(&tasks, "deleted tally.db-wal");
    assert!(!held.is_empty(), "jobs charged after the checkpoint look queued, and are held: {tasks:?}");
    let charged = charges(&mock, &jobs);
    assert!(charged.iter().all(|&c| c <= 1), "nothing charged twice: {charged:?}");
    assert!(a.term().success());
}

/// The owner's side in a real browser: a copy served elsewhere holds its queued jobs; the page
/// lists them under "Needs your attention" with a banner, each held job says why and offers
/// "Send it again…" (the cost stated before anything is sent), and "Send all held jobs again…"
/// releases the rest. axe-core finds nothing on the two views.
#[test]
fn held_jobs_in_the_web_page() {
    // The original: one slot, a job that takes ten minutes, so the others stay queued.
    let slow = "[[providers]]\nname = \"demo\"\nkind = \"demo\"\nmax_concurrency = 1\ndelay_ms = 600000\n";
    let mut a = Daemon::configure(slow);
    a.spawn();
    let tag = uuid::Uuid::new_v4().to_string();
    let jobs: Vec<String> = (0..3)
        .map(|i| {
            let (code, id) =
                submit(&a, "demo", &format!("web held {tag} {i}"), &format!("{tag}-{i}")).expect("submit answered");
            assert_eq!(code, 201);
            id
        })
        .collect();
    checkpoint(&a.data.join("tally.db"));
    let mut b = Daemon::configure(crate::common::FAST_DEMO);
    std::fs::create_dir_all(&b.data).expect("data dir");
    std::fs::copy(a.data.join("tally.db"), b.data.join("tally.db")).expect("copy tally.db alone");
    drop(a);
    b.spawn();
    let held = held_ids(&b);
    assert!(held.len() >= 2, "the queued jobs are held: {held:?} of {jobs:?}");
    let url = crate::web::printed_sign_in_url(&b);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let br = crate::browser::Browser::start().await;
        br.c().goto(&url).await.expect("sign in");
        br.until("the jobs page", 15, "document.getElementById('new-task') !== null").await;
        br.c()
            .find(fantoccini::Locator::Css("#status-filter"))
            .await
            .expect("filter")
            .select_by_value("attention")
            .await
            .expect("pick");
        let text = br
            .until(
                "the held banner",
                15,
                "(() => { const b = document.getElementById('held-banner'); \
                  return b && !b.hidden ? b.innerText : null; })()",
            )
            .await;
        assert!(text.as_str().unwrap_or("").contains(&format!("{} jobs are held", held.len())), "{text}");
        for id in &held {
            br.until("a held job in the list", 10, &format!("document.querySelector(\"li[data-task-id='{id}']\") !== null"))
                .await;
        }
        br.assert_accessible("needs your attention, with held jobs").await;

        // One job: why it is held, then "Send it again…", the cost said before it goes.
        let first = &held[0];
        br.js(&format!("(location.hash = '#/tasks/{first}')")).await;
        br.until("the held job", 15, "document.getElementById('release-held') !== null").await;
        let page = br.js("document.querySelector('main').innerText").await;
        assert!(page.as_str().unwrap_or("").contains("copy of the database taken while tally was running"), "{page}");
        br.assert_accessible("a held job").await;
        br.click("#release-held").await;
        let ask = br.until("the confirmation", 10, "document.getElementById('confirm-dialog').open ? document.getElementById('confirm-text').textContent : null").await;
        assert!(ask.as_str().unwrap_or("").contains("never charges"), "the cost is stated: {ask}");
        br.click("#confirm-yes").await;
        let t = b.wait_status(first, &["succeeded"]);
        assert!(t["held"].is_null(), "{t}");

        // The rest, all together.
        br.js("(location.hash = '#/')").await;
        br.until("the jobs page", 15, "document.getElementById('new-task') !== null").await;
        br.c()
            .find(fantoccini::Locator::Css("#status-filter"))
            .await
            .expect("filter")
            .select_by_value("attention")
            .await
            .expect("pick");
        br.until("the held banner", 15, "(() => { const b = document.getElementById('held-banner'); return b && !b.hidden; })()")
            .await;
        br.click("#release-all-held").await;
        br.until("the confirmation", 10, "document.getElementById('confirm-dialog').open").await;
        br.click("#confirm-yes").await;
        br.until("the banner gone", 15, "document.getElementById('held-banner').hidden").await;
        br.close().await;
    });
    for id in &held[1..] {
        b.wait_status(id, &["succeeded"]);
    }
    assert!(held_ids(&b).is_empty());
    assert!(b.term().success());
}
