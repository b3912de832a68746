//! The benchmark's instant provider: answers every call at once with a small pre-rendered PNG
//! and records when each call started, so pickup latency can be measured end to end.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::providers::{BoxFuture, CallError, CallRequest, Capabilities, Image, Provider, Submitted};

/// A provider that answers instantly. The image is rendered once (8×8, via
/// [`crate::render::placeholder_png`]) and cloned per call, so the engine's full image path
/// (verify, hash, the bytes and the artifact row in the fenced finish's commit) runs for every
/// task while the provider itself costs next to nothing.
pub struct InstantProvider {
    /// The images answered in turn (one for most sections).
    pngs: Vec<Vec<u8>>,
    calls: AtomicU64,
    /// When recording: call start instant per task id.
    starts: Mutex<Option<HashMap<String, Instant>>>,
}

impl InstantProvider {
    /// A provider; with `record`, it remembers the start instant of each call by task id.
    pub fn new(record: bool) -> Self {
        InstantProvider {
            pngs: vec![crate::render::placeholder_png("tally bench", 8)],
            calls: AtomicU64::new(0),
            starts: Mutex::new(record.then(HashMap::new)),
        }
    }

    /// A provider that answers every call with `png` (the large-image runs).
    pub fn with_image(png: Vec<u8>) -> Self {
        Self::with_images(vec![png])
    }

    /// A provider that answers the images of `pngs` in turn (the scale section's file).
    pub fn with_images(pngs: Vec<Vec<u8>>) -> Self {
        InstantProvider { pngs, calls: AtomicU64::new(0), starts: Mutex::new(None) }
    }

    /// Calls received so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// When the call for `task_id` started (recording providers only).
    pub fn started(&self, task_id: &str) -> Option<Instant> {
        self.lock().as_ref().and_then(|m| m.get(task_id).copied())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<HashMap<String, Instant>>> {
        self.starts.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Provider for InstantProvider {
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    fn submit<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Submitted, CallError>> {
        let now = Instant::now();
        Box::pin(async move {
            let n = self.calls.fetch_add(1, Ordering::Relaxed);
            if let Some(m) = self.lock().as_mut() {
                m.insert(req.task_id.clone(), now);
            }
            let png = self.pngs.get((n as usize) % self.pngs.len().max(1)).cloned().unwrap_or_default();
            Ok(Submitted::Done(Image { bytes: png, media_type: "image/png".into() }))
        })
    }
}
