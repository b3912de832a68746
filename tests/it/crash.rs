//! The crash matrix (DESIGN §9): for each crash point × each provider kind, run the real
//! binary against a real `tally mock-provider`, let the crash point abort the daemon, restart
//! it without crash points, and assert the outside world: the final status, the mock's
//! ledger of charged requests, the image (either none, or one that downloads with its
//! sha256), `tally check` (every stored image verified), and the recovery in the timeline.
//! The finish is covered on both sides of its commit: `before-finish-commit` (the image and
//! `succeeded` written in the open transaction) and `after-finish` (committed). The migration
//! of an older data dir's image files is covered by `migration_*` (see `onefile`). Every
//! cell runs twice: on SQLite, and (`crash::pg::*`) with the daemon's data on a fresh
//! PostgreSQL database, restarted under the same node name.
//!
//! Needs a binary built with `--features failpoints` (the README's test command does that).

use std::process::Command;
use std::time::Duration;

use crate::common::{Daemon, EXE, Mock, providers_with_drafts, submit, try_request, wait_for};

pub(crate) mod oldcopy;

/// What a crash at `point` must end in for a provider `kind`, and how many charged ledger
/// lines are allowed (DESIGN §6).
fn expected(point: &str, kind: &str) -> (&'static str, usize, Option<&'static str>) {
    // An operation's cell (`openai:edit`) is its provider's: the protocol is the same.
    let kind = kind.split(':').next().unwrap_or(kind);
    // Drafting on `dashscope_chat` and `gemini` is synchronous too; `openai_responses` answers
    // an id first (background mode) and is fetched by it, as a job.
    let sync = ["openai", "gemini", "photoroom", "dsdraft", "gmdraft"].contains(&kind);
    match point {
        "after-submit" => ("succeeded", 1, None),
        // The dispatch claimed (lease and execution) and committed; nothing was sent.
        "after-sent" => ("succeeded", 1, Some("abandoned")),
        "after-claim" => ("succeeded", 1, Some("abandoned")),
        // `calling` committed, nothing sent: only a replay with the same key may send it;
        // a listing that shows nothing proves nothing, so lookup kinds end unknown too.
        // The one-commit pickup: `calling` committed with the submit (so also when the crash
        // comes right after the client had its answer), nothing sent — the same as after
        // `calling` on the normal path.
        "after-calling" | "after-pickup" | "before-pickup-call" if kind == "idem" => ("succeeded", 1, Some("resumed")),
        "after-calling" | "after-pickup" | "before-pickup-call" => ("unknown", 0, Some("unknown")),
        "after-accepted" => ("succeeded", 1, Some("resumed")),
        // The image arrived but its finish never committed: nothing is stored, and the call
        // is recovered like any other (a lookup or replay finds the image again, free).
        "after-answer" | "before-finish-commit" if sync => ("unknown", 1, Some("unknown")),
        "after-answer" | "before-finish-commit" => ("succeeded", 1, Some("resumed")),
        // Committed: the image and `succeeded` are there together; nothing to recover.
        "after-finish" => ("succeeded", 1, None),
        other => panic!("no expectation for {other}"),
    }
}

fn engine_section() -> &'static str {
    "dispatch_grace_secs = 1\nmax_attempts = 3\nbackoff_base_ms = 50\nbackoff_max_ms = 500\n"
}

/// The points only the dispatcher's path meets: an idle daemon would take the one-commit
/// pickup for the cell's task, so their cells run with `fast_pickup = false`. The later points
/// run with it on (the default), so they cover the fast path's calls as well.
const NORMAL_PATH_POINTS: &[&str] = &["after-submit", "after-sent", "after-claim", "after-calling"];

/// The points only the one-commit pickup meets.
const PICKUP_POINTS: &[&str] = &["after-pickup", "before-pickup-call"];

/// The `[engine]` section of a cell at `point`.
fn engine_for(point: &str) -> String {
    let fast = if NORMAL_PATH_POINTS.contains(&point) { "fast_pickup = false\n" } else { "" };
    format!("{}{fast}", engine_section())
}

