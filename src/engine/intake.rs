//! Intake: the checks a new task, upload or image set must pass before it is durably stored
//! (sizes, provider, parameters, references, keys), and the calls that store it and wake the
//! dispatcher — or, on the one-commit pickup, hand the task straight to an idle worker with
//! `calling` already recorded in the submit's commit ([`Engine::pick_up`], `store::ops::pickup`).

use crate::domain::operation::{Operation, PromptRule, Source, SourceKind};
use crate::domain::words::{say, say_with};
use futures_util::FutureExt;
use tokio::sync::OwnedSemaphorePermit;

use super::{Engine, EngineError, ProviderEntry, Shared};
use crate::domain::TaskStatus;
use crate::providers::CallRequest;
use crate::store::{
    AddOutcome, CandidateOp, ChoiceOutcome, MAX_CANDIDATES, NewImage, NewSet, NewTask, PickedUp, Pickup, SHOT_ROLES,
    SubmitOutcome, TaskView, UploadView,
};

/// What the fast path holds between its checks and its commit ([`Engine::pick_up`]).
struct FastPickup {
    /// An idle worker's permit, for the worker that sends the request.
    permit: OwnedSemaphorePermit,
    /// `Shared::fences` before the commit.
    fence: u64,
    /// What the store's half needs.
    pickup: Pickup,
}

/// The largest prompt tally accepts, in bytes.
pub const MAX_PROMPT_BYTES: usize = 8 * 1024;
/// The largest `params` object tally accepts, serialised, in bytes.
pub const MAX_PARAMS_BYTES: usize = 16 * 1024;
/// The largest reference image tally accepts, in bytes.
pub const MAX_UPLOAD_BYTES: usize = 10 * 1024 * 1024;
/// The longest submit `group` tally accepts, in bytes.
pub const MAX_GROUP_BYTES: usize = 128;
/// The most shots one image set may list.
pub const MAX_SHOTS: usize = 50;
/// The most reference images one image set may carry.
pub const MAX_REFERENCES: usize = 8;
/// The longest idempotency key tally accepts, in bytes (tasks and sets alike).
pub const MAX_KEY_CHARS: usize = 256;

/// The parameters with which the image APIs tally speaks ask for several images in one
/// request (`n`, `num_outputs`, `num_images`, `sampleCount`, `number_of_images`; each
/// adapter's file says which it sends). A task stores one image, so a value other than 1 is
/// refused at submit, before anything is sent, rather than sent changed or answered with
/// images dropped.
pub const IMAGE_COUNT_PARAMS: &[&str] = &["n", "num_outputs", "num_images", "sampleCount", "number_of_images"];

/// Refuse a request for several images per task (see [`IMAGE_COUNT_PARAMS`]).
fn validate_image_count(params: &serde_json::Value) -> Result<(), EngineError> {
    for name in IMAGE_COUNT_PARAMS {
        match params.get(*name) {
            None => {}
            Some(v) if v.as_u64() == Some(1) || v.as_f64() == Some(1.0) => {}
            Some(v) => {
                return Err(EngineError::Invalid(format!(
                    "params.{name} = {v}: a tally task makes exactly one image, so it refuses to ask the provider for \
                     another number (it would not change the parameter silently); submit one task per image, or an \
                     image set with one shot per image"
                )));
            }
        }
    }
    Ok(())
}

/// A client's idempotency key, for a task or a set: 1 to [`MAX_KEY_CHARS`] characters.
pub(super) fn validate_key(key: Option<&str>) -> Result<(), EngineError> {
    match key {
        Some(k) if k.is_empty() || k.len() > MAX_KEY_CHARS => {
            Err(EngineError::Invalid(format!("the idempotency key must be 1 to {MAX_KEY_CHARS} characters")))
        }
        _ => Ok(()),
    }
}

impl Engine {
    /// Validate and durably submit a task (task + envelope in one transaction), then wake
    /// the dispatcher — or, on the fast path ([`Engine::pick_up`]), claim it and record
    /// `calling` in the same commit and hand it to an idle worker.
    pub async fn submit(&self, t: NewTask) -> Result<SubmitOutcome, EngineError> {
        let _t = crate::stages::span(crate::stages::Stage::Submit);
        self.validate(&t)?;
        self.check_source(&t).await?;
        if let Some(fast) = self.pick_up(&t) {
            return Ok(self.submit_fast(t, fast, false).await?.0);
        }
        let out = self.shared.store.submit(t, self.shared.now()).await?;
        self.submitted(&out);
        Ok(out)
    }

