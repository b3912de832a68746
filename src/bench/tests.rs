//! Unit tests of `tally bench`'s results: the JSON fields and the table.

use super::*;

fn sample() -> Results {
    Results {
        version: "0".into(),
        quick: true,
        machine: Machine { nproc: 2, cpu: "cpu".into(), kernel: "k".into(), fs: "/dev/x ext4".into() },
        e2e: vec![E2e {
            workers: 16,
            durability: "full".into(),
            tasks: 2000,
            tasks_per_s: 1.0,
            method: "sequential".into(),
            secs: 1.0,
            enqueue_per_s: 1.0,
            drain_per_s: Some(1.0),
            commits_per_task: 1.0,
            statements_per_task: 1.0,
            calls_per_task: 1.0,
            per_task: PerTask { statements: 1.0, commits: 1.0, fsync_waits: 2.0, submit_fsync_waits: 1.0, fsyncs: 0.5 },
            profile: None,
        }],
        pickup_ms: Some(Pickup {
            p50: 1.0,
            p99: 2.0,
            max: 3.0,
            samples: 100,
            submit_ms_p50: 0.1,
            submit_ms_p99: 0.2,
            store_noop_write_ms_p50: 0.05,
            store_one_row_commit_ms_p50: 0.4,
            profile: None,
        }),
        pickup_normal_ms: None,
        idle: Some(Idle {
            secs: 5.0,
            cpu_ms: 0.1,
            wakeups: 0.0,
            sql_statements: 0,
            raw_wakeups: 1.0,
            baseline_wakeups: 1.0,
            baseline_cpu_ms: 0.1,
            threads: vec![],
            second_window_cpu_ms: 0.1,
            second_window_wakeups: 0.0,
            second_window_sql_statements: 0,
        }),
        scale: Some(Scale {
            finished_rows: 100_000,
            submit_ms_p50: 1.0,
            pickup_ms_p50: 1.0,
            empty_submit_ms_p50: 1.0,
            empty_pickup_ms_p50: 1.0,
            pickup_ms_p99: 1.0,
            samples: 10,
            populate_secs: 1.0,
            rows_written: 800_000,
            db_mb: 1.0,
            engine_start_ms: 1.0,
            plans: vec![],
            db_bytes: 3_000_000_000,
            startup_s: 0.2,
            backup_ratio: 1.1,
            restore_ratio: 1.1,
            check_ratio: 1.2,
            render_ratio: 1.3,
            rss_mb: 40.0,
            set_wall_ratio: 1.05,
            file: Default::default(),
            set_wall: None,
            render: None,
        }),
        recovery_ms: Some(10.0),
        recovery: Some(Recovery { in_flight: 1000, recovery_ms: 10.0, requeued: 1000, setup_secs: 1.0, statements: 1 }),
        http_submit_per_s: None,
        http: None,
        idle_rss_mb: Some(10.0),
        images: None,
        fairness: None,
        listing: None,
        postgres: None,
        total_secs: 60.0,
    }
}

#[test]
fn json_has_the_required_keys() {
    let v = serde_json::to_value(sample()).expect("serialise");
    for key in ["e2e", "pickup_ms", "idle", "scale", "recovery_ms", "http_submit_per_s", "idle_rss_mb"] {
        assert!(v.get(key).is_some(), "missing top-level key {key}");
    }
    assert!(v["http_submit_per_s"].is_null());
    let e = &v["e2e"][0];
    for key in ["workers", "durability", "tasks", "tasks_per_s", "method"] {
        assert!(e.get(key).is_some(), "missing e2e key {key}");
    }
    for key in ["statements", "commits", "fsync_waits"] {
        assert!(e["per_task"].get(key).is_some(), "missing e2e per_task key {key}");
    }
    for key in ["p50", "p99"] {
        assert!(v["pickup_ms"].get(key).is_some(), "missing pickup_ms key {key}");
    }
    for key in ["secs", "cpu_ms", "wakeups", "sql_statements"] {
        assert!(v["idle"].get(key).is_some(), "missing idle key {key}");
    }
    for key in [
        "finished_rows",
        "submit_ms_p50",
        "pickup_ms_p50",
        "empty_submit_ms_p50",
        "empty_pickup_ms_p50",
        // The file part's figures, named by issue #41.
        "db_bytes",
        "startup_s",
        "backup_ratio",
        "restore_ratio",
        "check_ratio",
        "render_ratio",
        "rss_mb",
        "set_wall_ratio",
    ] {
        assert!(v["scale"].get(key).is_some(), "missing scale key {key}");
    }
}

#[test]
fn quick_sizes_are_smaller() {
    let (q, f) = (Sizes::new(true), Sizes::new(false));
    assert!(q.e2e_tasks < f.e2e_tasks && q.scale_rows < f.scale_rows && q.recovery_tasks < f.recovery_tasks);
    assert_eq!((f.e2e_tasks, f.scale_rows, f.recovery_tasks), (20_000, 1_000_000, 10_000));
}

#[test]
fn table_renders_without_http() {
    let t = render_table(&sample());
    assert!(t.contains("not measured"));
}
