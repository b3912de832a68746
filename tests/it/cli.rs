//! The command line and the daemon's life cycle: `submit --wait`, one daemon per data dir,
//! backup while running and `check` on the copy, a clean stop on SIGTERM that leaves the WAL
//! empty, start-up refusing a bad configuration, and a `tally bench --quick --json` smoke run.

use std::process::Command;

use crate::common::{Daemon, EXE, FAST_DEMO, TempDir};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn submit_wait_prints_success() {
    let d = Daemon::start(FAST_DEMO);
    let out = d.cli(&["submit", "a green teapot", "--wait"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{}", text(&out.stderr));
    assert!(stdout.contains("succeeded"), "{stdout}");
    assert!(stdout.contains("sha256"), "{stdout}");

    let json = d.cli(&["list", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("list --json is JSON");
    let id = v["tasks"][0]["id"].as_str().unwrap().to_string();
    let status = d.cli(&["status", &id]);
    assert!(text(&status.stdout).contains("Done: the image is ready."));
    assert!(d.cli(&["events", &id]).status.success());
    let token = d.cli(&["token"]);
    assert_eq!(text(&token.stdout).trim(), d.token());
    let retry = d.cli(&["retry", &id]);
    assert!(!retry.status.success());
    assert!(text(&retry.stderr).starts_with("tally: "));
    // Start-up printed the listen URL and a sign-in line.
    let serve_out = d.stdout();
    assert!(serve_out.contains(&format!("http://127.0.0.1:{}", d.port)), "{serve_out}");
    assert!(serve_out.contains("sign in"), "{serve_out}");
}

#[test]
fn second_serve_on_the_same_data_dir_is_refused() {
    let d = Daemon::start(FAST_DEMO);
    let pid = d.child.as_ref().unwrap().id();
    let out = d.cli(&["serve"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains(&pid.to_string()), "{err}");
}

#[test]
fn backup_while_running_then_check_the_copy() {
    let d = Daemon::start(FAST_DEMO);
    assert!(d.cli(&["submit", "backed up", "--wait"]).status.success());
    let other = TempDir::new();
    let dest = other.path().join("copy.db");
    // Global flags work after the subcommand's arguments and before them.
    let out = d.cli(&["backup", dest.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let dest2 = other.path().join("copy2.db");
    let out = Command::new(EXE).arg("backup").arg("--config").arg(&d.config).arg(&dest2).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));

    let check = Command::new(EXE).arg("check").arg(&dest).env_remove("TALLY_CONFIG").output().unwrap();
    assert!(check.status.success(), "{}{}", text(&check.stdout), text(&check.stderr));
    let own = d.cli(&["check"]);
    assert!(own.status.success(), "{}{}", text(&own.stdout), text(&own.stderr));
    assert!(text(&own.stdout).contains("1 image(s) verified against their sha256"), "{}", text(&own.stdout));
    // The copy holds the image too: one file is the whole of the work.
    assert!(text(&check.stdout).contains("1 image(s) verified against their sha256"), "{}", text(&check.stdout));

    let junk = other.path().join("junk.db");
    std::fs::write(&junk, b"not a database at all, just some bytes that are long enough").unwrap();
    let bad = Command::new(EXE).arg("check").arg(&junk).output().unwrap();
    assert!(!bad.status.success());
}

#[test]
fn sigterm_stops_cleanly_with_an_empty_wal() {
    let mut d = Daemon::start(FAST_DEMO);
    assert!(d.cli(&["submit", "before stopping", "--wait"]).status.success());
    let status = d.term();
    assert_eq!(status.code(), Some(0), "stderr:\n{}", d.stderr());
    let wal = d.data.join("tally.db-wal");
    let len = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    assert_eq!(len, 0, "WAL not empty after a clean stop");
    // The lock is released: the same data dir starts again.
    d.spawn();
    assert!(d.cli(&["list"]).status.success());
}

#[test]
fn a_bad_config_key_stops_start_up_naming_it() {
    let d = Daemon::configure("");
    std::fs::write(&d.config, "[server]\nlisten_addr = \"127.0.0.1:1\"\n").unwrap();
    let out = d.cli(&["serve"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("listen_addr") && err.contains("tally.toml"), "{err}");

    let d = Daemon::configure("");
    std::fs::write(&d.config, "[engine]\nworkers = 0\n").unwrap();
    let out = d.cli(&["serve"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("engine.workers"), "{}", text(&out.stderr));

    // An unknown time zone (issue #39): nothing starts, and the reason names the key.
    let d = Daemon::configure("[ui]\ntime_zone = \"Asia/Beijing\"\n");
    let out = d.cli(&["serve"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("ui.time_zone") && err.contains("Asia/Beijing") && err.contains("Asia/Shanghai"), "{err}");
}

#[test]
fn client_without_a_daemon_says_so() {
    let d = Daemon::configure(FAST_DEMO);
    let out = d.cli(&["list"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).starts_with("tally: "), "{}", text(&out.stderr));
    let usage = Command::new(EXE).args(["resolve", "x"]).output().unwrap();
    assert_eq!(usage.status.code(), Some(2));
}

/// `tally bench --quick --json` end to end (the sections that are quick in a debug build):
/// the JSON goes to stdout with the keys the benchmark issue names, the table to stderr, and
/// the numbers are what the sections measured, not placeholders.
#[test]
fn bench_quick_json_smoke() {
    let tmp = TempDir::new();
    let out = Command::new(EXE)
        .args(["bench", "--quick", "--json", "--only", "pickup,recovery,http", "--out"])
        .arg(tmp.path())
        .output()
        .expect("run tally bench");
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "tally bench failed:\n{stderr}");
    assert!(stderr.contains("2. pickup latency"), "the table goes to stderr:\n{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON object");
    assert_eq!(v["quick"], true);
    for key in ["e2e", "pickup_ms", "idle", "scale", "recovery_ms", "http_submit_per_s", "idle_rss_mb"] {
        assert!(v.get(key).is_some(), "missing top-level key {key}: {v}");
    }
    assert_eq!(v["e2e"].as_array().map(Vec::len), Some(0), "e2e was not selected");
    assert!(v["idle"].is_null() && v["scale"].is_null(), "unselected sections are null: {v}");
    let (p50, p99) = (v["pickup_ms"]["p50"].as_f64().unwrap_or(0.0), v["pickup_ms"]["p99"].as_f64().unwrap_or(0.0));
    assert!(p50 > 0.0 && p99 >= p50, "pickup p50 {p50} p99 {p99}");
    assert_eq!(v["pickup_ms"]["samples"], 100);
    assert!(v["recovery_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{v}");
    assert_eq!(v["recovery"]["requeued"], v["recovery"]["in_flight"], "every in-flight task re-queued");
    assert!(v["http_submit_per_s"].as_f64().is_some_and(|r| r > 0.0), "{v}");
    assert_eq!(v["http"]["errors"], 0, "{v}");
    assert!(v["idle_rss_mb"].as_f64().is_some_and(|mb| mb > 1.0), "{v}");
}

/// `tally bench --backend postgres --quick --json` against the test server: SQLite and
/// PostgreSQL (1 and 2 nodes) in one run, each e2e run made exactly one provider call per
/// task, every pickup series has its samples, two idle nodes end up running no statement, and the
/// benchmark's schemas are gone afterwards. Without a URL it says what it needs.
#[test]
fn bench_backend_postgres_measures_both_stores_in_one_run() {
    let no_url = Command::new(EXE)
        .args(["bench", "--backend", "postgres", "--quick"])
        .env_remove("TALLY_BENCH_POSTGRES_URL")
        .output()
        .expect("run tally bench");
    assert!(!no_url.status.success() && text(&no_url.stderr).contains("--postgres-url"), "{}", text(&no_url.stderr));
    let Some(url) = crate::conformance::fixtures::pg_url() else { return };
    let tmp = TempDir::new();
    let out = Command::new(EXE)
        .args(["bench", "--backend", "postgres", "--quick", "--json", "--postgres-url", &url, "--out"])
        .arg(tmp.path())
        .output()
        .expect("run tally bench");
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "tally bench failed:\n{stderr}");
    assert!(stderr.contains("beside SQLite, same run"), "the table goes to stderr:\n{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON object");
    let pg = &v["postgres"];
    let runs: Vec<(String, u64)> = pg["e2e"]
        .as_array()
        .expect("e2e runs")
        .iter()
        .map(|r| (r["store"].as_str().unwrap_or("").to_string(), r["nodes"].as_u64().unwrap_or(0)))
        .collect();
    assert_eq!(runs, [("sqlite".to_string(), 1), ("postgres".to_string(), 1), ("postgres".to_string(), 2)]);
    for r in pg["e2e"].as_array().into_iter().flatten() {
        assert_eq!(r["calls_per_task"], 1.0, "one provider call per task: {r}");
        assert!(r["tasks_per_s"].as_f64().is_some_and(|t| t > 0.0), "{r}");
        // Wake-ups heard from other nodes: none on SQLite, none for a lone node (its own
        // hints are not echoed back to it), some with two.
        let due = r["hints_per_task"]["due"].as_f64();
        match (r["store"].as_str(), r["nodes"].as_u64()) {
            (Some("sqlite"), _) => assert!(r["hints_per_task"].is_null(), "{r}"),
            (_, Some(1)) => assert_eq!(due, Some(0.0), "{r}"),
            _ => assert!(due.is_some_and(|d| d > 0.0), "{r}"),
        }
    }
    let paths: Vec<&str> = pg["pickup"].as_array().expect("pickup").iter().filter_map(|p| p["path"].as_str()).collect();
    assert_eq!(paths, ["same node", "same node", "other node"]);
    for p in pg["pickup"].as_array().into_iter().flatten() {
        assert_eq!(p["samples"], 50, "{p}");
        assert!(p["p99"].as_f64().unwrap_or(0.0) >= p["p50"].as_f64().unwrap_or(f64::MAX), "{p}");
    }
    // Both windows must be silent (no polling), under the parallel test run too: other tests'
    // nodes busy in other schemas of the same database once woke these idle nodes through the
    // shared channel names (thousands of statements per window; fixed by per-schema channels,
    // schema version 9: `conformance::pg::a_node_hears_no_wake_up_of_another_schema_…`).
    assert_eq!(pg["idle"]["sql_statements"], 0, "idle nodes ran SQL: {}", pg["idle"]);
    assert_eq!(pg["idle"]["second_window_sql_statements"], 0, "idle nodes kept running SQL: {}", pg["idle"]);
    let left = std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
        c.query_one("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'tally_bench_%'", &[])
            .expect("schemas")
            .get::<_, i64>(0)
    })
    .join()
    .expect("query thread");
    assert_eq!(left, 0, "the benchmark's schemas were left behind");
}

/// On PostgreSQL `tally backup` copies nothing itself: it says to use pg_dump, and how,
/// without showing the URL's password.
#[test]
fn backup_on_postgres_says_to_use_pg_dump_without_the_password() {
    let dir = TempDir::new();
    let cfg = dir.path().join("tally.toml");
    std::fs::write(
        &cfg,
        "[storage]\nbackend = \"postgres\"\npostgres_url = \"postgres://shop:s3cret@db.local:5432/tally\"\n[node]\nname = \"a\"\n",
    )
    .expect("config");
    let dest = dir.path().join("copy.dump");
    let out = Command::new(EXE).args(["backup", "--config"]).arg(&cfg).arg(&dest).output().expect("run");
    let err = text(&out.stderr);
    assert!(!out.status.success(), "nothing was backed up, so it must not say it was");
    assert!(err.contains("pg_dump --format=custom") && err.contains("pg_restore"), "{err}");
    assert!(err.contains("postgres://shop:***@db.local:5432/tally"), "{err}");
    assert!(!err.contains("s3cret"), "{err}");
    assert!(!dest.exists());
}

/// Output into a pipe that closed (`tally token | head -c0`, `tally list | head -1`) ends the
/// command quietly, like any Unix tool, instead of a panic ("failed printing to stdout").
#[test]
fn the_cli_panicked_when_its_output_pipe_closed() {
    let d = Daemon::start(FAST_DEMO);
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = std::process::Command::new(EXE)
        .args(["token", "--config"])
        .arg(&d.config)
        .env_remove("TALLY_DATA_DIR")
        .env_remove("TALLY_CONFIG")
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("run tally token");
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("panicked"), "tally panicked on a closed pipe: {stderr}");
    assert_ne!(out.status.code(), Some(101), "exit 101 is a panic: {stderr}");
}

#[test]
fn an_unknown_id_says_where_the_ids_are() {
    let d = Daemon::start(FAST_DEMO);
    let out = d.cli(&["status", "no-such-job"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("task not found; `tally list` shows the jobs' ids"), "{err}");
    let out = d.cli(&["set", "status", "no-such-set"]);
    let err = text(&out.stderr);
    assert!(err.contains("set not found; `tally set list` shows the sets' ids"), "{err}");
}
