//! tally's integration tests, built as one binary: `common` holds the helpers (temp dirs,
//! a real daemon on a free port, a tiny HTTP client); `engine` and `sets` drive the engine
//! in-process against scriptable providers; `api` and `cli` drive the real binary; `crash`
//! and `soak` kill it where it hurts and read the mock provider's ledger.

mod api;
mod cli;
mod common;
mod engine;
mod sets;
