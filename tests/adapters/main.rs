//! The provider adapters' tests against the in-process mock provider, in the package
//! `tally-base`: changing one adapter and running its tests rebuilds that small crate and this
//! binary, not the engine or the daemon (DEVELOPING.md, "The quick loops", has the figures).
//! `harness` holds what they share; each `providers_<kind>` file tests one kind, asserting both
//! what the adapter returned and what the mock's ledger recorded; `providers_http` holds the
//! OpenAI-style and cross-kind tests. The tests that drive the real daemon (and the servers
//! that misbehave on purpose, the fidelity checks and the official SDKs) are the `tally`
//! package's `tests/providers`.

mod harness;

mod providers_bfl;
mod providers_fal;
mod providers_gemini;
mod providers_http;
mod providers_replicate;
