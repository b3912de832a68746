//! tally-base: the bottom rooms of tally, the ones that need no configuration and no store,
//! compiled as a crate of their own (`crates/tally-base`) so that changing a provider adapter
//! rebuilds this crate and its adapter tests, not the engine, store and API above it
//! (DEVELOPING.md, "The quick loops"). The `tally` library re-exports every room here under
//! its old name (`tally::domain`, `tally::providers`, …), so paths read the same in both crates.
//!
//! The rooms, from the bottom up; each may use the ones above it, never the ones below
//! (`scripts/check-module-cycles.py`), and none uses a room of the `tally` crate:
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

// No `unwrap` or `expect` outside tests (checked by clippy in CI): input from users, files and the
// network gets a clear error instead; an invariant the code relies on says why where it holds.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
// Every public item says what it is for (CI's clippy turns the warning into an error); see
// `src/lib.rs` for the `#[allow(missing_docs)]` that older structs and enums carry.
#![warn(missing_docs)]

pub mod clock;
pub mod delivery;
pub mod domain;
pub mod failpoint;
pub mod metrics;
pub mod mock;
pub mod pixels;
pub mod providers;
pub mod render;
pub mod stages;