    /// [`Engine::submit`], also returning the task as committed (read in the same write, for
    /// the API's answer).
    pub async fn submit_and_get(&self, t: NewTask) -> Result<(SubmitOutcome, Option<TaskView>), EngineError> {
        let _t = crate::stages::span(crate::stages::Stage::Submit);
        self.validate(&t)?;
        self.check_source(&t).await?;
        if let Some(fast) = self.pick_up(&t) {
            return self.submit_fast(t, fast, true).await;
        }
        let (out, view) = self.shared.store.submit_and_get(t, self.shared.now()).await?;
        self.submitted(&out);
        Ok((out, view))
    }

    /// After a submit committed: the crash point, the change feed, the dispatcher.
    fn submitted(&self, out: &SubmitOutcome) {
        if let SubmitOutcome::Created(id) = out {
            crate::failpoint::crash("after-submit");
            self.shared.changed(id, TaskStatus::Queued);
            self.shared.wake_dispatcher.notify_one();
        }
    }

    /// The engine's half of the one-commit pickup (`store::ops::pickup` is the store's): the
    /// checks only the engine can make, before the submit's transaction. `Some` (holding an
    /// idle worker's permit) when `[engine] fast_pickup` is on, the task is not a shot of a set
    /// (those carry reference images and wait for their set's turn), no worker is busy (the
    /// engine is idle: under load the dispatcher's batched claims cost less per task than a
    /// pickup tried on every submit — measured, bench-results/2026-12-02-s7-one-commit-pickup.md), the
    /// provider's circuit is closed and nothing holds it, the money checks pass (key present,
    /// size valid), and the adapter's preflight passes without waiting on anything (a
    /// preflight that needs the network — an uncached model schema — leaves the task to
    /// the worker, which runs it as today). Every check the worker makes before `calling` on
    /// the normal path is made here, on the same request, or by the store in the commit
    /// (budget); the store then decides the slot and the fair order in the transaction.
    fn pick_up(&self, t: &NewTask) -> Option<FastPickup> {
        let shared = &self.shared;
        if !shared.cfg.fast_pickup
            || t.shot.is_some()
            || t.source.is_some()
            || t.operation == crate::domain::operation::Operation::Draft
            || shared.stopping()
            || shared.workers.available_permits() < shared.cfg.workers
        {
            return None;
        }
        let entry = shared.providers.get(&t.provider)?;
        let now = shared.now();
        if shared.breaker_open_until(&entry, now).is_some() || entry.money.preflight(&entry.name, &t.params).is_err() {
            return None;
        }
        let req = CallRequest {
            task_id: String::new(),
            prompt: t.prompt.clone(),
            params: t.params.clone(),
            idempotency_key: String::new(),
            references: Vec::new(),
            calling_at_ms: now,
            candidate: 0,
            deadline_ms: now + Shared::ms(shared.cfg.recovery_deadline),
            operation: t.operation,
        };
        match entry.provider.preflight(&req).now_or_never() {
            Some(Ok(())) => {}
            _ => return None,
        }
        let permit = shared.workers.clone().try_acquire_owned().ok()?;
        Some(FastPickup {
            permit,
            // Read before the claim: a fence after this point stops the worker before it sends.
            fence: shared.fence(),
            pickup: Pickup {
                lease_ms: Shared::ms(shared.cfg.lease),
                boot: shared.boot(),
                node: None,
                facts: entry.money.facts(&t.params, shared.limits()),
            },
        })
    }

    /// Submit on the fast path: one durable commit inserts the task and, if the store's
    /// checks pass, claims it and records `calling`; then the worker whose permit `fast` holds
    /// sends the request at once. If the store did not pick it up, the normal path's steps
    /// follow (the permit goes back, the dispatcher is woken).
    async fn submit_fast(
        &self,
        t: NewTask,
        fast: FastPickup,
        view: bool,
    ) -> Result<(SubmitOutcome, Option<TaskView>), EngineError> {
        let shared = &self.shared;
        let FastPickup { permit, fence, pickup } = fast;
        let lease = pickup.lease_ms;
        let (out, task, picked) = shared.store.submit_and_pick_up(t, shared.now(), pickup, view).await?;
        match picked {
            PickedUp::No => {
                drop(permit);
                self.submitted(&out);
            }
            PickedUp::Calling(claim) => {
                // Crash matrix: `calling` is committed with the submit; nothing was sent, and
                // the client may not have its answer yet.
                crate::failpoint::crash("after-pickup");
                let now = shared.now();
                shared.metrics.dispatched(0.0);
                shared.changed(&claim.task_id, TaskStatus::Running);
                // The reconciler must watch this lease's deadline.
                if shared.reconciler_at.load(std::sync::atomic::Ordering::Relaxed) > now + lease {
                    shared.wake_reconciler.notify_one();
                }
                super::worker::spawn_picked_up(shared.clone(), *claim, permit, fence);
            }
            PickedUp::Held { due_at, reason } => {
                drop(permit);
                tracing::info!(until = %crate::clock::rfc3339(due_at), "held back by a budget at submit: {}", crate::domain::words::english(&reason));
                shared.changed(out.task_id(), TaskStatus::Waiting);
                // The dispatcher re-reads the earliest due time (the period's end).
                shared.wake_dispatcher.notify_one();
            }
        }
        Ok((out, task))
    }

