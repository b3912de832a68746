//! Deliveries through the engine (issue #26): making a delivery (checks, file names, the
//! durable record) and the runner that writes its items to the target.
//!
//! The runner takes one delivery at a time ([`Store::claim_delivery`]) and, per item not yet
//! delivered: renders the file with the profile (off the async threads), records the item
//! `writing` with the file's sha256 (durable, before anything is written), writes it to the
//! target (no transaction is open across the write), and confirms `delivered`, `failed` or
//! `unknown`. An item that was recorded `writing` before (a crash, a retry of an `unknown`
//! one) is settled by **looking** at the target first: the same sha256 there → delivered,
//! nothing written; nothing there → written again (every target's write is a create that
//! never overwrites, so a write that lands late is found, not doubled); another file there →
//! failed, never overwritten; the target cannot tell → unknown. So a crash at any point
//! resumes without a silent half-delivery, under the condition that the target honours
//! "create, never overwrite" (a local folder does; S3 when it honours `If-None-Match`).
//! When every item is settled, `manifest.csv` and `manifest.json` (its delivered files) are
//! written beside the files, replacing an earlier delivery's, and only then is the delivery's
//! own state (`delivered`, …) recorded.
//!
//! Idle means idle: the runner sleeps until it is woken (a delivery made or retried), until
//! the earliest lease of a delivery being delivered runs out (to take over one whose runner
//! died), or until shutdown. At start-up it first takes over, lease or not, every delivery
//! left `delivering` by a run it knows is dead: on SQLite any earlier run (the data-directory
//! lock proves it dead); on PostgreSQL this node's earlier runs (a run's id is
//! `{node}/{boot}`, and the node's lock proves its earlier runs dead) — another node's wait
//! for their lease.
//!
//! Past 600 lines: the runner's per-kind paths (a file written by name; a Shopify item's flow,
//! `deliver_shopify`) share its claim, holder checks and crash points, and read best together.

use std::sync::Arc;

use crate::config::DeliveryConfig;
use crate::delivery::manifest::{self, ManifestRow};
use crate::delivery::names::{NameParts, file_names};
use crate::delivery::profile::Profile;
use crate::delivery::render;
use crate::delivery::target::{ItemClock, Look, Put, Stored, Target, TargetError, tidy_reason};
use crate::domain::Millis;
use crate::store::{
    DeliveryCreateOutcome, DeliveryItemView, DeliveryView, FileFacts, ItemOutcome, ItemState, NewDelivery,
    NewDeliveryItem, RetryDeliveryOutcome, SetView, Store, StoreError, delivery_blocking, shot_label,
};

use super::{Engine, EngineError, Shared};

/// The crash points of a delivery, in order (`--features failpoints`): once the run holds it
/// (`deliver-after-claim`), around each item's write (`-after-writing`: recorded, nothing
/// written; `-after-put`: written, not confirmed; `-after-confirm`), and once the manifest is
/// written but the delivery's own state is not (`deliver-after-manifest`).
pub const DELIVERY_POINTS: &[&str] = &[
    "deliver-after-claim",
    "deliver-after-writing",
    "deliver-after-put",
    "deliver-after-confirm",
    "deliver-after-manifest",
];

/// What the engine knows about deliveries: the profiles and targets a delivery may name.
pub(crate) struct Setup {
    config: DeliveryConfig,
    data_dir: std::path::PathBuf,
    /// The longest time one item may take at any target (`timeout_ms`, plus `retry_for_ms`
    /// for s3): the lease is derived from it, so a run that is still within an item's
    /// deadline never loses its delivery to another.
    lease_ms: Millis,
    /// The chosen images' pixel sizes already read, for a set's `delivery.blocking`
    /// (`engine::readiness`).
    pub(super) sizes: super::readiness::SizeCache,
    /// Tells live views that a delivery or one of its items changed (`GET /v1/stream`'s
    /// `delivery` events); nobody listening is fine.
    changes: tokio::sync::broadcast::Sender<DeliveryChange>,
}

/// A delivery (or one of its items) changed: made, an item recorded `writing` or confirmed,
/// settled, or retried. Live views re-read the delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct DeliveryChange {
    pub delivery_id: String,
    pub set_id: String,
}

impl Setup {
    fn changed(&self, d: &DeliveryView) {
        if self.changes.receiver_count() > 0 {
            let _ = self.changes.send(DeliveryChange { delivery_id: d.id.clone(), set_id: d.set_id.clone() });
        }
    }
}

impl Setup {
    pub(super) fn profile(&self, name: &str) -> Option<&Profile> {
        self.config.profile(name)
    }

    fn target(&self, name: &str) -> Option<crate::delivery::target::TargetConfig> {
        self.config.target(name, &self.data_dir)
    }
}

