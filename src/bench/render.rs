//! The table `tally bench` prints (without `--json`): one block per section, in plain figures.

use super::{Results, images};

/// The human-readable table of one run.
pub(super) fn render_table(r: &Results) -> String {
    use std::fmt::Write as _;
    let mut t = String::new();
    let m = &r.machine;
    let _ = writeln!(
        t,
        "tally bench {} ({}), {} CPUs, {}, {}, kernel {}",
        r.version,
        if r.quick { "quick" } else { "full" },
        m.nproc,
        m.cpu,
        m.fs,
        m.kernel
    );
    if let Some(pg) = &r.postgres {
        super::pg::render(&mut t, pg);
        let _ = writeln!(t, "\ntotal {:.1} s", r.total_secs);
        return t;
    }
    let _ = writeln!(t, "\n1. end-to-end throughput (submit → succeeded), instant provider");
    let _ = writeln!(
        t,
        "{:<11} {:>7} {:>10} {:>7} {:>10} {:>10} {:>10} {:>9} {:>9} {:>7} {:>9} {:>8}",
        "method",
        "workers",
        "durability",
        "tasks",
        "tasks/s",
        "enqueue/s",
        "drain/s",
        "commits/t",
        "stmts/t",
        "calls/t",
        "fsyncwt/t",
        "fsyncs/t"
    );
    for e in &r.e2e {
        let drain = e.drain_per_s.map(|d| format!("{d:.0}")).unwrap_or_else(|| "-".into());
        let _ = writeln!(
            t,
            "{:<11} {:>7} {:>10} {:>7} {:>10.0} {:>10.0} {:>10} {:>9.2} {:>9.1} {:>7.2} {:>9.2} {:>8.2}",
            e.method,
            e.workers,
            e.durability,
            e.tasks,
            e.tasks_per_s,
            e.enqueue_per_s,
            drain,
            e.commits_per_task,
            e.statements_per_task,
            e.calls_per_task,
            e.per_task.fsync_waits,
            e.per_task.fsyncs
        );
    }
    let _ = writeln!(
        t,
        "   sequential = the peers' method: awaited one-at-a-time enqueue, then drain; e2e = N/(enqueue+drain)"
    );
    let _ =
        writeln!(t, "   concurrent = 16 submitters while the workers drain; e2e = N / (first submit → last succeeded)");
    for e in &r.e2e {
        if let Some(p) = &e.profile {
            let title = format!("{} {} workers {}", e.method, e.workers, e.durability);
            super::profile::render(&mut t, &title, p);
        }
    }
    if let Some(p) = &r.pickup_ms {
        let _ = writeln!(
            t,
            "\n2. pickup latency (idle engine, 1 worker, {} tasks, 5-105 ms gaps): p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms; submit call p50 {:.3} ms",
            p.samples, p.p50, p.p99, p.max, p.submit_ms_p50
        );
        let _ = writeln!(
            t,
            "   store probe (idle): empty write op p50 {:.3} ms (thread round trip, no fsync), one-row UPDATE commit p50 {:.3} ms",
            p.store_noop_write_ms_p50, p.store_one_row_commit_ms_p50
        );
        if let Some(prof) = &p.profile {
            super::profile::render(&mut t, "pickup, durability full", prof);
        }
    }
    if let Some(p) = &r.pickup_normal_ms {
        let _ = writeln!(
            t,
            "   with durability = \"normal\": p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms; submit call p50 {:.3} ms",
            p.p50, p.p99, p.max, p.submit_ms_p50
        );
        if let Some(prof) = &p.profile {
            super::profile::render(&mut t, "pickup, durability normal", prof);
        }
    }
    if let Some(i) = &r.idle {
        let _ = writeln!(
            t,
            "\n3. idle ({:.1} s): CPU {:.2} ms, wake-ups {:.0} ({:.2} per 10 s; raw {:.0} minus baseline {:.0}), SQL statements {}",
            i.secs,
            i.cpu_ms,
            i.wakeups,
            i.wakeups / i.secs * 10.0,
            i.raw_wakeups,
            i.baseline_wakeups,
            i.sql_statements
        );
        let _ = writeln!(
            t,
            "   baseline (runtime only) CPU {:.2} ms; threads active in the idle window: {}",
            i.baseline_cpu_ms,
            if i.threads.is_empty() { "none".to_string() } else { i.threads.join(", ") }
        );
        let _ = writeln!(
            t,
            "   second window right after: CPU {:.2} ms, wake-ups {:.0} (minus baseline), SQL statements {}",
            i.second_window_cpu_ms, i.second_window_wakeups, i.second_window_sql_statements
        );
    }
    if let Some(s) = &r.scale {
        let _ = writeln!(
            t,
            "\n4. scale ({} finished tasks, {:.0} MB, populated in {:.1} s): submit p50 {:.3} ms (empty {:.3}, ×{:.2}), pickup p50 {:.3} ms (empty {:.3}, ×{:.2}), engine start {:.1} ms",
            s.finished_rows,
            s.db_mb,
            s.populate_secs,
            s.submit_ms_p50,
            s.empty_submit_ms_p50,
            s.submit_ms_p50 / s.empty_submit_ms_p50,
            s.pickup_ms_p50,
            s.empty_pickup_ms_p50,
            s.pickup_ms_p50 / s.empty_pickup_ms_p50,
            s.engine_start_ms
        );
        for plan in &s.plans {
            let _ = writeln!(t, "   plan {plan}");
        }
        let f = &s.file;
        let _ = writeln!(
            t,
            "   file: {:.2} GB ({} images, {} sets, populated in {:.0} s; cold cache by {})",
            f.db_bytes as f64 / 1e9,
            f.images,
            f.sets,
            f.populate_s,
            f.cold_cache
        );
        let _ = writeln!(
            t,
            "   start-up to /healthz {:.2} s (runs {:?}; empty file {:.2} s; reading the file {:.1} s)",
            f.startup_s, f.startup_runs_s, f.startup_empty_s, f.read_file_s
        );
        for (name, p) in [("backup", &f.backup), ("restore", &f.restore), ("check", &f.check)] {
            let _ = writeln!(
                t,
                "   {name:<8} ×{:.2} of {} (tally {:?} s, reference {:?} s)",
                p.ratio, p.reference, p.tally_s, p.reference_s
            );
            if let Some(b) = p.before_copy_s {
                let _ = writeln!(t, "            before #41 the copy step alone (VACUUM INTO + fsync) took {b:.2} s");
            }
            for (round, steps) in p.phases.iter().enumerate() {
                let steps: Vec<String> = steps.iter().map(|(n, s)| format!("{n} {s:.2}")).collect();
                let _ = writeln!(t, "            round {}: {}", round + 1, steps.join(", "));
            }
        }
        let _ = writeln!(
            t,
            "   RSS {:.0} MB idle, {:.0} MB after {} history pages, {} sets and {} thumbnails; render ×{:.2}; set wall ×{:.2}",
            f.rss_idle_mb, f.rss_mb, f.history_pages, f.sets_opened, f.thumbnails, s.render_ratio, s.set_wall_ratio
        );
    }
    if let Some(rc) = &r.recovery {
        let _ = writeln!(
            t,
            "\n5. restart recovery: {} tasks in phase calling → re-queued in {:.1} ms ({} statements; setup {:.1} s)",
            rc.in_flight, rc.recovery_ms, rc.statements, rc.setup_secs
        );
    }
    match &r.http {
        Some(h) => {
            let _ = writeln!(
                t,
                "\n6. HTTP submit: {:.0} req/s over {} connections ({} ok, {} errors{})",
                h.submits_per_s,
                h.connections,
                h.ok,
                h.errors,
                h.first_error.as_ref().map(|e| format!("; first: {e}")).unwrap_or_default()
            );
        }
        None => {
            let _ = writeln!(t, "\n6. HTTP submit: not measured (no server; pass --http URL --token T)");
        }
    }
    let _ = writeln!(
        t,
        "   idle RSS: {}",
        r.idle_rss_mb.map(|m| format!("{m:.1} MB")).unwrap_or_else(|| "unavailable".into())
    );
    if let Some(im) = &r.images {
        render_images(&mut t, im);
    }
    if let Some(l) = &r.listing {
        let _ = writeln!(
            t,
            "\nlisting images from {} px sources, against a plain resize (issue #37; bar 2x): worst {:.2}x",
            super::listing::SIDE,
            l.ratio
        );
        for p in &l.per_profile {
            let _ = writeln!(
                t,
                "   {}: tally {:.3} s, plain {:.3} s, {:.2}x",
                p.profile, p.tally_s, p.reference_s, p.ratio
            );
        }
    }
    if let Some(f) = &r.fairness {
        let _ = writeln!(
            t,
            "\n8. fairness ({} recovered tasks, {} slots, S = {} ms ± 50 %, fresh at {:.0}/s): fresh pickup p50 {:.1} ms, \
             p95 {:.1} ms, p99 {:.1} ms ({} tasks); recovery share while both lanes waited {:.2}; drained in {:.0} ms",
            f.backlog,
            f.slots,
            f.service_ms,
            f.fresh_per_s,
            f.fresh_pickup_ms.p50,
            f.fresh_pickup_ms.p95,
            f.fresh_pickup_ms.p99,
            f.fresh_pickup_ms.samples,
            f.recovery_share,
            f.drain_ms
        );
        let _ = writeln!(
            t,
            "   FIFO baseline: fresh pickup p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms; recovery share {:.2}; drained in {:.0} ms",
            f.fifo_fresh_pickup_ms.p50,
            f.fifo_fresh_pickup_ms.p95,
            f.fifo_fresh_pickup_ms.p99,
            f.fifo_recovery_share,
            f.fifo_drain_ms
        );
    }
    let _ = writeln!(t, "\ntotal {:.1} s", r.total_secs);
    t
}