/// Where a cell keeps its data: the SQLite file, or a fresh PostgreSQL database (one node
/// that restarts under its name, so it recovers its own earlier run at once).
#[derive(Clone, Copy, PartialEq, Eq)]
enum On {
    Sqlite,
    Postgres,
}

/// One cell of the matrix, on SQLite.
pub fn crash_case(point: &str, kind: &str) {
    crash_case_on(point, kind, On::Sqlite)
}

/// One cell of the matrix on `on`.
fn crash_case_on(point: &str, kind: &str, on: On) {
    let mock = Mock::start(&["--job-duration-ms", "50", "--honor-idempotency-key"]);
    let mut d = Daemon::configure_with(&engine_for(point), &providers_with_drafts(&mock));
    if on == On::Postgres && d.on_postgres("crash-node").is_none() {
        return;
    }
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-crash".into()));
    d.env.push(("FAILPOINTS".into(), format!("{point}=return")));
    d.spawn();
    // The one-commit pickup is opportunistic: a submit that meets the dispatcher holding the
    // idle workers' permits (its pass at start-up), or Replicate's first task (its preflight
    // reads the model's schema over the network once), takes the dispatcher's path and simply
    // succeeds. Such tasks are counted and the next one is submitted, until one is picked up.
    let mut earlier = 0;
    let (prompt, key, first, status) = loop {
        let prompt = format!("crash {point} {kind} {}", uuid::Uuid::new_v4());
        let key = uuid::Uuid::new_v4().to_string();
        let first = submit(&d, kind, &prompt, &key);
        let id = first.as_ref().map(|(_, id)| id.clone());
        let ended = wait_for(Duration::from_secs(30), || {
            if let Some(status) = d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                return Some(Err(status));
            }
            let id = id.as_deref().filter(|_| PICKUP_POINTS.contains(&point))?;
            // The daemon may die under this very request: then the next look sees it.
            let auth = format!("Bearer {}", d.token());
            let path = format!("/v1/tasks/{id}");
            let task = try_request(d.port, "GET", &path, &[("Authorization", auth.as_str())], None)?.json();
            (task["status"] == "succeeded").then_some(Ok(()))
        });
        match ended {
            Some(Err(status)) => break (prompt, key, first, status),
            Some(Ok(())) if earlier < 5 => earlier += 1,
            _ => panic!("{point}/{kind}: the crash point never fired; stderr:\n{}", d.stderr()),
        }
    };
    assert!(!status.success(), "{point}/{kind}: the daemon exited cleanly instead of crashing");
    d.child = None;

    d.env.retain(|(k, _)| k != "FAILPOINTS");
    d.spawn();
    // The client retries a submit whose answer it may have lost, with the same key.
    let (code, id) = submit(&d, kind, &prompt, &key).unwrap_or_else(|| {
        panic!("{point}/{kind}: the restarted daemon gave no task for the resubmit; its stderr:\n{}", d.stderr())
    });
    assert_eq!(code, 200, "{point}/{kind}: resubmitting with the same key must return the existing task");
    if let Some((_, first_id)) = first {
        assert_eq!(first_id, id, "{point}/{kind}: the same key named another task");
    }

    let (want, charged_allowed, recovery) = expected(point, kind);
    let task = d.wait_status(&id, &["succeeded", "failed", "unknown", "canceled"]);
    assert_eq!(task["status"], want, "{point}/{kind}: final status; task: {task}");
    let draft = kind.ends_with(":draft");
    if let Some((_, op)) = kind.split_once(':') {
        assert_eq!(task["operation"], op, "{point}/{kind}: {task}");
        assert!(draft || task["image"]["upload"].is_string(), "{point}/{kind}: the source is kept: {task}");
    }
    if draft {
        // The draft follows its call: a plan when it succeeded, never one otherwise.
        let drafts = d.call("GET", "/v1/drafts", None).json()["drafts"].as_array().cloned().unwrap_or_default();
        assert_eq!(drafts.len(), 1, "{point}/{kind}: one draft: {drafts:?}");
        let dr = &drafts[0];
        assert_eq!(dr["task_id"].as_str(), Some(id.as_str()), "{point}/{kind}: {dr}");
        let want_draft = if want == "succeeded" { "ready" } else { want };
        assert_eq!(dr["status"], want_draft, "{point}/{kind}: {dr}");
        assert_eq!(dr["shots"].as_array().is_some_and(|s| !s.is_empty()), want == "succeeded", "{point}/{kind}: {dr}");
    }
    // Give any (wrong) resend a moment to reach the ledger before counting.
    std::thread::sleep(Duration::from_millis(300));
    // A cutout has no prompt to count by: its cell's mock saw no other cutout.
    let (lines, charged) = if kind.ends_with(":cutout") { mock.count_endpoint("segment") } else { mock.count(&prompt) };
    assert_eq!(charged, charged_allowed, "{point}/{kind}: charged requests ({lines} ledger lines)");
    let artifacts = task["artifacts"].as_array().cloned().unwrap_or_default();
    if draft {
        assert!(artifacts.is_empty(), "{point}/{kind}: a drafting call makes no image: {task}");
    } else if want == "succeeded" {
        assert_eq!(artifacts.len(), 1, "{point}/{kind}: one artifact; task: {task}");
        let art = &artifacts[0];
        let url = art["url"].as_str().expect("artifact url");
        let body = d.call("GET", url, None).body;
        assert_eq!(crate::common::sha256_hex(&body), art["sha256"].as_str().unwrap_or(""), "{point}/{kind}");
    } else {
        assert!(artifacts.is_empty(), "{point}/{kind}: an artifact without success: {task}");
    }
    let events = d.call("GET", &format!("/v1/tasks/{id}/events"), None).json();
    let kinds: Vec<&str> =
        events["events"].as_array().expect("events").iter().filter_map(|e| e["kind"].as_str()).collect();
    if let Some(r) = recovery {
        assert!(kinds.contains(&r), "{point}/{kind}: the timeline does not show `{r}`: {kinds:?}");
    }
    let status = d.term();
    assert!(status.success(), "{point}/{kind}: clean stop failed");
    let check = Command::new(EXE).args(["check", "--config"]).arg(&d.config).output().expect("check runs");
    let out = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{point}/{kind}: tally check failed:\n{out}");
    // The image made, the earlier cells' images, and an operation's source photo.
    let images = usize::from(want == "succeeded" && !draft) + earlier + usize::from(kind.contains(':'));
    assert!(out.contains(&format!("{images} image(s) verified")), "{point}/{kind}: {out}");
    if on == On::Postgres {
        assert!(out.contains("PostgreSQL"), "{point}/{kind}: not checked on PostgreSQL: {out}");
        assert!(!d.data.join("tally.db").exists(), "{point}/{kind}: a SQLite file was made");
    }
}