/// What asking for a delivery did ([`Engine::deliver`]).
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub enum DeliverOutcome {
    /// Recorded and queued.
    Created(DeliveryView),
    NoSet,
    /// No profile of that name (the names that exist).
    UnknownProfile(Vec<String>),
    /// No target of that name (the names that exist).
    UnknownTarget(Vec<String>),
    /// Not delivered: why, in plain words (no chosen image, or an image that does not meet the
    /// profile without `force`).
    Blocked(Vec<String>),
}

impl Engine {
    /// Give the engine its delivery profiles and targets and start the delivery runner (once;
    /// the daemon calls it right after [`Engine::start`]). Deliveries left `delivering` by an
    /// earlier run are resumed by looking at their targets first.
    pub fn start_deliveries(&self, config: DeliveryConfig) {
        let lease_ms = config
            .targets(&self.shared.data_dir)
            .iter()
            .map(|t| t.item_budget_ms() as Millis)
            .max()
            .unwrap_or(30_000)
            .saturating_mul(2)
            .saturating_add(60_000);
        let setup = Setup {
            config,
            data_dir: self.shared.data_dir.clone(),
            lease_ms,
            sizes: Default::default(),
            changes: tokio::sync::broadcast::channel(256).0,
        };
        if self.shared.delivery.set(setup).is_ok() {
            let h = tokio::spawn(run(self.shared.clone()));
            self.services.lock().unwrap_or_else(|e| e.into_inner()).push(h);
        }
    }

    pub(super) fn setup(&self) -> Result<&Setup, EngineError> {
        self.shared
            .delivery
            .get()
            .ok_or_else(|| EngineError::Invalid("deliveries are not set up in this engine".into()))
    }

    /// The names of the profiles and targets a delivery may name.
    pub fn delivery_names(&self) -> (Vec<String>, Vec<String>) {
        match self.shared.delivery.get() {
            Some(s) => (
                s.config.profiles.iter().map(|p| p.name.clone()).collect(),
                s.config.targets(&s.data_dir).into_iter().map(|t| t.name).collect(),
            ),
            None => (Vec::new(), Vec::new()),
        }
    }

    /// Subscribe to delivery changes (`None` before [`Engine::start_deliveries`]). A receiver
    /// that falls behind gets `Lagged` and should re-read what it shows.
    pub fn subscribe_deliveries(&self) -> Option<tokio::sync::broadcast::Receiver<DeliveryChange>> {
        self.shared.delivery.get().map(|s| s.changes.subscribe())
    }

    /// Every profile a delivery may name (built-ins first), for `GET /v1/delivery/profiles`.
    pub fn delivery_profiles(&self) -> Vec<Profile> {
        self.shared.delivery.get().map(|s| s.config.profiles.clone()).unwrap_or_default()
    }

    /// Every target a delivery may name, resolved (a relative folder inside the data
    /// directory; `exports` added), for `GET /v1/delivery/targets`.
    pub fn delivery_targets(&self) -> Vec<crate::delivery::target::TargetConfig> {
        self.shared.delivery.get().map(|s| s.config.targets(&s.data_dir)).unwrap_or_default()
    }

    /// Make a delivery of set `set_id`'s chosen images with `profile` to `target`: refused
    /// with the reasons while a shot has no chosen image, or (unless `force`) while a chosen
    /// image does not meet the profile; otherwise recorded with one queued item per shot and
    /// handed to the runner.
    pub async fn deliver(
        &self,
        set_id: &str,
        profile: &str,
        target: &str,
        force: bool,
        shopify_product: Option<&str>,
    ) -> Result<DeliverOutcome, EngineError> {
        let req = DeliverRequest { profile, target, force, shopify_product, ..DeliverRequest::default() };
        self.deliver_with(set_id, &req).await
    }

