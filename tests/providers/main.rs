//! The provider kinds' tests through the real daemon, a binary of their own: `providers_daemon`
//! and `providers_fidelity` drive each kind through the daemon, `providers_hostile` serves
//! answers that misbehave on purpose, `providers_dashscope` and `providers_photoroom` test the
//! kinds that need both levels, and `providers_sdk` runs the pinned official SDKs against the
//! real mock. The adapter-only tests are the quicker binary `tests/adapters` (package
//! `tally-base`), whose `harness` this binary shares; `common` is `tests/it`'s helper module.

#[path = "../it/common.rs"]
mod common;
#[path = "../adapters/harness.rs"]
mod harness;

mod providers_daemon;
mod providers_dashscope;
mod providers_fidelity;
mod providers_hostile;
mod providers_photoroom;
mod providers_sdk;
