//! tally: runs paid, slow, external jobs (AI image generation first) and never lets a retry
//! spend money twice without the user knowing.
//!
//! Layout (see ARCHITECTURE.md for the room guide and the invariants), from the bottom up —
//! each module may use the ones above it, never the ones below (`scripts/check-module-cycles.py`).
//! The rooms up to [`mock`] are the crate `tally-base` (root `src/base.rs`), compiled apart so
//! that an adapter's edit–test loop does not rebuild the rest; this crate re-exports them under
//! the same names:
//! - [`domain`]: the vocabulary (statuses, phases, plain words, the recovery decision table).
//!   Pure.
//! - [`clock`] (the one way to read time), [`failpoint`] (crash points), [`metrics`],
//!   [`render`] (placeholder PNGs for the demo and mock providers), [`stages`] (per-stage
//!   timings for `tally bench --profile`, one atomic load when off), [`pixels`] (the memory
//!   budget every image decode takes a ticket from; ARCHITECTURE.md "Memory").
//! - [`delivery`]: listing-ready files from chosen images (profiles) and where they go
//!   (targets). Local work only.
//! - [`providers`]: the provider trait, its capabilities, and the adapters (each kind's
//!   descriptor, which the config checks against).
//! - [`mock`]: the mock provider server (`tally mock-provider`) and its ledger.
//!
//! This crate's own rooms:
//! - [`config`]: raw TOML → resolved, validated configuration.
//! - [`store`]: every SQL statement; [`store::Store`] is the seam, each operation written once
//!   over [`store::tx::Tx`] for SQLite and PostgreSQL.
//! - [`engine`]: intake, dispatcher, workers, reconciler: when each step happens.
//! - [`server`]: the HTTP listener with its connection cap and header and body deadlines.
//! - [`api`]: the HTTP API (with the browser sessions and the event stream); [`web`]: the page;
//!   [`app`]: `tally serve` wiring and exit codes.
//! - [`bench`]: `tally bench`, the end-to-end benchmark; [`cli`]: the command line and its
//!   HTTP client.

// No `unwrap` or `expect` outside tests (checked by clippy in CI): input from users, files and the
// network gets a clear error instead; an invariant the code relies on says why where it holds.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
// Every public item says what it is for (CI's clippy turns the warning into an error). The
// structs and enums marked `#[allow(missing_docs)]` predate the lint: their own doc says what
// they are, their fields and variants are named by the JSON or the columns they carry.
#![warn(missing_docs)]

pub use tally_base::{clock, delivery, domain, failpoint, metrics, mock, pixels, providers, render, stages};

pub mod api;
pub mod app;
pub mod bench;
pub mod cli;
pub mod config;
pub mod engine;
pub mod server;
pub mod store;
pub mod web;
