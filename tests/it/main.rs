//! tally's integration tests, built as one test binary (one link instead of many).

mod engine;
mod sets;
