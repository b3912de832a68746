//! A set's readiness for a delivery with one profile, said before the delivery is asked for
//! (`GET /v1/sets/{id}?profile=NAME` puts it in `delivery.blocking`; issue #26).
//!
//! The work is bounded, because every look at a set may ask for it: only the **cheap** checks
//! run here, and none decodes or renders an image.
//! - A shot with no chosen image (from the set itself, `store::delivery_blocking`).
//! - A chosen image below the profile's `min_source`: its pixel size is read from the image's
//!   header (the first stored chunk, rarely more; `delivery::render::header_dimensions`) and
//!   remembered per artifact in a [`SizeCache`] of at most [`CACHE_ENTRIES`] entries — an
//!   artifact id names fixed bytes, so a remembered size is never stale. A set seen again
//!   reads nothing.
//! - `original` over its `max_bytes`: from the artifact's stored size.
//!
//! The checks that need the file made (transparency that `original` would keep, a file over
//! `max_bytes` at any quality) cost a decode or a full render, so they run when the delivery
//! is asked for (`Engine::deliver`), and its 409 lists them with the reasons here. So an
//! empty `blocking` for a profile means "nothing the cheap checks can see", not a promise.
//! The one exception is a listing image (issue #37): `GET /v1/sets/{id}?profile=` renders each
//! shot that only a render can judge — a `main_white` shot, a shot with words drawn, every shot
//! for a profile whose rules are measured on the file — and adds what it breaks
//! (`api::sets::get_one`); a set has a handful of shots.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use super::{Engine, EngineError};
use crate::delivery::render::{header_dimensions, too_many_bytes, too_small};
use crate::store::{CHUNK, SetView, Store, delivery_blocking, shot_label};

/// How many artifacts' pixel sizes the cache remembers (a few bytes each; the oldest is
/// forgotten first).
pub const CACHE_ENTRIES: usize = 4096;

/// The pixel sizes of artifacts already looked at: artifact id → (width, height), upright.
#[derive(Default)]
pub(crate) struct SizeCache {
    inner: Mutex<Sizes>,
}

#[derive(Default)]
struct Sizes {
    map: HashMap<String, (u32, u32)>,
    order: VecDeque<String>,
}

impl SizeCache {
    fn get(&self, id: &str) -> Option<(u32, u32)> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).map.get(id).copied()
    }

    fn put(&self, id: &str, size: (u32, u32)) {
        let mut s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if s.map.insert(id.to_string(), size).is_none() {
            s.order.push_back(id.to_string());
        }
        while s.order.len() > CACHE_ENTRIES {
            if let Some(old) = s.order.pop_front() {
                s.map.remove(&old);
            }
        }
    }

    /// How many sizes are remembered (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).map.len()
    }
}

/// What [`Engine::delivery_readiness`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// The reasons the set cannot be delivered with the profile, in plain words (empty: none
    /// the cheap checks can see).
    Checked(Vec<String>),
    /// No profile of that name (the names that exist).
    UnknownProfile(Vec<String>),
}

/// What reading one chosen image's header gave.
enum Size {
    Known(u32, u32),
    /// Not stored any more (pruned).
    Gone,
    /// Its bytes could not be read or are not an image (plain words why).
    Unreadable(String),
}