fn render_images(t: &mut String, im: &images::Images) {
    use std::fmt::Write as _;
    let _ = writeln!(t, "\n7. images in the database (large image {:.2} MB)", im.image_bytes as f64 / 1e6);
    for e in &im.e2e {
        let _ = writeln!(
            t,
            "   e2e {:<10} {} tasks, 16 workers, {}: {:.0} tasks/s ({:.2} commits/task)",
            e.method, e.tasks, e.durability, e.tasks_per_s, e.commits_per_task
        );
    }
    if !im.physical_per_s.is_empty() {
        let each: Vec<String> = im.physical_per_s.iter().map(|v| format!("{v:.0}")).collect();
        let _ = writeln!(
            t,
            "   physical limit (16 threads writing the large image to files and fsyncing each): {} files/s (before · after)",
            each.join(" · ")
        );
    }
    if let Some(s) = &im.storage {
        let _ = writeln!(
            t,
            "   after {} large images: WAL peak {:.1} MB, at the end {:.1} MB; tally.db {:.0} MB after a clean stop",
            s.images, s.wal_peak_mb, s.wal_end_mb, s.db_mb
        );
        let _ = writeln!(
            t,
            "   prune of the older half: {} tasks in {:.1} s, {:.0} MB given back; WAL {:.1} MB; tally.db {:.0} MB after a clean stop",
            s.pruned, s.prune_secs, s.freed_mb, s.wal_after_prune_mb, s.db_after_prune_mb
        );
    }
    if let Some(d) = &im.download {
        let rss = |v: Option<f64>| v.map(|m| format!("{m:.1} MB")).unwrap_or_else(|| "?".into());
        let _ = writeln!(
            t,
            "   downloads: {} clients, {:.1} s, {} images of {:.2} MB ({} errors): {:.0} MB/s; daemon RSS idle {}, peak {}",
            d.clients,
            d.secs,
            d.requests,
            d.image_mb,
            d.errors,
            d.mb_per_s,
            rss(d.idle_rss_mb),
            rss(d.peak_rss_mb)
        );
        if let Some(s) = d.startup_secs {
            let _ = writeln!(
                t,
                "   tally serve on that database listened after {s:.1} s (its start-up check reads the whole database)"
            );
        }
    }
    if let Some(b) = &im.backup {
        let _ = writeln!(
            t,
            "   tally backup of {:.0} MB: {:.2} s idle, {:.2} s while 2 clients submitted ({} tasks)",
            b.db_mb, b.idle_secs, b.under_load_secs, b.submitted_during
        );
    }
}
