//! The files a delivery's check rendered, kept for the delivery's own render so that each
//! image is rendered once, not twice (issue #41). A delivery that is not forced checks every
//! chosen image against its profile ([`super::render::check_and_render`], a full render); the
//! files it made are kept here under the chosen image's id and the profile, and the delivery
//! runner takes them instead of rendering again. Rendering is deterministic, so a kept file is
//! byte for byte the file a render would make.
//!
//! Bounds: the kept files hold bytes of the daemon's image budget ([`crate::pixels`], a
//! [`crate::pixels::Hold`] each, never more than an eighth of it in all), so image work and
//! kept files together stay within the budget; a file that does not fit is simply not kept
//! (the runner renders it). A file is given up when taken, when its delivery was not made,
//! [`TTL`] after it was kept (looked at whenever one is kept or taken), and all of them as
//! soon as a decode needs their bytes ([`crate::pixels::Budget::set_reclaimer`]): they only
//! save time.

use std::collections::VecDeque;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::profile::Profile;
use super::render::Rendered;

/// How long a kept file waits for its delivery's render.
pub const TTL: Duration = Duration::from_secs(120);

/// Rendered files waiting for their delivery (see the module doc).
pub struct Kept {
    entries: Mutex<VecDeque<Entry>>,
}

struct Entry {
    key: String,
    at: Instant,
    file: Rendered,
    _hold: crate::pixels::Hold<'static>,
}

/// The daemon's kept files.
pub fn kept() -> &'static Kept {
    static KEPT: OnceLock<Kept> = OnceLock::new();
    KEPT.get_or_init(|| Kept { entries: Mutex::new(VecDeque::new()) })
}

fn key(artifact_id: &str, profile: &Profile) -> String {
    // The whole profile: a profile changed between the check and the render misses.
    format!("{artifact_id}\n{profile:?}")
}

impl Kept {
    /// Keep `file`, rendered from the image `artifact_id` with `profile`, when the budget has
    /// room for it now (else it is dropped: the runner renders it again).
    pub fn keep(&self, artifact_id: &str, profile: &Profile, file: Rendered) {
        let budget = crate::pixels::budget();
        budget.set_reclaimer(|| kept().clear());
        let n = file.bytes.len() as u64;
        let key = key(artifact_id, profile);
        let mut gone = Vec::new();
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        expire(&mut entries, &mut gone);
        if let Some(i) = entries.iter().position(|e| e.key == key) {
            gone.extend(entries.remove(i));
        }
        let held: u64 = entries.iter().map(|e| e.file.bytes.len() as u64).sum();
        if held.saturating_add(n) > budget.limit() / 8 {
            return;
        }
        if let Some(hold) = budget.try_hold(n) {
            entries.push_back(Entry { key, at: Instant::now(), file, _hold: hold });
        }
    }

    /// The file kept for `artifact_id` with `profile`, taken out (`None`: render it).
    pub fn take(&self, artifact_id: &str, profile: &Profile) -> Option<Rendered> {
        let key = key(artifact_id, profile);
        let mut gone = Vec::new();
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        expire(&mut entries, &mut gone);
        let i = entries.iter().position(|e| e.key == key)?;
        entries.remove(i).map(|e| e.file)
    }

    /// Give up the file kept for `artifact_id` with `profile`, if any (its delivery was not
    /// made).
    pub fn forget(&self, artifact_id: &str, profile: &Profile) {
        drop(self.take(artifact_id, profile));
    }

    /// Give up every kept file (a decode needs the budget's bytes).
    pub fn clear(&self) {
        let gone: Vec<Entry> = self.entries.lock().unwrap_or_else(|p| p.into_inner()).drain(..).collect();
        drop(gone);
    }

    /// The bytes of the files kept now.
    pub fn bytes(&self) -> u64 {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.iter().map(|e| e.file.bytes.len() as u64).sum()
    }
}

/// Move the entries older than [`TTL`] to `gone` (dropped by the caller after its lock).
fn expire(entries: &mut VecDeque<Entry>, gone: &mut Vec<Entry>) {
    while entries.front().is_some_and(|e| e.at.elapsed() > TTL) {
        gone.extend(entries.pop_front());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::profile::builtin;

    fn file(n: usize) -> Rendered {
        Rendered {
            bytes: vec![7; n],
            width: 1,
            height: 1,
            media_type: "image/jpeg",
            ext: "jpg",
            sha256: String::new(),
            quality: Some(90),
        }
    }

    #[test]
    fn a_kept_file_is_taken_once_for_its_own_image_and_profile_and_holds_budget_meanwhile() {
        let (amazon, taobao) = (builtin("amazon").expect("amazon"), builtin("taobao").expect("taobao"));
        let id = format!("kept-test-{}", uuid::Uuid::new_v4());
        kept().keep(&id, &amazon, file(1000));
        assert!(kept().take(&id, &taobao).is_none(), "another profile's file is not this one");
        assert!(kept().take("another-image", &amazon).is_none());
        let got = kept().take(&id, &amazon).expect("kept");
        assert_eq!(got.bytes.len(), 1000);
        assert!(kept().take(&id, &amazon).is_none(), "taken once");
        kept().keep(&id, &taobao, file(10));
        kept().forget(&id, &taobao);
        assert!(kept().take(&id, &taobao).is_none(), "forgotten");
    }

    #[test]
    fn a_file_larger_than_the_kept_share_of_the_budget_is_not_kept() {
        let amazon = builtin("amazon").expect("amazon");
        let id = format!("kept-test-{}", uuid::Uuid::new_v4());
        let too_big = (crate::pixels::budget().limit() / 8 + 1) as usize;
        kept().keep(&id, &amazon, file(too_big));
        assert!(kept().take(&id, &amazon).is_none());
    }
}