    pub(super) fn validate(&self, t: &NewTask) -> Result<(), EngineError> {
        let Some(entry) = self.shared.providers.get(&t.provider) else {
            let names = self.provider_names().join(", ");
            return Err(EngineError::Invalid(say_with(
                "say.error_unknown_provider",
                &[("name", &t.provider), ("names", &names)],
            )));
        };
        self.validate_operation(&entry, t)?;
        if t.operation.spec().prompt == PromptRule::Required && t.prompt.trim().is_empty() {
            return Err(EngineError::Invalid(say("say.error_prompt_empty")));
        }
        if t.prompt.len() > MAX_PROMPT_BYTES {
            return Err(EngineError::Invalid(say_with(
                "say.error_prompt_long",
                &[("n", &MAX_PROMPT_BYTES.to_string())],
            )));
        }
        if !(t.params.is_object() || t.params.is_null()) {
            return Err(EngineError::Invalid("params must be a JSON object".into()));
        }
        if t.params.to_string().len() > MAX_PARAMS_BYTES {
            return Err(EngineError::Invalid(format!("params are larger than {MAX_PARAMS_BYTES} bytes")));
        }
        validate_image_count(&t.params)?;
        if let Some(g) = &t.group
            && (g.is_empty() || g.len() > MAX_GROUP_BYTES || g.chars().any(char::is_control))
        {
            return Err(EngineError::Invalid(format!(
                "the group must be 1 to {MAX_GROUP_BYTES} bytes without control characters"
            )));
        }
        validate_key(t.idempotency_key.as_deref())
    }

    /// The operation's own rules (`domain::operation`), before anything is recorded: the
    /// provider offers it, a prompt where it takes one and none where it takes none, a source
    /// image where it needs one and none where it does not.
    fn validate_operation(&self, entry: &ProviderEntry, t: &NewTask) -> Result<(), EngineError> {
        let spec = t.operation.spec();
        if !entry.operations.contains(&t.operation) {
            let all = self.shared.providers.values();
            let mut offering: Vec<&str> =
                all.iter().filter(|p| p.operations.contains(&t.operation)).map(|p| p.name.as_str()).collect();
            offering.sort();
            let offers: Vec<&str> = entry.operations.iter().map(|o| o.as_str()).collect();
            return Err(EngineError::Invalid(format!(
                "the provider `{}` does not offer `{}` (it offers {}); {}; nothing was recorded or sent",
                entry.name,
                spec.name,
                offers.join(", "),
                if offering.is_empty() {
                    "no configured provider offers it".to_string()
                } else {
                    format!("providers that do: {}", offering.join(", "))
                }
            )));
        }
        if spec.prompt == PromptRule::None && !t.prompt.trim().is_empty() {
            return Err(EngineError::Invalid(format!("`{}` takes no prompt; send it without one", spec.name)));
        }
        match (&t.source, spec.image) {
            (None, true) => Err(EngineError::Invalid(format!(
                "`{}` needs the image to work on: \"image\": {{\"artifact\": ID}} (an image tally made) or \
                 {{\"upload\": ID}} (an uploaded photo)",
                spec.name
            ))),
            (Some(_), false) => Err(EngineError::Invalid(format!(
                "`{}` takes no image; an image is for `edit` and `cutout` (a generation's photos belong to an image set)",
                spec.name
            ))),
            _ => Ok(()),
        }
    }

