//! The store's errors, shared by both backends and every operation, and what a background
//! service should do about each ([`Severity`]).

use std::path::PathBuf;

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs)]
pub enum StoreError {
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("PostgreSQL error: {0}")]
    Postgres(#[from] postgres::Error),
    #[error("{path} is not a tally database: {reason}")]
    NotTally { path: PathBuf, reason: String },
    #[error(
        "{path} has schema version {found}, newer than this build of tally understands ({supported}); use a newer tally"
    )]
    TooNew { path: PathBuf, found: i64, supported: i64 },
    #[error("SQLite did not accept the setting {pragma} (wanted {wanted}, got {got})")]
    Pragma { pragma: &'static str, wanted: String, got: String },
    /// The transaction holding the operation failed to commit; `code` keeps SQLite's
    /// error code, so callers can tell a full disk from a corrupt file.
    #[error("the commit failed: {message}")]
    Commit { message: String, code: Option<rusqlite::ErrorCode> },
    /// The request names something that does not exist or is malformed.
    #[error("{0}")]
    Invalid(String),
    /// The writer lost its right to write (its lease or execution token no longer holds).
    #[error("fenced: this worker no longer owns the task")]
    Fenced,
    #[error("the store is closed")]
    Closed,
    /// PostgreSQL: this node cannot reach the database now (it fenced itself); the
    /// operation was not run, or, if it was already running, may still commit once the
    /// network heals. Try again (another node may answer meanwhile).
    #[error("this node cannot reach its PostgreSQL database now ({0}); try again")]
    Unreachable(String),
    /// The database must not be opened for serving: empty where the data directory shows it
    /// was used, read-only, or failing its check. `reason` says what to do.
    #[error("{path}: {reason}")]
    Unusable { path: PathBuf, reason: String },
    /// A stored image's bytes do not match their recorded size or sha256 (a damaged page, a
    /// bad disk, an edit by hand). Not a passing problem: reading it again gives the same
    /// bytes. The API answers it as `image_damaged`; `tally check` lists every such image.
    #[error("stored image {id} is damaged: {why}; `tally check` lists every damaged image")]
    Damaged { id: String, why: String },
    /// An image that was there when its read began is no longer stored (pruned or deleted
    /// meanwhile): for a download, a plain 404, not a store failure.
    #[error("image {id} is no longer stored")]
    Gone { id: String },
    /// An fsync failed (SQLite: the flusher's of the WAL, or one inside a commit or a
    /// checkpoint). Never retried: the store stopped for good, and only a restart, which
    /// recovers from what reached the disk, serves again (`store::sqlite::flush`).
    #[error(
        "the disk failed to save data: fsync of {what} failed: {error}; tally stopped writing to avoid losing data \
         — check the disk, then restart"
    )]
    DiskFailed { what: String, error: String },
    #[error("{0}")]
    Fatal(String),
}

/// What a background service should do about a store error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// Worth trying again soon: busy, or a conflict a retry resolves.
    Transient,
    /// The disk is full or failing: back off and try again later (reads may still work, and
    /// the condition may clear). Logged once, not on every try.
    Resource,
    /// The database cannot be written or trusted (read-only, corrupt, not tally's): retrying
    /// will not help; the daemon stops cleanly and says why.
    Fatal,
    /// The store was closed: the daemon is stopping.
    Closed,
}

impl StoreError {
    /// SQLite's error code, when SQLite produced the error (directly or at commit).
    pub fn code(&self) -> Option<rusqlite::ErrorCode> {
        match self {
            StoreError::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => Some(e.code),
            StoreError::Commit { code, .. } => *code,
            _ => None,
        }
    }

    /// How serious the error is for a service that hit it (see [`Severity`]).
    pub fn severity(&self) -> Severity {
        use rusqlite::ErrorCode::*;
        match self {
            StoreError::Closed => Severity::Closed,
            // Retrying will not help; the one service that reads images (a worker sending
            // reference photos) turns it into the task's error, not into a stop.
            StoreError::Fatal(_)
            | StoreError::DiskFailed { .. }
            | StoreError::Damaged { .. }
            | StoreError::NotTally { .. }
            | StoreError::TooNew { .. }
            | StoreError::Pragma { .. }
            | StoreError::Unusable { .. } => Severity::Fatal,
            StoreError::Postgres(e) => {
                use postgres::error::SqlState as S;
                match e.code() {
                    Some(c) if [S::DISK_FULL, S::IO_ERROR, S::OUT_OF_MEMORY].contains(c) => Severity::Resource,
                    Some(c)
                        if [S::DATA_CORRUPTED, S::READ_ONLY_SQL_TRANSACTION, S::INSUFFICIENT_PRIVILEGE].contains(c) =>
                    {
                        Severity::Fatal
                    }
                    _ => Severity::Transient,
                }
            }
            _ => match self.code() {
                Some(DiskFull | SystemIoFailure) => Severity::Resource,
                Some(DatabaseCorrupt | ReadOnly | NotADatabase | CannotOpen) => Severity::Fatal,
                _ => Severity::Transient,
            },
        }
    }

    /// Read-only, corrupt, not a tally database: retrying will not help; stop cleanly.
    pub fn is_fatal(&self) -> bool {
        self.severity() == Severity::Fatal
    }

    /// The same error, as the commit failure every operation of a failed batch reports.
    pub(crate) fn as_commit_failure(&self) -> StoreError {
        if let StoreError::DiskFailed { what, error } = self {
            return StoreError::DiskFailed { what: what.clone(), error: error.clone() };
        }
        StoreError::Commit { message: self.to_string(), code: self.code() }
    }
}