impl Engine {
    /// Why `set` cannot be delivered with `profile` now, by the cheap checks (see the module
    /// docs): no chosen image, a chosen image below `min_source`, `original` over its byte
    /// limit. Reads at most the header of each chosen image whose size is not remembered yet.
    pub async fn delivery_readiness(&self, set: &SetView, profile: &str) -> Result<Readiness, EngineError> {
        let setup = self.setup()?;
        let Some(profile) = setup.profile(profile).cloned() else {
            return Ok(Readiness::UnknownProfile(self.delivery_names().0));
        };
        let mut out = delivery_blocking(set);
        let roles: Vec<Option<String>> = set.shots.iter().map(|t| t.shot_role.clone()).collect();
        // (subject, artifact id, stored bytes) of every chosen image.
        let mut chosen = Vec::new();
        for (i, c) in set.chosen.iter().enumerate() {
            let Some(id) = c else { continue };
            let stored = set.candidates.get(i).into_iter().flatten().flat_map(|t| &t.artifacts).find(|a| &a.id == id);
            let subject = crate::domain::words::say_with("say.chosen_image_of", &[("shot", &shot_label(&roles, i))]);
            chosen.push((subject, id.clone(), stored.map_or(0, |a| a.bytes.max(0) as u64)));
        }
        let needs_size = profile.min_source.is_some();
        let missing: Vec<String> = if needs_size {
            chosen.iter().filter(|(_, id, _)| setup.sizes.get(id).is_none()).map(|(_, id, _)| id.clone()).collect()
        } else {
            Vec::new()
        };
        let mut read = HashMap::new();
        if !missing.is_empty() {
            let store = self.shared.store.clone();
            read = tokio::task::spawn_blocking(move || {
                missing.into_iter().map(|id| (id.clone(), read_size(&store, &id))).collect::<HashMap<_, _>>()
            })
            .await
            .map_err(|e| EngineError::Invalid(format!("reading the chosen images' sizes stopped: {e}")))?;
        }
        for (subject, id, bytes) in &chosen {
            if needs_size {
                let size = match setup.sizes.get(id) {
                    Some((w, h)) => Size::Known(w, h),
                    None => read.remove(id).unwrap_or(Size::Gone),
                };
                match size {
                    Size::Known(w, h) => {
                        setup.sizes.put(id, (w, h));
                        out.extend(too_small(&profile, w, h, subject).map(|p| p.message));
                    }
                    Size::Gone => out.push(crate::domain::words::say_with("say.chosen_gone", &[("subject", subject)])),
                    Size::Unreadable(why) => out.push(crate::domain::words::say_with(
                        "say.chosen_unreadable",
                        &[("subject", subject), ("why", &why.to_string())],
                    )),
                }
            }
            if profile.is_original()
                && let Some(max) = profile.max_bytes
                && *bytes > max
            {
                out.push(too_many_bytes(&profile, *bytes, max, subject).message);
            }
        }
        Ok(Readiness::Checked(out))
    }
}

/// One stored image's upright pixel size from its header: chunk by chunk until the header
/// parses (one chunk for any ordinary image), never more than the image.
fn read_size(store: &Store, id: &str) -> Size {
    let mut reader = match store.open_blob(id) {
        Ok(Some(r)) => r,
        Ok(None) => return Size::Gone,
        Err(e) => return Size::Unreadable(e.to_string()),
    };
    let mut head = Vec::new();
    loop {
        match reader.next_chunk(CHUNK) {
            Ok(Some(chunk)) => head.extend_from_slice(&chunk),
            Ok(None) => break,
            Err(e) => return Size::Unreadable(e.to_string()),
        }
        if let Ok((w, h)) = header_dimensions(&head) {
            return Size::Known(w, h);
        }
    }
    match header_dimensions(&head) {
        Ok((w, h)) => Size::Known(w, h),
        Err(e) => Size::Unreadable(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_forgets_the_oldest_beyond_its_bound() {
        let c = SizeCache::default();
        for i in 0..CACHE_ENTRIES + 10 {
            c.put(&format!("a{i}"), (i as u32, 1));
        }
        assert_eq!(c.len(), CACHE_ENTRIES);
        assert_eq!(c.get("a0"), None, "the oldest is forgotten");
        assert_eq!(c.get(&format!("a{}", CACHE_ENTRIES + 9)), Some(((CACHE_ENTRIES + 9) as u32, 1)));
        c.put("a20", (7, 7));
        assert_eq!(c.len(), CACHE_ENTRIES, "putting a remembered id again does not grow it");
    }
}
