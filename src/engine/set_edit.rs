//! Editing, duplicating and deleting an image set: the checks an edit's words must pass (the
//! same as a new set's), and the calls that store each change (`store::set_edit` states the
//! rules, enforced in the store's transaction).

use super::intake::{MAX_REFERENCES, validate_key};
use super::{Engine, EngineError};
use crate::store::{
    DeleteOutcome, EditOutcome, NewSet, NewShot, NewTask, SHOT_ROLES, SetEdit, ShotEdit, StartOutcome, SubmitOutcome,
};

impl Engine {
    /// Check and store an edit of set `id` (before anything was sent for what it touches).
    ///
    /// The shot edits apply in the order listed: a shot named more than once takes each of its
    /// entries in turn (the last value given for a field wins), as one edit.
    pub async fn edit_set(&self, id: &str, mut edit: SetEdit) -> Result<EditOutcome, EngineError> {
        let mut merged: Vec<ShotEdit> = Vec::with_capacity(edit.shots.len());
        for s in std::mem::take(&mut edit.shots) {
            match merged.iter_mut().find(|m| m.position == s.position) {
                Some(m) => {
                    m.prompt = s.prompt.or(m.prompt.take());
                    m.role = s.role.or(m.role.take());
                }
                None => merged.push(s),
            }
        }
        edit.shots = merged;
        let Some(set) = self.shared.store.get_set(id.to_string()).await? else { return Ok(EditOutcome::NoSet) };
        if edit.product.as_deref().is_some_and(|p| p.trim().is_empty()) {
            return Err(EngineError::Invalid("the product name is empty".into()));
        }
        if edit.references.as_ref().is_some_and(|r| r.len() > MAX_REFERENCES) {
            return Err(EngineError::Invalid(format!("a set takes at most {MAX_REFERENCES} reference images")));
        }
        let whole = NewSet {
            product: edit.product.clone().unwrap_or_else(|| set.product.clone()),
            style: edit.style.clone().unwrap_or_else(|| set.style.clone()),
            provider: set.provider.clone(),
            references: Vec::new(),
            shots: Vec::new(),
            idempotency_key: None,
        };
        // The product and style go into every shot's request: each must stay acceptable.
        let suffix = |s: &NewSet| {
            s.shot_prompt(&NewShot {
                role: String::new(),
                prompt: String::new(),
                params: serde_json::json!({}),
                candidates: 1,
                ..NewShot::default()
            })
        };
        if edit.whole_set() {
            let before = NewSet { product: set.product.clone(), style: set.style.clone(), ..whole.clone() };
            let (old, new) = (suffix(&before), suffix(&whole));
            for (i, t) in set.shots.iter().enumerate() {
                let own = t.prompt.strip_suffix(old.as_str()).unwrap_or(&t.prompt);
                let task =
                    NewTask { provider: set.provider.clone(), prompt: format!("{own}{new}"), ..NewTask::default() };
                self.validate(&task).map_err(|e| EngineError::Invalid(format!("shot {}: {e}", i + 1)))?;
            }
        }
        for s in &edit.shots {
            let n = s.position.saturating_add(1);
            let white = usize::try_from(s.position)
                .ok()
                .and_then(|p| set.shots.get(p))
                .is_some_and(|t| t.shot_role.as_deref() == Some("main_white"));
            if white || s.role.as_deref() == Some("main_white") {
                return Err(EngineError::Invalid(crate::domain::words::say_with(
                    "say.error_white_not_edited",
                    &[("n", &n.to_string())],
                )));
            }
            if let Some(role) = &s.role
                && !SHOT_ROLES.contains(&role.as_str())
            {
                return Err(EngineError::Invalid(format!(
                    "shot {n}: role `{role}` is not one of {}",
                    SHOT_ROLES.join(", ")
                )));
            }
            if let Some(p) = &s.prompt {
                if p.trim().is_empty() {
                    return Err(EngineError::Invalid(format!("shot {n}: the prompt is empty")));
                }
                let shot = NewShot {
                    role: String::new(),
                    prompt: p.clone(),
                    params: serde_json::json!({}),
                    candidates: 1,
                    ..NewShot::default()
                };
                let t =
                    NewTask { provider: set.provider.clone(), prompt: whole.shot_prompt(&shot), ..NewTask::default() };
                self.validate(&t).map_err(|e| EngineError::Invalid(format!("shot {n}: {e}")))?;
            }
        }
        Ok(self.shared.store.edit_set(id.to_string(), edit, self.shared.now()).await?)
    }