    /// [`Engine::deliver`] with a profile per shot role beside the default (`profiles`: role →
    /// profile name), since a marketplace's rules differ between its main image and the others.
    pub async fn deliver_with(&self, set_id: &str, req: &DeliverRequest<'_>) -> Result<DeliverOutcome, EngineError> {
        let DeliverRequest { profile, target, force, shopify_product, profiles: by_role } = *req;
        let setup = self.setup()?;
        let (profiles, targets) = self.delivery_names();
        let Some(profile) = setup.profile(profile).cloned() else {
            return Ok(DeliverOutcome::UnknownProfile(profiles));
        };
        let mut role_profiles: std::collections::BTreeMap<String, Profile> = std::collections::BTreeMap::new();
        for (role, name) in by_role {
            if !crate::store::SHOT_ROLES.contains(&role.as_str()) {
                return Err(EngineError::Invalid(format!(
                    "`profiles` names the shot role `{role}`; the roles are: {}",
                    crate::store::SHOT_ROLES.join(", ")
                )));
            }
            let Some(p) = setup.profile(name).cloned() else {
                return Err(EngineError::Invalid(format!(
                    "`profiles` names the profile `{name}` for `{role}`, and there is none; the profiles are: {}",
                    profiles.join(", ")
                )));
            };
            role_profiles.insert(role.clone(), p);
        }
        let profile_of =
            |role: Option<&str>| -> &Profile { role.and_then(|r| role_profiles.get(r)).unwrap_or(&profile) };
        let Some(target_cfg) = setup.target(target) else {
            return Ok(DeliverOutcome::UnknownTarget(targets));
        };
        let shopify_product = shopify_product.map(str::trim).filter(|p| !p.is_empty());
        match (&target_cfg.kind, shopify_product) {
            (crate::delivery::target::TargetKind::Shopify(_), None) => {
                return Err(EngineError::Invalid(format!(
                    "the target `{target}` is a Shopify shop: name the product (`shopify_product`, --product-id) as \
                     gid://shopify/Product/… or its handle"
                )));
            }
            (crate::delivery::target::TargetKind::Shopify(_), Some(p)) if !is_product_ref(p) => {
                return Err(EngineError::Invalid(
                    "`shopify_product` must be gid://shopify/Product/… or a product handle (lowercase letters, digits, \
                     dashes)"
                        .into(),
                ));
            }
            (crate::delivery::target::TargetKind::Shopify(_), Some(_)) => {}
            (_, Some(_)) => {
                return Err(EngineError::Invalid(format!(
                    "`shopify_product` is only for a shopify target; `{target}` is not one"
                )));
            }
            (_, None) => {}
        }
        let store = &self.shared.store;
        let Some(set) = store.get_set(set_id.into()).await? else { return Ok(DeliverOutcome::NoSet) };
        let blocking = delivery_blocking(&set);
        if !blocking.is_empty() {
            return Ok(DeliverOutcome::Blocked(blocking));
        }
        let chosen = chosen_images(&set)?;
        // A chosen image whose stored bytes fail their sha256 check is refused before anything is
        // recorded (a 409 naming the shot and the image), with or without `force`.
        let mut damaged = Vec::new();
        for c in &chosen {
            let subject = crate::domain::words::say_with(
                "say.chosen_image_of",
                &[("shot", &shot_label(&c.roles, c.position as usize))],
            );
            let (s, id) = (store.clone(), c.artifact_id.clone());
            let read = tokio::task::spawn_blocking(move || s.read_image_bytes_blocking(&id).map(|_| ()))
                .await
                .map_err(|e| EngineError::Invalid(format!("checking the images stopped: {e}")))?;
            match read {
                Ok(()) => {}
                Err(StoreError::Damaged { .. }) => damaged.push(crate::domain::words::say_with(
                    "say.chosen_damaged",
                    &[("subject", &subject), ("id", &c.artifact_id)],
                )),
                Err(e) => return Err(e.into()),
            }
        }
        if !damaged.is_empty() {
            return Ok(DeliverOutcome::Blocked(damaged));
        }
        // The files the check renders are kept for the runner's render (each image is rendered
        // once per delivery: `delivery::kept`); given up again unless the delivery is made.
        let overlay_of = |c: &Chosen| set.overlays.get(c.position as usize).cloned().flatten();
        let mut kept = KeptFiles { ids: Vec::new() };
        if !force {
            let mut problems = Vec::new();
            for c in &chosen {
                let subject = crate::domain::words::say_with(
                    "say.chosen_image_of",
                    &[("shot", &shot_label(&c.roles, c.position as usize))],
                );
                let (s, id, p) = (store.clone(), c.artifact_id.clone(), profile_of(c.role.as_deref()).clone());
                let (white, overlay) = (c.role.as_deref() == Some("main_white"), overlay_of(c));
                let key = kept_key(&id, &render::Listing { white, overlay: overlay.as_ref() });
                kept.ids.push((key.clone(), p.clone()));
                let found = tokio::task::spawn_blocking(move || -> Result<Vec<String>, StoreError> {
                    let Some((_, bytes)) = s.read_image_bytes_blocking(&id)? else {
                        return Ok(vec![crate::domain::words::say_with("say.chosen_gone", &[("subject", &subject)])]);
                    };
                    let listing = render::Listing { white, overlay: overlay.as_ref() };
                    let (found, file) = render::check_listing(&p, &bytes, &listing, &subject);
                    if let (true, Some(file)) = (found.is_empty(), file) {
                        crate::delivery::kept::kept().keep(&key, &p, file);
                    }
                    Ok(found.into_iter().map(|p| p.message).collect())
                })
                .await
                .map_err(|e| EngineError::Invalid(format!("checking the images stopped: {e}")))??;
                problems.extend(found);
            }
            if !problems.is_empty() {
                return Ok(DeliverOutcome::Blocked(problems));
            }
        }
        let ext_of = |p: &Profile, media_type: &str| match p.render {
            Some(r) => r.format.ext(),
            None => crate::domain::extension(media_type),
        };
        // One pattern (the default profile's) keeps every name distinct; `{profile}` and
        // `{ext}` are each item's own.
        let parts: Vec<NameParts<'_>> = chosen
            .iter()
            .map(|c| {
                let p = profile_of(c.role.as_deref());
                NameParts {
                    product: &set.product,
                    role: c.role.as_deref(),
                    index: c.position as usize + 1,
                    profile: &p.name,
                    ext: ext_of(p, &c.media_type),
                }
            })
            .collect();
        let names = file_names(&profile.file_name, &parts);
        let items = chosen
            .iter()
            .zip(names)
            .map(|(c, file_name)| {
                let own = profile_of(c.role.as_deref());
                NewDeliveryItem {
                    position: c.position,
                    task_id: c.task_id.clone(),
                    artifact_id: c.artifact_id.clone(),
                    shot_role: c.role.clone(),
                    file_name,
                    profile: (own.name != profile.name).then(|| own.name.clone()),
                    overlay: overlay_of(c),
                }
            })
            .collect();
        let d = NewDelivery {
            set_id: set.id.clone(),
            profile: profile.name.clone(),
            target: target.into(),
            forced: force,
            shopify_product: shopify_product.map(String::from),
            items,
        };
        match store.create_delivery(d, self.shared.now()).await? {
            DeliveryCreateOutcome::Created(view) => {
                kept.ids.clear();
                setup.changed(&view);
                self.shared.wake_deliveries.notify_one();
                Ok(DeliverOutcome::Created(view))
            }
            DeliveryCreateOutcome::NoSet => Ok(DeliverOutcome::NoSet),
            DeliveryCreateOutcome::ChoiceChanged(why) => Ok(DeliverOutcome::Blocked(vec![why])),
        }
    }

