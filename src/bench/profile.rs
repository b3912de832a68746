//! `tally bench --profile`: the per-stage timings of each end-to-end run (`crate::stages`),
//! per task, as a table and in the JSON (`e2e[].profile`, `postgres.e2e[].profile`).
//!
//! A run's profile is the process-wide stage sums taken from just before its first submit to
//! just after its last task succeeded, divided by its tasks. With several nodes or workers the
//! stages overlap in time, so a per-task figure is the time spent, not the time waited for:
//! 16 workers each spending 1 ms in `calling` cost 1 ms per task although they ran together.

use serde::Serialize;

use crate::stages;

/// One stage's share of a run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StageRow {
    /// The stage (`crate::stages::Stage::name`).
    pub stage: &'static str,
    /// What it runs inside, if anything (rows do not add up: nested stages are inside others).
    pub within: Option<&'static str>,
    /// How many times it ran per task.
    pub calls_per_task: f64,
    /// Its time per task, in microseconds.
    pub us_per_task: f64,
    /// Its time per occurrence, in microseconds.
    pub us_per_call: f64,
}

/// The stage profile of one run.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[allow(missing_docs)]
pub struct Profile {
    pub tasks: u64,
    pub stages: Vec<StageRow>,
}

/// Start a run's profile (forget earlier timings), when profiling.
pub(super) fn begin() {
    if stages::enabled() {
        stages::reset();
    }
}

/// The profile of the run that [`begin`] started, over `tasks` tasks (`None` when not
/// profiling).
pub(super) fn end(tasks: u64) -> Option<Profile> {
    if !stages::enabled() {
        return None;
    }
    Some(of(&stages::snapshot(), tasks))
}

/// A profile from stage sums over `tasks` tasks.
fn of(sums: &[stages::StageTime], tasks: u64) -> Profile {
    let n = tasks.max(1) as f64;
    let stages = sums
        .iter()
        .map(|s| StageRow {
            stage: s.stage,
            within: s.within,
            calls_per_task: s.count as f64 / n,
            us_per_task: s.total_us / n,
            us_per_call: if s.count == 0 { 0.0 } else { s.total_us / s.count as f64 },
        })
        .collect();
    Profile { tasks, stages }
}

/// The profile as an indented table under its run's line.
pub(super) fn render(t: &mut String, title: &str, p: &Profile) {
    use std::fmt::Write as _;
    let _ = writeln!(t, "   profile of {title} ({} tasks):", p.tasks);
    let _ = writeln!(t, "   {:<30} {:>8} {:>10} {:>10}  within", "stage", "calls/t", "µs/task", "µs/call");
    for r in &p.stages {
        if r.calls_per_task == 0.0 {
            continue;
        }
        let _ = writeln!(
            t,
            "   {:<30} {:>8.2} {:>10.1} {:>10.1}  {}",
            r.stage,
            r.calls_per_task,
            r.us_per_task,
            r.us_per_call,
            r.within.unwrap_or("")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Per task and per call are the sums divided by the tasks and the occurrences; a stage
    /// that never ran renders no row.
    #[test]
    fn a_profile_divides_by_tasks_and_calls() {
        let sums = vec![
            stages::StageTime { stage: "a", within: None, count: 20, total_us: 1000.0 },
            stages::StageTime { stage: "b", within: Some("a"), count: 0, total_us: 0.0 },
        ];
        let p = of(&sums, 10);
        assert_eq!(p.stages[0].calls_per_task, 2.0);
        assert_eq!(p.stages[0].us_per_task, 100.0);
        assert_eq!(p.stages[0].us_per_call, 50.0);
        let mut t = String::new();
        render(&mut t, "run", &p);
        assert!(t.contains("a ") && !t.contains("\n   b "), "{t}");
    }
}