    /// Duplicate set `id` as a copy to edit (nothing of it scheduled until it is started), or
    /// started at once with `start`; `None` if there is no such set.
    pub async fn duplicate_set(
        &self,
        id: &str,
        key: Option<String>,
        start: bool,
    ) -> Result<Option<SubmitOutcome>, EngineError> {
        validate_key(key.as_deref())?;
        let out = self.shared.store.duplicate_set(id.to_string(), key, start, self.shared.now()).await?;
        if start && out.is_some() {
            self.shared.wake_dispatcher.notify_one();
        }
        Ok(out)
    }

    /// Check a start's idempotency key as any other (a start is idempotent by itself, so the
    /// key changes nothing, but a malformed one is refused as everywhere).
    pub fn check_start_key(&self, key: Option<&str>) -> Result<(), EngineError> {
        validate_key(key)
    }

    /// Start copy `id`: its first shot due now, as a new set's — if it still sends what `priced`
    /// (its [`Engine::set_as_new`] when the owner was asked the price) does; else `Changed`.
    pub async fn start_set(&self, id: &str, priced: NewSet) -> Result<StartOutcome, EngineError> {
        let out = self.shared.store.start_priced_set(id.to_string(), priced, self.shared.now()).await?;
        if out == StartOutcome::Started {
            self.shared.wake_dispatcher.notify_one();
        }
        Ok(out)
    }

    /// What a duplicate of set `id` would create (to price it before asking); `None` if there
    /// is no such set.
    pub async fn set_as_new(&self, id: &str) -> Result<Option<NewSet>, EngineError> {
        Ok(self.shared.store.set_as_new(id.to_string()).await?)
    }

    /// Delete set `id` if every task of it failed or was canceled.
    pub async fn delete_set(&self, id: &str) -> Result<DeleteOutcome, EngineError> {
        Ok(self.shared.store.delete_set(id.to_string(), self.shared.now()).await?)
    }

    /// Set or remove (`None`) the words drawn on shot `position`'s image: checked as at a set's
    /// creation (a template that exists, words that fit a square frame, never on a white main
    /// image). `Ok(false)`: no such set or shot.
    pub async fn set_shot_overlay(
        &self,
        id: &str,
        position: i64,
        overlay: Option<crate::domain::overlay::Overlay>,
    ) -> Result<bool, EngineError> {
        let Some(set) = self.shared.store.get_set(id.to_string()).await? else { return Ok(false) };
        let Some(shot) = usize::try_from(position).ok().and_then(|p| set.shots.get(p)) else { return Ok(false) };
        if let Some(o) = &overlay {
            let n = (position + 1).to_string();
            if shot.shot_role.as_deref() == Some("main_white") {
                return Err(EngineError::Invalid(crate::domain::words::say_with(
                    "say.error_overlay_on_white",
                    &[("n", &n)],
                )));
            }
            crate::delivery::overlay::check(o, 1000, 1000).map_err(|e| {
                EngineError::Invalid(crate::domain::words::say_with(
                    "say.error_shot",
                    &[("n", &n), ("what", &e.said())],
                ))
            })?;
        }
        Ok(self.shared.store.set_overlay(id.to_string(), position, overlay, self.shared.now()).await?)
    }
}
