//! The provider adapters' integration tests, a binary of their own so that changing one adapter
//! and running its tests builds and links this small binary, not the whole of `tests/it`
//! (DEVELOPING.md, "The quick loops", has the figures). `providers_http` holds the shared
//! harness over the in-process mock provider; each `providers_<kind>` file tests one kind
//! against it, asserting both what the adapter returned and what the mock's ledger recorded;
//! `providers_hostile` serves answers that misbehave on purpose; `providers_fidelity` and
//! `providers_daemon` drive each kind through the real daemon; `providers_sdk` runs the pinned
//! official SDKs against the real mock. `common` is `tests/it`'s helper module, shared.

#[path = "../it/common.rs"]
mod common;

mod providers_bfl;
mod providers_daemon;
mod providers_dashscope;
mod providers_fal;
mod providers_fidelity;
mod providers_gemini;
mod providers_hostile;
mod providers_http;
mod providers_photoroom;
mod providers_replicate;
mod providers_sdk;