/// Each cell on SQLite (`crash::NAME`) and on PostgreSQL (`crash::pg::NAME`: the store's
/// side — `pg::ops`, recovery under the envelope lock, the node lock at restart — is what
/// differs).
macro_rules! matrix {
    ($($name:ident: $point:literal, $kind:literal;)*) => {
        $(#[test] fn $name() { crash_case($point, $kind); })*
        mod pg {
            $(#[test] fn $name() { super::crash_case_on($point, $kind, super::On::Postgres); })*
        }
    };
}

matrix! {
    after_submit_openai: "after-submit", "openai";
    after_submit_replicate: "after-submit", "replicate";
    after_submit_fal: "after-submit", "fal";
    after_submit_idem: "after-submit", "idem";
    after_sent_openai: "after-sent", "openai";
    after_sent_replicate: "after-sent", "replicate";
    after_sent_fal: "after-sent", "fal";
    after_sent_idem: "after-sent", "idem";
    after_claim_openai: "after-claim", "openai";
    after_claim_replicate: "after-claim", "replicate";
    after_claim_fal: "after-claim", "fal";
    after_claim_idem: "after-claim", "idem";
    after_calling_openai: "after-calling", "openai";
    after_calling_replicate: "after-calling", "replicate";
    after_calling_fal: "after-calling", "fal";
    after_calling_idem: "after-calling", "idem";
    after_accepted_replicate: "after-accepted", "replicate";
    after_accepted_fal: "after-accepted", "fal";
    after_answer_openai: "after-answer", "openai";
    after_answer_replicate: "after-answer", "replicate";
    after_answer_fal: "after-answer", "fal";
    after_answer_idem: "after-answer", "idem";
    before_finish_commit_openai: "before-finish-commit", "openai";
    before_finish_commit_replicate: "before-finish-commit", "replicate";
    before_finish_commit_fal: "before-finish-commit", "fal";
    before_finish_commit_idem: "before-finish-commit", "idem";
    after_finish_openai: "after-finish", "openai";
    after_finish_replicate: "after-finish", "replicate";
    after_finish_fal: "after-finish", "fal";
    after_finish_idem: "after-finish", "idem";
    // DashScope: a task id before the work, and a lost create searched in the task listing
    // (after-calling: nothing was sent, so the listing shows nothing and the task is unknown).
    after_submit_dashscope: "after-submit", "dashscope";
    after_sent_dashscope: "after-sent", "dashscope";
    after_claim_dashscope: "after-claim", "dashscope";
    after_calling_dashscope: "after-calling", "dashscope";
    after_accepted_dashscope: "after-accepted", "dashscope";
    after_answer_dashscope: "after-answer", "dashscope";
    before_finish_commit_dashscope: "before-finish-commit", "dashscope";
    after_finish_dashscope: "after-finish", "dashscope";
    after_submit_gemini: "after-submit", "gemini";
    after_submit_gembatch: "after-submit", "gembatch";
    after_submit_bfl: "after-submit", "bfl";
    after_sent_gemini: "after-sent", "gemini";
    after_sent_gembatch: "after-sent", "gembatch";
    after_sent_bfl: "after-sent", "bfl";
    after_claim_gemini: "after-claim", "gemini";
    after_claim_gembatch: "after-claim", "gembatch";
    after_claim_bfl: "after-claim", "bfl";
    after_calling_gemini: "after-calling", "gemini";
    after_calling_gembatch: "after-calling", "gembatch";
    after_calling_bfl: "after-calling", "bfl";
    after_accepted_gembatch: "after-accepted", "gembatch";
    after_accepted_bfl: "after-accepted", "bfl";
    after_answer_gemini: "after-answer", "gemini";
    after_answer_gembatch: "after-answer", "gembatch";
    after_answer_bfl: "after-answer", "bfl";
    before_finish_commit_gemini: "before-finish-commit", "gemini";
    before_finish_commit_gembatch: "before-finish-commit", "gembatch";
    before_finish_commit_bfl: "before-finish-commit", "bfl";
    after_finish_gemini: "after-finish", "gemini";
    after_finish_gembatch: "after-finish", "gembatch";
    after_finish_bfl: "after-finish", "bfl";
    // The one-commit pickup (`store::ops::pickup`): `calling` committed with the submit.
    // Operations (issue #35): an edit and a cutout take the same path as a generation, at
    // every point but the one-commit pickup (a task with a source image is never picked up
    // there). One kind of each recovery: no proof (openai, photoroom), a replay (idem), a
    // lookup (kontext: a FLUX Kontext edit on Replicate).
    after_submit_openai_edit: "after-submit", "openai:edit";
    after_claim_openai_edit: "after-claim", "openai:edit";
    after_calling_openai_edit: "after-calling", "openai:edit";
    after_answer_openai_edit: "after-answer", "openai:edit";
    before_finish_commit_openai_edit: "before-finish-commit", "openai:edit";
    after_finish_openai_edit: "after-finish", "openai:edit";
    after_calling_idem_edit: "after-calling", "idem:edit";
    after_answer_idem_edit: "after-answer", "idem:edit";
    after_submit_kontext_edit: "after-submit", "kontext:edit";
    after_calling_kontext_edit: "after-calling", "kontext:edit";
    after_accepted_kontext_edit: "after-accepted", "kontext:edit";
    after_answer_kontext_edit: "after-answer", "kontext:edit";
    before_finish_commit_kontext_edit: "before-finish-commit", "kontext:edit";
    after_finish_kontext_edit: "after-finish", "kontext:edit";
    after_submit_photoroom_cutout: "after-submit", "photoroom:cutout";
    after_claim_photoroom_cutout: "after-claim", "photoroom:cutout";
    after_calling_photoroom_cutout: "after-calling", "photoroom:cutout";
    after_answer_photoroom_cutout: "after-answer", "photoroom:cutout";
    before_finish_commit_photoroom_cutout: "before-finish-commit", "photoroom:cutout";
    after_finish_photoroom_cutout: "after-finish", "photoroom:cutout";
    after_calling_faledit_edit: "after-calling", "faledit:edit";
    after_accepted_faledit_edit: "after-accepted", "faledit:edit";
    after_answer_faledit_edit: "after-answer", "faledit:edit";
    after_calling_dsedit_edit: "after-calling", "dsedit:edit";
    after_accepted_dsedit_edit: "after-accepted", "dsedit:edit";
    after_answer_dsedit_edit: "after-answer", "dsedit:edit";
    after_calling_gemini_edit: "after-calling", "gemini:edit";
    after_answer_gemini_edit: "after-answer", "gemini:edit";
    // Drafting calls (issue #36): the same protocol. openai_responses: the id arrives first
    // (background) and a lost answer after it is fetched by id, one charge; a lost create is
    // unknown. dashscope_chat and gemini: nothing to look up, so a lost answer is unknown and
    // never resent.
    after_submit_oadraft: "after-submit", "oadraft:draft";
    after_claim_oadraft: "after-claim", "oadraft:draft";
    after_calling_oadraft: "after-calling", "oadraft:draft";
    after_accepted_oadraft: "after-accepted", "oadraft:draft";
    after_answer_oadraft: "after-answer", "oadraft:draft";
    before_finish_commit_oadraft: "before-finish-commit", "oadraft:draft";
    after_finish_oadraft: "after-finish", "oadraft:draft";
    after_calling_dsdraft: "after-calling", "dsdraft:draft";
    after_answer_dsdraft: "after-answer", "dsdraft:draft";
    after_finish_dsdraft: "after-finish", "dsdraft:draft";
    after_calling_gmdraft: "after-calling", "gmdraft:draft";
    after_answer_gmdraft: "after-answer", "gmdraft:draft";
    after_calling_bfledit_edit: "after-calling", "bfledit:edit";
    after_accepted_bfledit_edit: "after-accepted", "bfledit:edit";
    after_answer_bfledit_edit: "after-answer", "bfledit:edit";
    after_pickup_openai: "after-pickup", "openai";
    after_pickup_replicate: "after-pickup", "replicate";
    after_pickup_fal: "after-pickup", "fal";
    after_pickup_idem: "after-pickup", "idem";
    after_pickup_dashscope: "after-pickup", "dashscope";
    after_pickup_gemini: "after-pickup", "gemini";
    after_pickup_gembatch: "after-pickup", "gembatch";
    after_pickup_bfl: "after-pickup", "bfl";
    before_pickup_call_openai: "before-pickup-call", "openai";
    before_pickup_call_replicate: "before-pickup-call", "replicate";
    before_pickup_call_fal: "before-pickup-call", "fal";
    before_pickup_call_idem: "before-pickup-call", "idem";
    before_pickup_call_dashscope: "before-pickup-call", "dashscope";
    before_pickup_call_gemini: "before-pickup-call", "gemini";
    before_pickup_call_gembatch: "before-pickup-call", "gembatch";
    before_pickup_call_bfl: "before-pickup-call", "bfl";
}

#[test]
fn every_task_crash_point_is_in_the_matrix() {
    for p in tally::failpoint::POINTS {
        // `expected` panics for a point it has no expectation for.
        let _ = expected(p, "openai");
    }
    assert_eq!(tally::failpoint::POINTS.len(), 10, "a new crash point needs its cells above");
}

/// Every paid provider kind's default operations beyond `generate` have cells (generated from
/// the kinds' descriptors): a kind added, or an operation added to one, without its cells fails
/// here rather than shipping untested.
#[test]
fn every_kind_offering_an_operation_has_its_cells() {
    let cells = include_str!("crash.rs");
    let base = "http://127.0.0.1:1";
    let toml = format!("{}{}", crate::common::providers_at(base), crate::common::draft_providers_at(base));
    let cfg = tally::config::Config::from_toml(&toml, "crash").expect("the matrix's providers");
    for k in tally::providers::kinds::KINDS.iter().filter(|k| k.bills) {
        for op in k.default_operations.iter().filter(|o| **o != tally::domain::operation::Operation::Generate) {
            let covered = cfg.providers.iter().filter(|p| p.kind.as_str() == k.name).any(|p| {
                cells.contains(&format!("\"after-calling\", \"{}:{}\"", p.name, op.as_str()))
                    && cells.contains(&format!("\"after-answer\", \"{}:{}\"", p.name, op.as_str()))
            });
            assert!(
                covered,
                "kind {} offers {} but the crash matrix has no after-calling and after-answer cells for it",
                k.name,
                op.as_str()
            );
        }
    }
}

/// Ledger lines of a tag that started a paid generation, oldest first.
fn charged_lines(mock: &Mock, tag: &str) -> Vec<serde_json::Value> {
    mock.lines()
        .into_iter()
        .filter(|l| l["charged"] == true && l["prompt"].as_str().is_some_and(|p| p.contains(tag)))
        .collect()
}

#[test]
fn a_set_made_with_the_cli_survives_a_kill_mid_set() {
    let mock = Mock::start(&["--latency-ms", "800"]);
    let mut d = Daemon::configure_with(engine_section(), &crate::common::providers(&mock));
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-sets".into()));
    d.spawn();
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let mut args: Vec<String> = vec!["set".into(), "create".into(), "--product".into(), "red sneaker".into()];
    for (i, colour) in ["red", "white"].iter().enumerate() {
        let path = d.dir.path().join(format!("ref{i}.png"));
        std::fs::write(&path, tally::render::placeholder_png(colour, 16)).expect("write ref");
        args.extend(["--ref".into(), path.display().to_string()]);
    }
    for role in ["main", "selling_point", "scene", "scene"] {
        args.extend(["--shot".into(), format!("{role}:{role} shot {tag}")]);
    }
    args.extend(["--provider".into(), "openai".into(), "--json".into()]);
    let out = d.cli(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "set create failed: {}", String::from_utf8_lossy(&out.stderr));
    let set: serde_json::Value = serde_json::from_slice(&out.stdout).expect("set JSON");
    let id = set["id"].as_str().expect("set id").to_string();

    // Kill the daemon while the second shot is at the provider.
    let second = wait_for(Duration::from_secs(30), || (charged_lines(&mock, &tag).len() >= 2).then_some(()));
    assert!(second.is_some(), "the second shot never reached the provider");
    let mut child = d.child.take().expect("running");
    child.kill().expect("kill");
    child.wait().expect("reap");
    d.spawn();

    let done = wait_for(Duration::from_secs(60), || {
        let s = d.call("GET", &format!("/v1/sets/{id}"), None).json();
        (s["status"] != "running").then_some(s)
    })
    .expect("the set settles after the restart");
    // The shot in flight at the kill ends unknown (openai_images cannot prove what happened);
    // the others succeed, and no shot is ever charged twice.
    let statuses: Vec<&str> =
        done["shots"].as_array().expect("shots").iter().filter_map(|s| s["status"].as_str()).collect();
    assert_eq!(statuses, ["succeeded", "unknown", "succeeded", "succeeded"], "{done}");
    assert_eq!(done["status"], "done_with_problems");
    let charged = charged_lines(&mock, &tag);
    for role_shot in ["main shot", "selling_point shot"] {
        assert_eq!(charged.iter().filter(|l| l["prompt"].as_str().unwrap_or("").starts_with(role_shot)).count(), 1);
    }
    assert_eq!(charged.len(), 4, "each shot charged exactly once");
    assert!(charged.iter().all(|l| l["reference_images"] == 2), "every shot carried both references");
    let out = d.cli(&["set", "status", &id]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("3 of 4 done, 1 unknown"));
}

/// The start-up migration of an older data dir's image files (`store::sqlite::migrate`), killed at
/// each of its crash points: after the schema step, after a batch of images committed (files
/// not yet removed), after their files were removed (rows not yet deleted). Restarted without
/// crash points, every image downloads with its sha256, nothing is stored twice (`tally check`
/// finds no image without its row), and the files are gone.
fn migration_case(point: &str) {
    let mut d = Daemon::configure(crate::common::FAST_DEMO);
    let f = crate::onefile::v2_data_dir(&d.data);
    let crashed = Command::new(EXE)
        .args(["serve", "--config"])
        .arg(&d.config)
        .env_remove("TALLY_DATA_DIR")
        .env_remove("TALLY_CONFIG")
        .env("FAILPOINTS", format!("{point}=return"))
        .output()
        .expect("run tally serve");
    assert!(!crashed.status.success(), "{point}: the crash point never fired");
    assert!(String::from_utf8_lossy(&crashed.stderr).contains(&format!("crash point {point} reached")), "{point}");

    d.spawn();
    for (path, sha) in &f.images {
        let r = d.call("GET", path, None);
        assert_eq!(r.status, 200, "{point}: {path}");
        assert_eq!(&crate::common::sha256_hex(&r.body), sha, "{point}: {path}");
    }
    for id in &f.tasks {
        assert_eq!(d.call("GET", &format!("/v1/tasks/{id}"), None).json()["status"], "succeeded", "{point}: {id}");
    }
    assert!(d.term().success(), "{point}: clean stop");
    for rel in &f.files {
        assert!(!d.data.join(rel).exists(), "{point}: {rel} was not removed");
    }
    let check = Command::new(EXE).args(["check", "--config"]).arg(&d.config).output().expect("check runs");
    let out = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{point}: tally check failed:\n{out}");
    assert!(out.contains("6 image(s) verified against their sha256 (5 generated, 1 uploaded)"), "{point}: {out}");
}

#[test]
fn migration_killed_after_the_schema_step() {
    migration_case("migrate-after-schema");
}

#[test]
fn migration_killed_after_images_committed() {
    migration_case("migrate-after-move");
}

#[test]
fn migration_killed_after_files_removed() {
    migration_case("migrate-after-remove");
}

#[test]
fn every_migration_crash_point_is_in_the_matrix() {
    assert_eq!(
        tally::failpoint::MIGRATION_POINTS,
        ["migrate-after-schema", "migrate-after-move", "migrate-after-remove"],
        "a new crash point needs its cell above"
    );
}

/// Run the configured daemon until the crash point `point` aborts it.
fn crash_at(d: &mut Daemon, point: &str, what: &str) {
    d.env.retain(|(k, _)| k != "FAILPOINTS");
    d.env.push(("FAILPOINTS".into(), format!("{point}=return")));
    d.spawn_process();
    let exited = wait_for(Duration::from_secs(30), || d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()));
    let status = exited.unwrap_or_else(|| panic!("{what}: crash point {point} never fired; stderr:\n{}", d.stderr()));
    assert!(!status.success(), "{what}: the daemon exited cleanly instead of crashing at {point}");
    d.child = None;
    d.env.retain(|(k, _)| k != "FAILPOINTS");
}

/// A crash during a resumable call, then a second crash right after start-up recovery's
/// requeue was dispatched again (the resumed execution claimed, nothing run yet), leaves a
/// `sent` envelope whose execution is past `claimed`. With `max_sends = 2` that dispatch is the
/// last one allowed: a version that counted it as undelivered failed the task "could not be
/// delivered" although the provider had accepted (and charged) it. It is resumed from its
/// phase: one charge, the image, a clean check.
fn resumed_hand_off_case(kind: &str, first_point: &str) {
    let what = format!("resumed hand-off {kind}");
    let mock = Mock::start(&["--job-duration-ms", "50", "--honor-idempotency-key"]);
    let engine = format!("{}max_sends = 2\n", engine_section());
    let mut d = Daemon::configure_with(&engine, &crate::common::providers(&mock));
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-crash".into()));
    d.env.push(("FAILPOINTS".into(), format!("{first_point}=return")));
    d.spawn();
    let prompt = format!("resumed hand-off {kind} {}", uuid::Uuid::new_v4());
    let key = uuid::Uuid::new_v4().to_string();
    let _ = submit(&d, kind, &prompt, &key);
    let exited = wait_for(Duration::from_secs(30), || d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()));
    assert!(exited.is_some_and(|s| !s.success()), "{what}: {first_point} never fired; stderr:\n{}", d.stderr());
    d.child = None;
    // Start-up recovery requeues the execution and the dispatcher claims it; the process dies
    // before the worker runs.
    crash_at(&mut d, "after-sent", &what);

    d.spawn();
    let (code, id) = submit(&d, kind, &prompt, &key).unwrap_or_else(|| {
        panic!("{what}: the restarted daemon gave no task for the resubmit; its stderr:\n{}", d.stderr())
    });
    assert_eq!(code, 200, "{what}: the same key must name the existing task");
    let task = d.wait_status(&id, &["succeeded", "failed", "unknown", "canceled"]);
    assert_eq!(task["status"], "succeeded", "{what}: {task}");
    std::thread::sleep(Duration::from_millis(300));
    let (lines, charged) = mock.count(&prompt);
    assert_eq!(charged, 1, "{what}: charged requests ({lines} ledger lines)");
    let art = &task["artifacts"][0];
    let body = d.call("GET", art["url"].as_str().expect("artifact url"), None).body;
    assert_eq!(crate::common::sha256_hex(&body), art["sha256"].as_str().unwrap_or(""), "{what}");
    let events = d.call("GET", &format!("/v1/tasks/{id}/events"), None).json();
    let messages: Vec<String> = events["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| format!("{}: {}", e["kind"].as_str().unwrap_or(""), e["message"].as_str().unwrap_or("")))
        .collect();
    assert!(!messages.iter().any(|m| m.contains("nothing was sent")), "{what}: a false timeline: {messages:#?}");
    assert!(!messages.iter().any(|m| m.starts_with("requeued")), "{what}: counted as undelivered: {messages:#?}");
    assert!(d.term().success(), "{what}: clean stop failed");
    let check = Command::new(EXE).args(["check", "--config"]).arg(&d.config).output().expect("check runs");
    assert!(check.status.success(), "{what}: tally check failed:\n{}", String::from_utf8_lossy(&check.stdout));
}

#[test]
fn a_lost_dispatch_of_a_resumed_call_does_not_fail_a_charged_task_replicate() {
    resumed_hand_off_case("replicate", "after-accepted");
}

#[test]
fn a_lost_dispatch_of_a_resumed_call_does_not_fail_a_charged_task_idem() {
    resumed_hand_off_case("idem", "after-answer");
}
