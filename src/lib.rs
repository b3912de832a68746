//! tally: runs paid, slow, external jobs (AI image generation first) and never lets a retry
//! spend money twice without the user knowing.
//!
//! Layout (see ARCHITECTURE.md for the map and the invariants):
//! - [`config`]: raw TOML → resolved, validated configuration.
//! - [`providers`]: the provider trait, its capabilities, and the adapters.
//! - [`mock`]: the mock provider server (`tally mock-provider`) and its ledger.
//! - [`render`]: placeholder PNG rendering for the demo and mock providers.
//! - [`api`]: the HTTP API; [`web`]: the web page, its sign-in sessions and live event stream; [`app`]: `tally serve` wiring; [`cli`]: the command line and its HTTP client.
//! - [`delivery`]: listing-ready files from chosen images (profiles) and where they go (targets).
//! - [`server`]: the HTTP listener with its connection cap and header and body deadlines.
//! - [`bench`]: `tally bench`, the end-to-end benchmark.

pub mod api;
pub mod app;
pub mod bench;
pub mod cli;
pub mod clock;
pub mod config;
pub mod delivery;
pub mod domain;
pub mod engine;
pub mod failpoint;
pub mod metrics;
pub mod mock;
pub mod providers;
pub mod render;
pub mod server;
pub mod store;
pub mod web;
