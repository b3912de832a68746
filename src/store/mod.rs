//! The store: every SQL statement of tally lives below this module.
//!
//! Rooms: `ops/` holds each store operation written once over [`tx::Tx`]; `sqlite/` the SQLite
//! backend (writer thread and group commit, open and migrations, the lineage sidecar, file
//! check/backup/restore); `postgres/` the PostgreSQL backend (connection threads, node lock and
//! watcher, migrations, check); `seam.rs` the [`Store`] the engine holds, which runs each
//! operation on either. Shared vocabulary: [`error`] ([`StoreError`]), [`check`] (what `tally
//! check` asks of every backend), [`tx`], and the operations' own types (`ops`, `read`, `sets`,
//! `choice`, `spend`; `types` for the operations' arguments and outcomes). Invariant: neither backend folder imports from the other
//! (`scripts/check-module-cycles.py` checks it).

mod blobs;
pub mod check;
mod choice;
mod error;
pub mod held;
pub mod locks;
mod ops;
pub mod postgres;
mod prune;
mod read;
mod seam;
mod set_edit;
mod sets;
pub mod settings;
pub mod spend;
pub mod sqlite;
pub mod tx;
mod types;

pub use blobs::*;
pub use check::CheckReport;
pub use choice::{
    AddOutcome, CandidateOp, ChoiceOutcome, MAX_CANDIDATES, MAX_SHOT_CANDIDATES, SetEventView, delivery_blocking,
    role_label, shot_label,
};
pub use error::{Severity, StoreError};
pub use ops::deliveries::{
    CreateOutcome as DeliveryCreateOutcome, DeliveryItemView, DeliveryState, DeliveryView, FileFacts, ItemOutcome,
    ItemState, NewDelivery, NewDeliveryItem, RetryDeliveryOutcome,
};
pub use ops::*;
pub use prune::PruneReport;
pub use read::*;
pub use seam::Store;
pub use set_edit::{DeleteOutcome, EditOutcome, SetBlock, SetEdit, ShotEdit, StartOutcome};
pub use sets::*;
pub use sqlite::SqliteStore;
pub use sqlite::open::{SCHEMA_VERSION, WAL_SIZE_LIMIT};
pub use sqlite::startup::{UsedEvidence, open_for_serve};
pub use sqlite::whole::{BackupReport, CheckDepth, RestoreReport, backup, check, check_with, kept_name, restore};

/// What an operation needs from its commit before its caller is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// On disk (with `durability = "full"`): a promise to a user, or the record that must
    /// precede a paid call, depends on it — submits, `calling`, accepted job ids, outcomes,
    /// recovery decisions, user actions.
    Durable,
    /// Committed and ordered before every later durable commit, but not fsynced on its own:
    /// bookkeeping whose loss in a power failure recovery already handles, because it only
    /// records that nothing has been sent yet — dispatch marks, claims, heartbeats, busy
    /// releases. A process crash loses none of it (the WAL is written before the answer). A
    /// power loss can take back only such writes with no durable one after them: SQLite's WAL
    /// frames are valid only in order (each checksum chains to the one before), so the database
    /// is left as after some commit at or after the last durable one — the state a process
    /// crash right after that commit leaves, which the crash matrix covers.
    Ordered,
}
