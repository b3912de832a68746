//! tally's integration tests, built as one binary: `common` holds the helpers (temp dirs,
//! a real daemon on a free port, a tiny HTTP client), `api` drives the HTTP API, `cli` the
//! command line.

mod api;
mod cli;
mod common;
