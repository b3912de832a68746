//! The keys of tally's PostgreSQL advisory locks, in a neutral room: the PostgreSQL backend
//! (`store::postgres`) takes the migration and node locks, and the operations written once
//! (`store::spend`'s budget lock) take theirs through [`crate::store::tx::Tx`] where
//! transactions run side by side. Nothing on SQLite, whose single writer needs no lock.

/// The advisory-lock class of tally's locks ("taly"): the first key of the two-key form, so
/// tally's keys never clash with another application's single-key locks.
pub const LOCK_CLASS: i32 = 0x7461_6c79;

/// The second key of the budget lock (the first is [`LOCK_CLASS`]; key 0 is the migration
/// lock, 1 the capped dispatch).
pub const BUDGET_KEY: i32 = 2;