    /// The source image of an `edit` or `cutout` exists and its provider can take it (its
    /// kind's size limit), checked before anything is recorded or sent. The worker reads it
    /// again before `calling`: an image pruned in between fails the task with nothing sent.
    async fn check_source(&self, t: &NewTask) -> Result<(), EngineError> {
        let Some(src) = &t.source else { return Ok(()) };
        let bytes = match src.kind {
            SourceKind::Artifact => self.shared.store.artifact(src.id.clone()).await?.map(|a| a.bytes),
            SourceKind::Upload => self.shared.store.upload(src.id.clone()).await?.map(|u| u.bytes),
        };
        let Some(bytes) = bytes else {
            return Err(EngineError::Invalid(format!(
                "there is no {} with the id {} (it may have been pruned); nothing was recorded or sent",
                src.kind.as_str(),
                src.id
            )));
        };
        if let Some(entry) = self.shared.providers.get(&t.provider)
            && usize::try_from(bytes).unwrap_or(usize::MAX) > entry.max_image_bytes
        {
            return Err(EngineError::Invalid(format!(
                "the image is {} bytes; the provider `{}` takes images of at most {} bytes; nothing was recorded or sent",
                bytes, entry.name, entry.max_image_bytes
            )));
        }
        Ok(())
    }

    /// Store a reference image (PNG, JPEG or WebP, checked from its bytes), deduplicated by
    /// content.
    pub async fn upload(&self, bytes: Vec<u8>) -> Result<UploadView, EngineError> {
        if bytes.len() > MAX_UPLOAD_BYTES {
            return Err(EngineError::Invalid(say_with(
                "say.error_image_large",
                &[("n", &MAX_UPLOAD_BYTES.to_string())],
            )));
        }
        let heic = crate::domain::is_heic(&bytes);
        let img = NewImage::verify_async(bytes).await.map_err(|_| {
            EngineError::Invalid(if heic {
                crate::domain::words::say("say.error_upload_heic")
            } else {
                crate::domain::words::say("say.error_upload_type")
            })
        })?;
        Ok(self.shared.store.save_upload(img, self.shared.now()).await?)
    }

    /// Validate and durably create an image set: one task per candidate of each shot; the shots
    /// run one after another, the candidates of a shot together.
    pub async fn create_set(&self, mut set: NewSet) -> Result<SubmitOutcome, EngineError> {
        self.place_cutouts(&mut set)?;
        self.check_set(&set)?;
        // Each photo once per provider (a shot's candidates all cut out the same one).
        let mut seen = std::collections::HashSet::new();
        for t in set.shot_tasks("") {
            if t.source.as_ref().is_some_and(|s| seen.insert((t.provider.clone(), s.id.clone()))) {
                self.check_source(&t).await?;
            }
        }
        let out = self.shared.store.create_set(set, self.shared.now()).await?;
        if matches!(out, SubmitOutcome::Created(_)) {
            self.shared.wake_dispatcher.notify_one();
        }
        Ok(out)
    }

    /// Give each shot cut out of a photo (`main_white`) the provider that cuts it out: the
    /// set's own when it offers `cutout`, else the first configured provider (by name) that
    /// does. Refused in plain words when none does.
    pub(super) fn place_cutouts(&self, set: &mut NewSet) -> Result<(), EngineError> {
        let offers =
            |name: &str| self.shared.providers.get(name).is_some_and(|p| p.operations.contains(&Operation::Cutout));
        let fallback = || {
            let all = self.shared.providers.values();
            let mut names: Vec<String> =
                all.iter().filter(|p| p.operations.contains(&Operation::Cutout)).map(|p| p.name.clone()).collect();
            names.sort();
            names.into_iter().next()
        };
        for (i, shot) in set.shots.iter_mut().enumerate() {
            if shot.source.is_none() {
                continue;
            }
            let chosen = match &shot.provider {
                Some(p) => Some(p.clone()),
                None if offers(&set.provider) => None,
                None => Some(fallback().ok_or_else(|| {
                    EngineError::Invalid(say_with("say.error_no_cutout_provider", &[("n", &(i + 1).to_string())]))
                })?),
            };
            shot.provider = chosen;
        }
        Ok(())
    }

