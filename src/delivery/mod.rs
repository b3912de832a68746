//! Delivery: turning a set's chosen images into listing-ready files (profiles) and writing
//! them to where the listing is made (targets). Everything here is local work at no cost:
//! no provider is called. The durable bookkeeping of a delivery (one item per file, recorded
//! before it is attempted and confirmed after) lives in the store and the engine; this module
//! only knows how to make a file and how to put it somewhere, and says plainly what happened.

pub mod s3;
pub mod target;
