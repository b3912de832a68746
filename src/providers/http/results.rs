//! Paid results: how long a provider documents that it keeps a finished result
//! ([`Retention`]), and a download of it retried within a budget
//! ([`HttpClient::download_retrying`], answering [`ResultFetch`]). Nothing here ever decides
//! that a result expired: the adapter does, from the retention and the provider's own word.
//! Re-exported by [`super::client`].

use std::time::{Duration, SystemTime};

use super::client::{Download, HttpClient};
use super::notnow::jittered;
use crate::providers::{CallError, Image};

/// How long a provider documents that it keeps a finished result (its file, or its output),
/// counted from when the result was made; with the words to show a person.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// How long the result is kept at least.
    pub keep: Duration,
    /// Who keeps what, for messages ("fal keeps generated media for at least 7 days").
    pub words: &'static str,
}

impl Retention {
    /// Whether the retention has passed at `now_ms` for a result made at `made_ms` (ms since the
    /// epoch). Only then may a missing result be called expired.
    pub fn passed(&self, made_ms: i64, now_ms: i64) -> bool {
        now_ms.saturating_sub(made_ms) > self.keep.as_millis() as i64
    }
}

/// The current time in ms since the epoch (for retention checks in adapters).
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// What [`HttpClient::download_retrying`] found.
#[derive(Debug)]
#[allow(missing_docs)]
pub enum ResultFetch {
    /// The bytes, checked to be an image.
    Image(Image),
    /// Every try failed in a way a later try may fix (404/410 from the file host, a 5xx, a
    /// 429, a connection problem): the result may still be there. `tries` were made; the
    /// message says what the last one found. Never proof that the result expired.
    NotYet { tries: u32, last: String, gone: bool },
    /// A try failed in a way trying again cannot fix (a refusal other than 404/410, or an
    /// answer that is not an image or is too large).
    Failed(CallError),
}

impl HttpClient {
    /// Download a paid result, trying again with backoff (0.5 s, 1 s, 2 s, … at most 30 s, with
    /// jitter) while the file host answers 404/410 (a CDN that has not got the file yet, or a
    /// blip), a 5xx or 429, or the connection fails, for at most `budget` in all. A provider
    /// that made the result keeps it for its documented [`Retention`]; the caller decides,
    /// from that retention and the provider's own word (a `data_removed` flag), whether a
    /// result that is still missing has expired: this function never says so.
    pub async fn download_retrying(&self, url: &str, budget: Duration) -> ResultFetch {
        let start = std::time::Instant::now();
        let mut tries = 0u32;
        loop {
            tries += 1;
            let (last, gone) = match self.download(url).await {
                Ok(Download::Image(image)) => return ResultFetch::Image(image),
                Ok(Download::Gone) => ("the result's file host answered 404/410".to_string(), true),
                Err(e @ (CallError::NotSent(_) | CallError::Ambiguous(_) | CallError::RetryAfter { .. })) => {
                    (e.to_string(), false)
                }
                Err(e) => return ResultFetch::Failed(e),
            };
            let wait =
                jittered(Duration::from_millis(250u64 << tries.min(7)).min(Duration::from_secs(30)), rand_unit());
            if start.elapsed() + wait > budget {
                return ResultFetch::NotYet { tries, last, gone };
            }
            tracing::info!(tries, retry_in = ?wait, "downloading a paid result failed; trying again: {last}");
            tokio::time::sleep(wait).await;
        }
    }
}

/// A random value in [0, 1) from the OS random source (jitter).
pub fn rand_unit() -> f64 {
    (uuid::Uuid::new_v4().as_u128() as u64 >> 11) as f64 / (1u64 << 53) as f64
}
