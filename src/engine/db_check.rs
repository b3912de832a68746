//! The database check `tally serve` runs in the background once it serves (issue #41): on
//! SQLite, the part of `tally check` whose cost grows with the images stored
//! (`store::CheckDepth::Background`: every page, every image row). Start-up checks the rest
//! before it serves anything (`store::CheckDepth::Serve`). The result is in `/healthz` and the
//! page; a failure stops the daemon exactly as a database found damaged at start-up used to
//! be refused, with the same advice (restore from a backup).

use serde::Serialize;

use super::Engine;
use crate::domain::Millis;

/// Where the background check is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum DbCheckState {
    /// Not run by this daemon (PostgreSQL checks its own pages; `tally check` checks tally's).
    NotRun,
    Running,
    Passed,
    /// It found problems; the daemon is stopping.
    Failed,
}

/// The background check's state, as `/healthz` reports it under `check`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[allow(missing_docs)]
pub struct DbCheck {
    pub state: DbCheckState,
    /// When it started and finished (ms since the epoch).
    pub started_at: Option<Millis>,
    pub finished_at: Option<Millis>,
    /// The first problems found (at most five; `tally check` lists them all).
    pub problems: Vec<String>,
}

impl Default for DbCheck {
    fn default() -> Self {
        DbCheck { state: DbCheckState::NotRun, started_at: None, finished_at: None, problems: Vec::new() }
    }
}

impl Engine {
    /// Check the rest of the SQLite database `db` in the background once serving: what the
    /// start-up guard left out because its cost grows with the images stored. On its own
    /// read-only connection and thread, so nothing waits for it; a failure stops the daemon.
    pub fn spawn_db_check(self: &std::sync::Arc<Self>, db: std::path::PathBuf) {
        self.db_check_started();
        let engine = self.clone();
        let spawned = std::thread::Builder::new().name("tally-db-check".into()).spawn(move || {
            let problems = match crate::store::check_with(&db, crate::store::CheckDepth::Background) {
                Ok(report) => report.problems,
                Err(e) => vec![e.to_string()],
            };
            if problems.is_empty() {
                tracing::info!("the database passed its background check");
            } else {
                tracing::error!(problems = problems.len(), first = %problems[0], "the database failed its background check");
            }
            engine.db_check_finished(problems);
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the background database check; `tally check` runs it by hand");
        }
    }

    /// The background database check's state.
    pub fn db_check(&self) -> DbCheck {
        self.shared.db_check.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The background check started now.
    pub fn db_check_started(&self) {
        let now = self.shared.now();
        *self.shared.db_check.lock().unwrap_or_else(|e| e.into_inner()) =
            DbCheck { state: DbCheckState::Running, started_at: Some(now), finished_at: None, problems: Vec::new() };
    }

    /// The background check ended with `problems` (empty: passed). Any problem stops the
    /// daemon ([`Engine::failure`]) with what to do, as the start-up guard's refusal says it.
    pub fn db_check_finished(&self, problems: Vec<String>) {
        let now = self.shared.now();
        let failed = !problems.is_empty();
        {
            let mut c = self.shared.db_check.lock().unwrap_or_else(|e| e.into_inner());
            c.state = if failed { DbCheckState::Failed } else { DbCheckState::Passed };
            c.finished_at = Some(now);
            c.problems = problems.iter().take(5).cloned().collect();
        }
        if failed {
            let more = problems.len().saturating_sub(5);
            let more =
                if more > 0 { format!(" (and {more} more; `tally check` lists them all)") } else { String::new() };
            self.shared.give_up(format!(
                "the database failed the check tally runs after start-up: {}{more}. Restore it from a backup (a copy \
                 made by `tally backup`): stop tally, copy the backup over the database, delete any -wal and -shm \
                 beside it, and start again",
                problems.iter().take(5).cloned().collect::<Vec<_>>().join("; ")
            ));
        }
    }
}
