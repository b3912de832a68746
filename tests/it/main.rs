//! tally's integration tests, built as one binary: `common` holds the helpers (temp dirs,
//! a real daemon on a free port, a tiny HTTP client); `engine` and `sets` drive the engine
//! in-process against scriptable providers; `races` scripts reconciler-vs-worker
//! interleavings on the store with explicit times; `api` and `cli` drive the real binary;
//! `web` drives the web page over HTTP and in headless Chromium; `crash` and `soak` kill it
//! where it hurts and read the mock provider's ledger; `disks` empties, flips, write-protects
//! and fills the disk under the real binary; `limits` floods it with idle and unfinished
//! connections; `delivery_s3` puts files into a real S3-compatible server (moto) through a
//! proxy that loses answers, and `delivery_s3_faults` through the faults S3 documents and
//! hostile endpoints; `delivery_crash` kills it at every phase of a delivery; `docs` holds the
//! README and the guide to the binary's commands, routes, configuration keys and links.

mod api;
mod backup;
mod browser;
mod budget;
mod candidates;
mod charges;
mod cli;
mod common;
mod config_kinds;
mod conformance;
#[cfg(feature = "failpoints")]
mod crash;
mod damaged;
mod deliveries;
#[cfg(feature = "failpoints")]
mod delivery_crash;
#[cfg(feature = "failpoints")]
mod delivery_crash_shopify;
mod delivery_page;
mod delivery_s3;
mod delivery_s3_faults;
mod delivery_shopify;
mod disks;
mod docs;
mod download_profiles;
mod drafts;
mod drafts_migrate;
mod engine;
mod fairness;
#[cfg(feature = "failpoints")]
mod fsync;
mod hostile3;
mod language;
mod limits;
mod listing;
mod memory;
mod money;
mod onefile;
mod openapi;
mod operations;
mod pg_fence;
mod pg_nodes;
mod phone;
mod pillow;
#[cfg(feature = "failpoints")]
mod powerloss;
mod races;
mod set_edit;
mod sets;
mod setup;
#[cfg(feature = "failpoints")]
mod soak;
mod surface;
mod tour;
mod web;
mod web_clock;
mod web_drafts;
mod web_money;
mod web_ops;
mod web_photos;
mod web_set_edit;
mod web_set_refs;
mod web_surface;
mod web_views;

/// The crash matrix and the soak need crash points compiled into the binary; say so loudly
/// instead of skipping silently when they are not.
#[cfg(not(feature = "failpoints"))]
#[test]
#[ignore = "the crash matrix and chaos soak need `--features failpoints` (scripts/test.sh passes it)"]
fn crash_matrix_and_soak_need_the_failpoints_feature() {}
