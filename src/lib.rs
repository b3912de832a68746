//! tally: runs paid, slow, external jobs (AI image generation first) and never lets a retry
//! spend money twice without the user knowing.
//!
//! Layout (see ARCHITECTURE.md for the map and the invariants):
//! - [`config`]: raw TOML → resolved, validated configuration.
//! - [`providers`]: the provider trait, its capabilities, and the adapters.
//! - [`render`]: placeholder PNG rendering for the demo and mock providers.
//! - [`bench`]: `tally bench`, the end-to-end benchmark.

pub mod bench;
pub mod clock;
pub mod config;
pub mod domain;
pub mod engine;
pub mod failpoint;
pub mod metrics;
pub mod providers;
pub mod render;
pub mod store;