    /// Send again what a finished delivery did not deliver (see [`Store::retry_delivery`]).
    pub async fn retry_delivery(&self, id: &str) -> Result<RetryDeliveryOutcome, EngineError> {
        let out = self.shared.store.retry_delivery(id.into(), self.shared.now()).await?;
        if let RetryDeliveryOutcome::Requeued(d, _) = &out {
            if let Some(setup) = self.shared.delivery.get() {
                setup.changed(d);
            }
            self.shared.wake_deliveries.notify_one();
        }
        Ok(out)
    }
}

/// Whether `p` looks like a product reference: a product gid or a handle.
fn is_product_ref(p: &str) -> bool {
    let ok_handle = |h: &str| {
        !h.is_empty()
            && h.len() <= 255
            && h.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
    };
    match p.strip_prefix("gid://shopify/Product/") {
        Some(n) => !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()),
        None => ok_handle(p),
    }
}

/// The deterministic name a delivery's item has at a Shopify shop (found by it after a lost
/// answer): the delivery's id, then the item's file name.
fn shopify_file_name(delivery: &str, file_name: &str) -> String {
    let id: String = delivery.chars().filter(|c| c.is_ascii_alphanumeric()).collect();
    format!("tally-{id}-{file_name}")
}

/// What a delivery is asked for ([`Engine::deliver_with`]).
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct DeliverRequest<'a> {
    /// The default profile.
    pub profile: &'a str,
    pub target: &'a str,
    /// Deliver although a chosen image does not meet its profile.
    pub force: bool,
    pub shopify_product: Option<&'a str>,
    /// A profile per shot role (`main_white` → `amazon_main`), beside the default.
    pub profiles: &'a std::collections::BTreeMap<String, String>,
}

impl Default for DeliverRequest<'_> {
    fn default() -> Self {
        static NONE: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
        DeliverRequest { profile: "", target: "", force: false, shopify_product: None, profiles: &NONE }
    }
}

/// A shot's chosen image, with what its item and file name need.
struct Chosen {
    position: i64,
    task_id: String,
    artifact_id: String,
    media_type: String,
    role: Option<String>,
    roles: Vec<Option<String>>,
}

