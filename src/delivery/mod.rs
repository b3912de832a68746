//! Delivery: turning a set's chosen images into listing-ready files (profiles) and writing
//! them to where the listing is made (targets). Everything here is local work at no cost:
//! no provider is called. The durable bookkeeping of a delivery (one item per file, recorded
//! before it is attempted and confirmed after) lives in the store and the engine; this module
//! only knows how to make a file and how to put it somewhere, and says plainly what happened.
//!
//! Layout:
//! - [`profile`]: what file a marketplace wants ([`profile::Profile`], the built-ins).
//! - [`render`]: making that file from a chosen image, and checking an image against a profile.
//! - [`listing`]: a `main_white` shot composed on pure white, and a profile's rules measured
//!   on the file made; [`overlay`]: the owner's words, drawn by tally in its bundled font on
//!   a template's solid area (never cut, never below a minimum size: it blocks instead).
//! - [`kept`]: the files a delivery's check rendered, kept (within the image budget) for its
//!   render.
//! - [`names`]: the files' names from a profile's `file_name` pattern, safe and distinct.
//! - [`manifest`]: `manifest.csv` and `manifest.json`, written beside a delivery's files.
//! - [`target`]: where files go ([`target::Target`]) and what a write answers.
//! - [`folder`]: the `folder` target (a local directory, never overwriting).
//! - [`s3`]: the `s3` target (any S3-compatible bucket, conditional create, retried within
//!   a bound); `s3_http` its HTTP client (bodies capped, answers sorted for a retry).
//! - [`shopify`]: the `shopify` target (a product's media, through the Admin GraphQL API).
//!
//! Invariant: nothing here touches the store, and nothing here overwrites a file at a target.

pub mod folder;
pub mod kept;
pub mod listing;
pub mod manifest;
pub mod names;
pub mod overlay;
pub mod profile;
pub mod render;
pub mod s3;
mod s3_http;
pub mod shopify;
pub mod target;
