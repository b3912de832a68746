//! What `tally check` asks of every backend and reports: the task invariants (the same SQL on
//! SQLite and PostgreSQL) and [`CheckReport`]. Each backend's check runs them: SQLite's by file
//! (`store::sqlite::whole`), PostgreSQL's over a connection (`store::postgres::check`).

/// The invariants of tasks, envelopes and executions that `tally check` asks of every backend:
/// (what is wrong, a query listing the ids it is wrong for). The SQL is the same on SQLite and
/// PostgreSQL; each backend adds its own checks of stored images (and SQLite the charge rule
/// that PostgreSQL enforces with a `CHECK` constraint).
pub(crate) const TASK_INVARIANTS: &[(&str, &str)] = &[
    (
        "succeeded task without an artifact (or, for a `draft`, a valid answer)",
        "SELECT id FROM tasks t WHERE status = 'succeeded' AND NOT EXISTS (SELECT 1 FROM artifacts a WHERE a.task_id = t.id)
           AND NOT EXISTS (SELECT 1 FROM answers w WHERE w.task_id = t.id AND w.valid)",
    ),
    // A running execution's envelope is leased, or waiting to be handed over again
    // (`pending`), or handed over and not yet claimed (`sent` without a lease: recovery
    // resumes it from the execution's phase). Anything else strands the execution.
    (
        "running execution whose envelope is not live",
        "SELECT x.token FROM executions x WHERE x.status = 'running' AND NOT EXISTS
           (SELECT 1 FROM envelopes e WHERE e.task_id = x.task_id AND e.status IN ('pending', 'sent'))",
    ),
    (
        "envelope consumed for a task that is still queued or waiting",
        "SELECT e.id FROM envelopes e JOIN tasks t ON t.id = e.task_id WHERE e.status = 'consumed' AND t.status IN ('queued', 'waiting', 'running')",
    ),
    (
        "settled task whose envelope is still live",
        "SELECT t.id FROM tasks t JOIN envelopes e ON e.task_id = t.id WHERE t.status IN ('succeeded', 'failed', 'unknown', 'canceled') AND e.status IN ('pending', 'sent')",
    ),
    (
        "task without an envelope",
        "SELECT id FROM tasks t WHERE NOT EXISTS (SELECT 1 FROM envelopes e WHERE e.task_id = t.id)",
    ),
    (
        "task with more than one running execution",
        "SELECT task_id FROM executions WHERE status = 'running' GROUP BY task_id HAVING count(*) > 1",
    ),
    (
        "unknown task without an unknown execution",
        "SELECT id FROM tasks t WHERE status = 'unknown' AND NOT EXISTS (SELECT 1 FROM executions x WHERE x.task_id = t.id AND x.status = 'unknown')",
    ),
];

/// What `tally check` found.
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct CheckReport {
    /// Everything that did not hold (empty when healthy).
    pub problems: Vec<String>,
    /// Images of an older data dir still in their files, waiting for the start-up migration
    /// to move them in (`store::sqlite::migrate`): not damage, but the database does not hold them.
    pub unmoved: Vec<String>,
    /// Generated images verified against their sha256.
    pub artifacts: u64,
    /// Uploaded reference photos verified against their sha256.
    pub uploads: u64,
    pub tasks: u64,
}

impl CheckReport {
    /// One line for a person: what was verified.
    pub fn summary(&self) -> String {
        format!(
            "{} task(s); {} image(s) verified against their sha256 ({} generated, {} uploaded)",
            self.tasks,
            self.artifacts + self.uploads,
            self.artifacts,
            self.uploads
        )
    }
}