/// Every shot's chosen image (the set has no blocking reason: each shot has one).
fn chosen_images(set: &SetView) -> Result<Vec<Chosen>, EngineError> {
    let roles: Vec<Option<String>> = set.shots.iter().map(|t| t.shot_role.clone()).collect();
    let mut out = Vec::new();
    for (i, shot) in set.shots.iter().enumerate() {
        let Some(Some(artifact)) = set.chosen.get(i) else { continue };
        let cands = set.candidates.get(i).map(Vec::as_slice).unwrap_or(&[]);
        let found = cands.iter().find_map(|t| t.artifacts.iter().find(|a| &a.id == artifact).map(|a| (t, a)));
        let Some((task, art)) = found else {
            return Err(EngineError::Invalid(format!(
                "the chosen image {artifact} of shot {} is not among its candidates",
                i + 1
            )));
        };
        out.push(Chosen {
            position: shot.set_position.unwrap_or(i as i64),
            task_id: task.id.clone(),
            artifact_id: art.id.clone(),
            media_type: art.media_type.clone(),
            role: shot.shot_role.clone(),
            roles: roles.clone(),
        });
    }
    Ok(out)
}

/// The delivery runner (see the module docs).
pub(crate) async fn run(shared: Arc<Shared>) {
    let Some(setup) = shared.delivery.get() else { return };
    let mut shutdown = shared.shutdown.subscribe();
    // What an earlier, dead run left `delivering` is taken over at once (see the module docs):
    // on SQLite every other run; on PostgreSQL this node's own.
    let mut takeover = Some(match &shared.store {
        Store::Sqlite(_) => String::new(),
        Store::Postgres(p) => format!("{}/", p.node()),
    });
    loop {
        if shared.stopping() {
            return;
        }
        let notified = shared.wake_deliveries.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let boot = runner_id(&shared);
        match shared.store.claim_delivery(boot.clone(), shared.now(), setup.lease_ms, takeover.clone()).await {
            Ok(Some(d)) => {
                crate::failpoint::crash("deliver-after-claim");
                if let Err(e) = deliver_one(&shared, setup, &boot, d).await {
                    tracing::warn!(error = %e, "a delivery stopped; it is resumed once its lease runs out");
                    if e.severity() == crate::store::Severity::Fatal {
                        shared.give_up(e.to_string());
                        return;
                    }
                }
                continue;
            }
            Ok(None) => takeover = None,
            Err(e) => {
                tracing::warn!(error = %e, "could not look for deliveries to make");
                if e.severity() == crate::store::Severity::Fatal {
                    shared.give_up(e.to_string());
                    return;
                }
            }
        }
        let wait_ms = match shared.store.next_delivery_lease_end().await {
            Ok(Some(end)) => Some((end - shared.now()).max(0) + 1),
            Ok(None) => None,
            // The store failed just now: look again in a while rather than never.
            Err(_) => Some(1_000),
        };
        let sleep = async {
            match wait_ms {
                Some(ms) => tokio::time::sleep(std::time::Duration::from_millis(ms as u64)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = notified => {}
            _ = sleep => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// This run's id as a delivery's `runner`: the engine's boot id, prefixed on PostgreSQL with
/// the node's name and `/` (node names have no `/`), so a restarted node knows its own
/// earlier runs.
fn runner_id(shared: &Shared) -> String {
    match &shared.store {
        Store::Sqlite(_) => shared.boot(),
        Store::Postgres(p) => format!("{}/{}", p.node(), shared.boot()),
    }
}

/// The files [`Engine::deliver`]'s check kept for a delivery (`delivery::kept`), given up
/// when it returns without making the delivery (its `ids` are cleared once it is made).
struct KeptFiles {
    ids: Vec<(String, Profile)>,
}

impl Drop for KeptFiles {
    fn drop(&mut self) {
        for (id, profile) in &self.ids {
            crate::delivery::kept::kept().forget(id, profile);
        }
    }
}

/// The key a file is kept under: the chosen image and what the shot adds to it.
fn kept_key(artifact_id: &str, listing: &render::Listing<'_>) -> String {
    format!("{artifact_id}{}", listing.key())
}

/// The file an item's image makes with `profile` (rendered off the async threads), or the
/// one the delivery's check rendered and kept.
async fn render_item(store: &Store, profile: &Profile, item: &DeliveryItemView) -> Result<render::Rendered, String> {
    let (s, id, p) = (store.clone(), item.artifact_id.clone(), profile.clone());
    let (white, overlay) = (item.shot_role.as_deref() == Some("main_white"), item.overlay.clone());
    tokio::task::spawn_blocking(move || {
        // Tests hold a delivery open here (`deliver-before-render=sleep(ms)`): prune must wait.
        crate::failpoint::pause("deliver-before-render");
        let listing = render::Listing { white, overlay: overlay.as_ref() };
        if let Some(file) = crate::delivery::kept::kept().take(&kept_key(&id, &listing), &p) {
            return Ok(file);
        }
        let Some((_, bytes)) = s.read_image_bytes_blocking(&id).map_err(|e| e.to_string())? else {
            return Err(crate::domain::words::say_with("say.delivery_image_gone", &[("id", &id)]));
        };
        render::render_listing(&p, &bytes, &listing).map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| crate::domain::words::say_with("say.delivery_making_stopped", &[("why", &e.to_string())]))?
}

fn different(name: &str, there: Option<&str>) -> ItemOutcome {
    let sha = there.map(|s| format!(" (sha256 {s})")).unwrap_or_default();
    ItemOutcome::Failed {
        why: crate::domain::words::say_with("say.delivery_already_there", &[("name", name), ("sha", &sha)]),
        retry_safe: true,
    }
}

/// A failed write in words: nothing was written, so a retry is safe (every write is a create
/// that never overwrites).
fn failed(e: TargetError) -> ItemOutcome {
    ItemOutcome::Failed { why: e.words().to_string(), retry_safe: true }
}

/// Deliver the open items of a delivery this run holds, then write its manifest.
async fn deliver_one(shared: &Shared, setup: &Setup, boot: &str, d: DeliveryView) -> Result<(), StoreError> {
    // What an earlier run left behind was written before now (see `Target::sweep`).
    let taken_at = std::time::SystemTime::now();
    let store = &shared.store;
    let open: Vec<&DeliveryItemView> =
        d.items.iter().filter(|i| matches!(i.state, ItemState::Queued | ItemState::Writing)).collect();
    setup.changed(&d);
    let view = &d;
    let confirm = |item: &DeliveryItemView, outcome: ItemOutcome| {
        // Every reason is kept short and without credentials, whatever a destination said.
        let outcome = match outcome {
            ItemOutcome::Failed { why, retry_safe } => ItemOutcome::Failed { why: tidy_reason(&why, &[]), retry_safe },
            ItemOutcome::Unknown { why } => ItemOutcome::Unknown { why: tidy_reason(&why, &[]) },
            other => other,
        };
        let done = store.confirm_delivery_item(d.id.clone(), item.position, boot.to_string(), outcome, shared.now());
        async move {
            let out = done.await;
            setup.changed(view);
            out
        }
    };
    let target = match setup.target(&d.target) {
        None => Err(crate::domain::words::say_with("say.delivery_target_gone", &[("target", &d.target)])),
        Some(cfg) => Target::from_config(&cfg).map_err(|e| e.words().to_string()),
    };
    // The files of this delivery at a Shopify product so far (kept by `placement = "replace"`).
    let mut kept: Vec<String> = d.items.iter().filter_map(|i| i.remote_id.clone()).collect();
    for item in open {
        // Each item's own profile (a profile per shot role), else the delivery's.
        let profile_name = item.profile.as_deref().unwrap_or(&d.profile);
        let profile = setup.profile(profile_name).cloned();
        let (profile, target) = match (&profile, &target) {
            (Some(p), Ok(t)) => (p, t),
            (None, _) => {
                let why = crate::domain::words::say_with("say.delivery_profile_gone", &[("profile", profile_name)]);
                let outcome = if item.state == ItemState::Writing {
                    let clock = target.as_ref().ok().map(Target::clock);
                    settle_by_look(target.as_ref().ok(), item, clock.as_ref()).await
                } else {
                    None
                };
                let outcome = outcome.unwrap_or(ItemOutcome::Failed { why, retry_safe: true });
                if confirm(item, outcome).await?.is_none() {
                    return Ok(());
                }
                continue;
            }
            (_, Err(why)) => {
                let outcome = if item.state == ItemState::Writing {
                    ItemOutcome::Unknown {
                        why: crate::domain::words::say_with("say.interrupted_unreachable", &[("why", why)]),
                    }
                } else {
                    ItemOutcome::Failed { why: why.clone(), retry_safe: true }
                };
                if confirm(item, outcome).await?.is_none() {
                    return Ok(());
                }
                continue;
            }
        };
        if let Target::Shopify { target: shop, .. } = target {
            let outcome = deliver_shopify(shared, setup, boot, &d, item, profile, shop, &kept).await?;
            let Some(outcome) = outcome else { return Ok(()) };
            if let ItemOutcome::DeliveredAs { remote_id } = &outcome {
                kept.push(remote_id.clone());
            }
            if confirm(item, outcome).await?.is_none() {
                return Ok(());
            }
            crate::failpoint::crash("deliver-after-confirm");
            continue;
        }
        // One deadline for every step of this item (looking, writing, reading back).
        let clock = target.clock();
        // Written (or maybe written) before: look first, when the target can find a file by
        // name; one that cannot is left unknown rather than written twice.
        if item.sha256.is_some() && !target.capabilities().can_settle() {
            let why = "its write was interrupted and this target cannot look a file up by name".to_string();
            if confirm(item, ItemOutcome::Unknown { why }).await?.is_none() {
                return Ok(());
            }
            continue;
        }
        if item.sha256.is_some()
            && let Some(outcome) = settle_by_look(Some(target), item, Some(&clock)).await
        {
            if confirm(item, outcome).await?.is_none() {
                return Ok(());
            }
            continue;
        }
        let file = match render_item(store, profile, item).await {
            Ok(f) => f,
            Err(why) => {
                if confirm(item, ItemOutcome::Failed { why, retry_safe: true }).await?.is_none() {
                    return Ok(());
                }
                continue;
            }
        };
        let facts = FileFacts {
            sha256: file.sha256.clone(),
            bytes: file.bytes.len() as i64,
            width: i64::from(file.width),
            height: i64::from(file.height),
        };
        let held = store
            .record_delivery_writing(d.id.clone(), item.position, boot.to_string(), facts, shared.now(), setup.lease_ms)
            .await?;
        if !held {
            return Ok(());
        }
        setup.changed(&d);
        crate::failpoint::crash("deliver-after-writing");
        let answer = target.put(&item.file_name, file.bytes, &file.sha256, &clock).await;
        crate::failpoint::crash("deliver-after-put");
        let outcome = match answer {
            Ok(Stored { put: Put::Written | Put::AlreadyThere, remote_id: Some(remote_id) }) => {
                ItemOutcome::DeliveredAs { remote_id }
            }
            Ok(Stored { put: Put::Written | Put::AlreadyThere, remote_id: None }) => ItemOutcome::Delivered,
            Ok(Stored { put: Put::Different { existing_sha256 }, .. }) => {
                different(&item.file_name, existing_sha256.as_deref())
            }
            // The target has looked already (a folder by its file, a bucket by reading back).
            Err(TargetError::Ambiguous(why)) => ItemOutcome::Unknown { why },
            Err(e) => failed(e),
        };
        if confirm(item, outcome).await?.is_none() {
            return Ok(());
        }
        crate::failpoint::crash("deliver-after-confirm");
    }
    // Every item is settled: the manifest, then the delivery's state (so a delivery that says
    // it ended has its manifest beside its files).
    if let Ok(target) = &target {
        write_manifest(shared, target, &d.id).await;
        let (own_csv, own_json) = manifest::names_for(&d.id);
        let mut names: Vec<String> = d.items.iter().map(|i| i.file_name.clone()).collect();
        names.extend([own_csv, own_json, manifest::CSV_NAME.into(), manifest::JSON_NAME.into()]);
        target.sweep(names, taken_at).await;
    }
    crate::failpoint::crash("deliver-after-manifest");
    store.settle_delivery(d.id.clone(), boot.to_string(), shared.now()).await?;
    setup.changed(&d);
    Ok(())
}

/// One item to a Shopify product: rendered, recorded `writing` (durable, before anything is
/// sent), then the flow of [`crate::delivery::shopify::ShopifyTarget::deliver`], which looks
/// its file up by name first — so an item recorded `writing` before (a crash, a lost answer)
/// is settled by that lookup, never created twice. `None` when this run no longer holds the
/// delivery.
#[allow(clippy::too_many_arguments)]
async fn deliver_shopify(
    shared: &Shared,
    setup: &Setup,
    boot: &str,
    d: &DeliveryView,
    item: &DeliveryItemView,
    profile: &Profile,
    shop: &crate::delivery::shopify::ShopifyTarget,
    kept: &[String],
) -> Result<Option<ItemOutcome>, StoreError> {
    let store = &shared.store;
    let Some(product) = d.shopify_product.as_deref() else {
        let why = "the delivery names no Shopify product (`shopify_product`)".to_string();
        return Ok(Some(ItemOutcome::Failed { why, retry_safe: true }));
    };
    let file = match render_item(store, profile, item).await {
        Ok(f) => f,
        Err(why) => return Ok(Some(ItemOutcome::Failed { why, retry_safe: true })),
    };
    let facts = FileFacts {
        sha256: file.sha256.clone(),
        bytes: file.bytes.len() as i64,
        width: i64::from(file.width),
        height: i64::from(file.height),
    };
    let held = store
        .record_delivery_writing(d.id.clone(), item.position, boot.to_string(), facts, shared.now(), setup.lease_ms)
        .await?;
    if !held {
        return Ok(None);
    }
    setup.changed(d);
    crate::failpoint::crash("deliver-after-writing");
    let name = shopify_file_name(&d.id, &item.file_name);
    let budget = setup.target(&d.target).map(|t| t.timeout_ms).unwrap_or(30_000);
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(budget);
    let answer = shop.deliver(product, &name, file.bytes, kept, deadline).await;
    crate::failpoint::crash("deliver-after-put");
    Ok(Some(match answer {
        Ok(remote_id) => ItemOutcome::DeliveredAs { remote_id },
        Err(TargetError::Ambiguous(why)) => ItemOutcome::Unknown { why },
        Err(e) => failed(e),
    }))
}

/// Settle an item that was recorded `writing` (or sent before) by looking at the target,
/// within the item's `clock`: `None` means nothing is there, so it is to be written.
async fn settle_by_look(
    target: Option<&Target>,
    item: &DeliveryItemView,
    clock: Option<&ItemClock>,
) -> Option<ItemOutcome> {
    let (Some(target), Some(clock)) = (target, clock) else {
        return Some(ItemOutcome::Unknown { why: crate::domain::words::say("say.interrupted_no_target") });
    };
    let want = item.sha256.as_deref().unwrap_or("");
    let bytes = item.bytes.and_then(|b| u64::try_from(b).ok());
    match target.look(&item.file_name, bytes, clock).await {
        Ok(Look::Present { sha256, remote_id }) if sha256.eq_ignore_ascii_case(want) => Some(match remote_id {
            Some(remote_id) => ItemOutcome::DeliveredAs { remote_id },
            None => ItemOutcome::Delivered,
        }),
        Ok(Look::Present { sha256, .. }) => Some(different(&item.file_name, Some(&sha256))),
        Ok(Look::Differs(what)) => Some(ItemOutcome::Failed {
            why: format!(
                "{what}: another file is there; it was left as it is, never overwritten — remove or rename it and retry"
            ),
            retry_safe: true,
        }),
        Ok(Look::Absent) => None,
        Ok(Look::CannotTell(why)) => Some(ItemOutcome::Unknown { why }),
        Err(e) => Some(ItemOutcome::Unknown {
            why: crate::domain::words::say_with("say.interrupted_look_failed", &[("why", e.words())]),
        }),
    }
}

/// Write the manifest of delivery `id`'s delivered items at its target: as its own
/// `manifest-ID.csv`/`.json` (kept when later deliveries use the same place), then as
/// `manifest.csv`/`manifest.json` (the latest delivery's, replacing an earlier one's). Both
/// are tally's own names, rewritten whole on a resume. A failure is logged: the files are
/// delivered either way.
async fn write_manifest(shared: &Shared, target: &Target, id: &str) {
    let rows = match manifest_rows(&shared.store, id).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(delivery = %id, error = %e, "could not read the delivery for its manifest");
            return;
        }
    };
    if rows.is_empty() {
        return;
    }
    let (csv, json) = (manifest::csv(&rows), manifest::json(&rows));
    let (own_csv, own_json) = manifest::names_for(id);
    let files = [
        (own_csv.as_str(), csv.clone()),
        (own_json.as_str(), json.clone()),
        (manifest::CSV_NAME, csv),
        (manifest::JSON_NAME, json),
    ];
    for (name, bytes) in files {
        if let Err(e) = target.replace(name, bytes).await {
            tracing::warn!(delivery = %id, file = name, error = %e, "could not write the delivery's manifest");
        }
    }
}

/// The manifest's rows: each delivered item with its set's product and its task's charge.
async fn manifest_rows(store: &Store, id: &str) -> Result<Vec<ManifestRow>, StoreError> {
    let Some(d) = store.delivery(id.into()).await? else { return Ok(Vec::new()) };
    let set = store.get_set(d.set_id.clone()).await?;
    let product = set.as_ref().map(|s| s.product.clone()).unwrap_or_default();
    let mut rows = Vec::new();
    for it in d.items.iter().filter(|i| i.state == ItemState::Delivered) {
        let task = set.as_ref().and_then(|s| s.tasks().find(|t| t.id == it.task_id));
        rows.push(ManifestRow {
            product: product.clone(),
            shot_role: it.shot_role.clone().unwrap_or_default(),
            profile: it.profile.clone().unwrap_or_else(|| d.profile.clone()),
            file_name: it.file_name.clone(),
            sha256: it.sha256.clone().unwrap_or_default(),
            width: it.width.unwrap_or(0).max(0) as u32,
            height: it.height.unwrap_or(0).max(0) as u32,
            bytes: it.bytes.unwrap_or(0).max(0) as u64,
            source_task_id: it.task_id.clone(),
            source_artifact_id: it.artifact_id.clone(),
            charge: task.map(|t| t.charge.state.as_str().to_string()).unwrap_or_else(|| "none".into()),
            cost_micros: task.and_then(|t| t.charge.cost_micros),
            currency: task.and_then(|t| t.charge.currency.clone()),
            remote_id: it.remote_id.clone(),
        });
    }
    Ok(rows)
}