    /// The checks on a new set before anything is stored (also a confirmed draft's set).
    pub(super) fn check_set(&self, set: &NewSet) -> Result<(), EngineError> {
        validate_key(set.idempotency_key.as_deref())?;
        if set.product.trim().is_empty() {
            return Err(EngineError::Invalid(say("say.error_product_empty")));
        }
        if set.shots.is_empty() || set.shots.len() > MAX_SHOTS {
            return Err(EngineError::Invalid(say_with("say.error_shots_count", &[("max", &MAX_SHOTS.to_string())])));
        }
        if set.references.len() > MAX_REFERENCES {
            return Err(EngineError::Invalid(say_with(
                "say.error_refs_count",
                &[("max", &MAX_REFERENCES.to_string())],
            )));
        }
        for (i, shot) in set.shots.iter().enumerate() {
            if !SHOT_ROLES.contains(&shot.role.as_str()) {
                return Err(EngineError::Invalid(format!(
                    "shot {}: role `{}` is not one of {}",
                    i + 1,
                    shot.role,
                    SHOT_ROLES.join(", ")
                )));
            }
            let t = NewTask {
                provider: shot.provider.clone().unwrap_or_else(|| set.provider.clone()),
                prompt: set.shot_prompt(shot),
                params: shot.params.clone(),
                operation: shot.operation(),
                source: shot.source.clone(),
                ..NewTask::default()
            };
            self.validate(&t).map_err(|e| {
                let what = match e {
                    EngineError::Invalid(m) => m,
                    other => other.to_string(),
                };
                EngineError::Invalid(say_with("say.error_shot", &[("n", &(i + 1).to_string()), ("what", &what)]))
            })?;
            let n = (i + 1).to_string();
            match (shot.role.as_str(), &shot.source) {
                ("main_white", None) => {
                    return Err(EngineError::Invalid(say_with("say.error_main_white_needs_photo", &[("n", &n)])));
                }
                ("main_white", Some(_)) => {}
                (_, Some(_)) => {
                    return Err(EngineError::Invalid(say_with("say.error_source_only_white", &[("n", &n)])));
                }
                (_, None) if shot.prompt.trim().is_empty() => {
                    return Err(EngineError::Invalid(say_with(
                        "say.error_shot",
                        &[("n", &(i + 1).to_string()), ("what", &say("say.error_prompt_empty"))],
                    )));
                }
                _ => {}
            }
            if let Some(o) = &shot.overlay {
                if shot.role == "main_white" {
                    return Err(EngineError::Invalid(say_with("say.error_overlay_on_white", &[("n", &n)])));
                }
                // A square frame here; the delivery checks the profile's own shape again.
                crate::delivery::overlay::check(o, 1000, 1000)
                    .map_err(|e| EngineError::Invalid(say_with("say.error_shot", &[("n", &n), ("what", &e.said())])))?;
            }
            if !(1..=MAX_CANDIDATES).contains(&shot.candidates) {
                let what = say_with(
                    "say.error_candidates",
                    &[("max", &MAX_CANDIDATES.to_string()), ("n", &shot.candidates.to_string())],
                );
                return Err(EngineError::Invalid(say_with(
                    "say.error_shot",
                    &[("n", &(i + 1).to_string()), ("what", &what)],
                )));
            }
        }
        Ok(())
    }

    /// Durably add `count` (1 to [`MAX_CANDIDATES`]) candidates to shot `position` of a set.
    /// Whether the caller acknowledged a possible charge is the API's to check first.
    pub async fn add_candidates(
        &self,
        set: &str,
        position: i64,
        count: u32,
        op: Option<CandidateOp>,
    ) -> Result<AddOutcome, EngineError> {
        if !(1..=MAX_CANDIDATES).contains(&count) {
            return Err(EngineError::Invalid(say_with(
                "say.error_count",
                &[("max", &MAX_CANDIDATES.to_string()), ("n", &count.to_string())],
            )));
        }
        if let Some(op) = &op {
            // The operation's own checks, as for a task of its own (the shot is checked by
            // the store, under the set's lock).
            let t = NewTask {
                provider: op.provider.clone(),
                prompt: op.prompt.clone(),
                operation: op.operation,
                source: Some(Source { kind: SourceKind::Artifact, id: op.artifact.clone() }),
                ..NewTask::default()
            };
            self.validate(&t)?;
            self.check_source(&t).await?;
        }
        let out = self.shared.store.add_candidates(set.into(), position, count, op, self.shared.now()).await?;
        if matches!(out, AddOutcome::Added(_)) {
            self.shared.wake_dispatcher.notify_one();
        }
        Ok(out)
    }

    /// Choose (or, with `None`, clear) the image of shot `position` of a set.
    pub async fn choose(
        &self,
        set: &str,
        position: i64,
        artifact: Option<String>,
    ) -> Result<ChoiceOutcome, EngineError> {
        Ok(self.shared.store.choose(set.into(), position, artifact, self.shared.now()).await?)
    }
}
