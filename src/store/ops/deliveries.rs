//! Deliveries (issue #26), written once over [`Tx`] for both backends: a delivery of a set's
//! chosen images with one profile to one target, one item per shot.
//!
//! The protocol, as the engine's runner (`engine::deliver`) follows it:
//! 1. [`create`] records the delivery and one `queued` item per shot, each naming the chosen
//!    artifact and the file name it will have (fixed now, so a resumed write looks at the same
//!    name). Under the set's lock it checks that every item's artifact is still its shot's
//!    choice, so a delivery never sends an image the owner un-chose meanwhile.
//! 2. [`claim`] hands a delivery to one engine run (`runner`, with a lease).
//! 3. Before an item's write, [`record_writing`] durably marks it `writing` with the sha256,
//!    size and pixels of the file about to be written; after it, [`confirm`] records
//!    `delivered`, `failed` (why, and whether a retry is safe) or `unknown` (the target cannot
//!    say). No transaction spans the write itself.
//! 4. Once no item is open (and the runner wrote the manifest), [`settle`] writes the
//!    delivery's state, derived from its items ([`derive_state`]).
//!
//! Invariants enforced here: only the run holding a delivery (its `runner`, state
//! `delivering`) may change its items or settle it (`record_writing`/`confirm`/`settle` check
//! it with the guarded write of `hold`, which on PostgreSQL also locks the delivery's row to
//! the end of the operation, and change nothing otherwise); a `delivered` item is never sent
//! again ([`retry`] re-queues only the others); an item that was ever recorded `writing`
//! keeps its sha256, so whoever sends it next looks at the target first.
//!
//! Past 600 lines: the delivery's stored types and the steps of its protocol over them are one
//! unit; split, each half would need the other to be read.

use serde::Serialize;

use super::common::new_id;
use crate::domain::Millis;
use crate::store::StoreError;
use crate::store::tx::{Row, Tx};

/// A delivery's state, derived from its items (see [`derive_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Recorded; no runner has it yet.
    Queued,
    /// A runner is writing its items.
    Delivering,
    /// Every item is delivered.
    Delivered,
    /// Some items are delivered and the others failed or are unknown.
    PartlyDelivered,
    /// No item is delivered and every other one failed.
    Failed,
    /// No item is delivered and at least one is unknown (the target could not say).
    Unknown,
}

impl DeliveryState {
    /// The stored (and JSON) name.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Queued => "queued",
            DeliveryState::Delivering => "delivering",
            DeliveryState::Delivered => "delivered",
            DeliveryState::PartlyDelivered => "partly_delivered",
            DeliveryState::Failed => "failed",
            DeliveryState::Unknown => "unknown",
        }
    }

    /// The state a stored name means.
    pub fn parse(s: &str) -> Result<DeliveryState, StoreError> {
        Ok(match s {
            "queued" => DeliveryState::Queued,
            "delivering" => DeliveryState::Delivering,
            "delivered" => DeliveryState::Delivered,
            "partly_delivered" => DeliveryState::PartlyDelivered,
            "failed" => DeliveryState::Failed,
            "unknown" => DeliveryState::Unknown,
            other => return Err(StoreError::Invalid(format!("unknown delivery state `{other}`"))),
        })
    }

    /// Whether nothing more happens to the delivery unless it is retried.
    pub fn is_final(self) -> bool {
        !matches!(self, DeliveryState::Queued | DeliveryState::Delivering)
    }
}

/// One item's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ItemState {
    /// Not attempted (or re-queued by a retry).
    Queued,
    /// Its write was recorded and may or may not have happened: settled by looking.
    Writing,
    /// At the target, with the recorded sha256.
    Delivered,
    /// Not delivered; `why` says why, `retry_safe` whether a retry can write nothing twice.
    Failed,
    /// The target could not say whether it is there.
    Unknown,
}

impl ItemState {
    /// The stored (and JSON) name.
    pub fn as_str(self) -> &'static str {
        match self {
            ItemState::Queued => "queued",
            ItemState::Writing => "writing",
            ItemState::Delivered => "delivered",
            ItemState::Failed => "failed",
            ItemState::Unknown => "unknown",
        }
    }

    /// The state a stored name means.
    pub fn parse(s: &str) -> Result<ItemState, StoreError> {
        Ok(match s {
            "queued" => ItemState::Queued,
            "writing" => ItemState::Writing,
            "delivered" => ItemState::Delivered,
            "failed" => ItemState::Failed,
            "unknown" => ItemState::Unknown,
            other => return Err(StoreError::Invalid(format!("unknown delivery item state `{other}`"))),
        })
    }
}

/// A delivery's state from its items' states. `started`: a runner has taken it (so open items
/// make it `delivering`, not `queued`). The rule: anything still open → queued/delivering;
/// all delivered → delivered; some delivered → partly_delivered; none delivered → unknown if
/// any is unknown, else failed. A delivery with no items is delivered (nothing to send).
pub fn derive_state(items: &[ItemState], started: bool) -> DeliveryState {
    let open = items.iter().any(|s| matches!(s, ItemState::Queued | ItemState::Writing));
    let delivered = items.iter().filter(|s| **s == ItemState::Delivered).count();
    if open {
        return if started { DeliveryState::Delivering } else { DeliveryState::Queued };
    }
    if delivered == items.len() {
        DeliveryState::Delivered
    } else if delivered > 0 {
        DeliveryState::PartlyDelivered
    } else if items.contains(&ItemState::Unknown) {
        DeliveryState::Unknown
    } else {
        DeliveryState::Failed
    }
}

/// One item of a new delivery.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct NewDeliveryItem {
    /// The shot's position in the set.
    pub position: i64,
    /// The candidate task that made the image.
    pub task_id: String,
    /// The chosen image.
    pub artifact_id: String,
    pub shot_role: Option<String>,
    /// The file's name at the target (from the profile's pattern, `delivery::names`).
    pub file_name: String,
    /// The profile this item is made with when it is not the delivery's (a profile per shot
    /// role, issue #37).
    pub profile: Option<String>,
    /// The words drawn on it, as the shot had them when the delivery was asked for (a retry
    /// renders the same bytes).
    pub overlay: Option<crate::domain::overlay::Overlay>,
}

/// A delivery to record ([`create`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct NewDelivery {
    pub set_id: String,
    pub profile: String,
    pub target: String,
    /// Delivered although an image does not meet the profile (`"force": true`).
    pub forced: bool,
    /// The product a `shopify` target attaches the files to (a `gid://shopify/Product/…` or
    /// a handle); `None` for other targets.
    pub shopify_product: Option<String>,
    pub items: Vec<NewDeliveryItem>,
}

/// One item as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[allow(missing_docs)]
pub struct DeliveryItemView {
    /// The shot's position in the set (from 0).
    pub position: i64,
    pub task_id: String,
    pub artifact_id: String,
    pub shot_role: Option<String>,
    pub file_name: String,
    pub state: ItemState,
    /// How many writes were recorded for it.
    pub attempts: i64,
    /// The file's sha256 (lowercase hex), once a write was recorded.
    pub sha256: Option<String>,
    pub bytes: Option<i64>,
    pub width: Option<i64>,
    pub height: Option<i64>,
    /// Why it is not delivered (failed or unknown), in plain words.
    pub why: Option<String>,
    /// For a failed item: whether sending it again cannot deliver it twice or overwrite
    /// anything.
    pub retry_safe: Option<bool>,
    /// The id the destination gave the file once delivered (a Shopify file/media id), when it
    /// gives one.
    pub remote_id: Option<String>,
    /// The profile it is made with when it is not the delivery's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// The words drawn on it (tally's own text, never the model's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overlay: Option<crate::domain::overlay::Overlay>,
}

/// A delivery as stored, with its items in shot order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[allow(missing_docs)]
pub struct DeliveryView {
    pub id: String,
    pub set_id: String,
    pub profile: String,
    pub target: String,
    pub forced: bool,
    /// The product a `shopify` target attaches the files to.
    pub shopify_product: Option<String>,
    pub state: DeliveryState,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub items: Vec<DeliveryItemView>,
}

/// What [`create`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum CreateOutcome {
    Created(DeliveryView),
    NoSet,
    /// The choice of a shot changed since the delivery was planned (plain words which).
    ChoiceChanged(String),
}

/// What [`retry`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum RetryDeliveryOutcome {
    /// Its items that were not delivered are queued again (how many).
    Requeued(DeliveryView, usize),
    NoDelivery,
    /// It is still queued or being delivered: nothing to retry yet.
    Busy(DeliveryState),
    /// Every item is delivered already.
    NothingToRetry,
}

/// How one item's write ended ([`confirm`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum ItemOutcome {
    Delivered,
    /// Delivered, and the destination gave the file this id (kept as the item's `remote_id`).
    DeliveredAs {
        remote_id: String,
    },
    Failed {
        why: String,
        retry_safe: bool,
    },
    Unknown {
        why: String,
    },
}

fn delivery_of(r: &Row) -> Result<DeliveryView, StoreError> {
    Ok(DeliveryView {
        id: r.get(0)?,
        set_id: r.get(1)?,
        profile: r.get(2)?,
        target: r.get(3)?,
        forced: r.get(4)?,
        state: DeliveryState::parse(&r.get::<String>(5)?)?,
        created_at: r.get(6)?,
        updated_at: r.get(7)?,
        shopify_product: r.get(8)?,
        items: Vec::new(),
    })
}

fn items_of(tx: &mut dyn Tx, id: &str) -> Result<Vec<DeliveryItemView>, StoreError> {
    let rows = tx.rows(
        "SELECT position, task_id, artifact_id, shot_role, file_name, state, attempts, sha256, bytes, width, height,
                why, retry_safe, remote_id, profile, overlay
         FROM delivery_items WHERE delivery_id = ?1 ORDER BY position",
        &[&id],
    )?;
    rows.iter()
        .map(|r| {
            Ok(DeliveryItemView {
                position: r.get(0)?,
                task_id: r.get(1)?,
                artifact_id: r.get(2)?,
                shot_role: r.get(3)?,
                file_name: r.get(4)?,
                state: ItemState::parse(&r.get::<String>(5)?)?,
                attempts: r.get(6)?,
                sha256: r.get(7)?,
                bytes: r.get(8)?,
                width: r.get(9)?,
                height: r.get(10)?,
                why: r.get(11)?,
                retry_safe: r.get(12)?,
                remote_id: r.get(13)?,
                profile: r.get(14)?,
                overlay: r.get::<Option<String>>(15)?.and_then(|t| serde_json::from_str(&t).ok()),
            })
        })
        .collect()
}

/// One delivery with its items.
pub(in crate::store) fn get(tx: &mut dyn Tx, id: &str) -> Result<Option<DeliveryView>, StoreError> {
    let Some(row) = tx.opt(
        "SELECT id, set_id, profile, target, forced, state, created_at, updated_at, shopify_product FROM deliveries WHERE id = ?1",
        &[&id],
    )?
    else {
        return Ok(None);
    };
    let mut d = delivery_of(&row)?;
    d.items = items_of(tx, id)?;
    Ok(Some(d))
}

/// A set's deliveries, oldest first, with their items.
pub(in crate::store) fn list_for_set(tx: &mut dyn Tx, set: &str) -> Result<Vec<DeliveryView>, StoreError> {
    let rows = tx.rows(
        "SELECT id, set_id, profile, target, forced, state, created_at, updated_at, shopify_product FROM deliveries
         WHERE set_id = ?1 ORDER BY id",
        &[&set],
    )?;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        let mut d = delivery_of(r)?;
        d.items = items_of(tx, &d.id)?;
        out.push(d);
    }
    Ok(out)
}

/// Record a delivery and its `queued` items, after checking under the set's lock that each
/// item's artifact is still its shot's choice.
pub(in crate::store) fn create(tx: &mut dyn Tx, d: &NewDelivery, now: Millis) -> Result<CreateOutcome, StoreError> {
    tx.lock_set(&d.set_id)?;
    if tx.opt("SELECT 1 FROM sets WHERE id = ?1", &[&d.set_id])?.is_none() {
        return Ok(CreateOutcome::NoSet);
    }
    for it in &d.items {
        let chosen: Option<String> = match tx.opt(
            "SELECT artifact_id FROM set_choices WHERE set_id = ?1 AND position = ?2",
            &[&d.set_id, &it.position],
        )? {
            Some(r) => r.get(0)?,
            None => None,
        };
        if chosen.as_deref() != Some(it.artifact_id.as_str()) {
            return Ok(CreateOutcome::ChoiceChanged(format!(
                "the choice of shot {} changed while the delivery was being made; try again",
                it.position + 1
            )));
        }
    }
    let id = new_id();
    tx.exec(
        "INSERT INTO deliveries (id, set_id, profile, target, forced, state, created_at, updated_at, shopify_product)
         VALUES (?1, ?2, ?3, ?4, ?5, 'queued', ?6, ?6, ?7)",
        &[&id, &d.set_id, &d.profile, &d.target, &d.forced, &now, &d.shopify_product],
    )?;
    for it in &d.items {
        let overlay = it.overlay.as_ref().map(|o| serde_json::json!(o).to_string());
        tx.exec(
            "INSERT INTO delivery_items (delivery_id, position, task_id, artifact_id, shot_role, file_name, state,
                                         updated_at, profile, overlay)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'queued', ?7, ?8, ?9)",
            &[
                &id,
                &it.position,
                &it.task_id,
                &it.artifact_id,
                &it.shot_role,
                &it.file_name,
                &now,
                &it.profile,
                &overlay,
            ],
        )?;
    }
    let view = get(tx, &id)?.ok_or_else(|| StoreError::Invalid(format!("delivery {id} vanished")))?;
    Ok(CreateOutcome::Created(view))
}

/// Hand the next delivery to the run `runner` until `now + lease_ms`: a queued one, or one
/// being delivered whose lease ran out (its runner is gone or stuck; a holder renews the
/// lease at every item) — or, with `takeover = Some(prefix)`, any delivery that another run
/// whose id starts with `prefix` was delivering, lease or not. The engine passes it at
/// start-up only, for runs it knows are dead: on SQLite every other run (prefix `""`: the
/// data-directory lock proves them dead); on PostgreSQL this node's earlier runs (prefix
/// `"{node}/"`: the node's lock proves them dead), while other nodes' deliveries wait for
/// their leases.
/// The oldest first. The conditional update re-checks under the row's lock, so two runs never
/// both get it.
pub(in crate::store) fn claim(
    tx: &mut dyn Tx,
    runner: &str,
    now: Millis,
    lease_ms: Millis,
    takeover: Option<&str>,
) -> Result<Option<DeliveryView>, StoreError> {
    // Only what this run may take (so deliveries other runs hold never hide a queued one).
    let candidates = if let Some(prefix) = takeover {
        tx.rows(
            "SELECT id FROM deliveries
             WHERE state = 'queued' OR (state = 'delivering' AND (runner IS NULL OR lease_until < ?3
                   OR (runner <> ?1 AND substr(runner, 1, length(?2)) = ?2)))
             ORDER BY id LIMIT 16",
            &[&runner, &prefix, &now],
        )?
    } else {
        tx.rows(
            "SELECT id FROM deliveries WHERE state = 'queued' OR (state = 'delivering' AND lease_until < ?1)
             ORDER BY id LIMIT 16",
            &[&now],
        )?
    };
    let until = now + lease_ms;
    for r in &candidates {
        let id: String = r.get(0)?;
        let n = if let Some(prefix) = takeover {
            tx.exec(
                "UPDATE deliveries SET state = 'delivering', runner = ?2, lease_until = ?3, updated_at = ?4
                 WHERE id = ?1 AND (state = 'queued' OR (state = 'delivering' AND (runner IS NULL OR lease_until < ?4
                       OR (runner <> ?2 AND substr(runner, 1, length(?5)) = ?5))))",
                &[&id, &runner, &until, &now, &prefix],
            )?
        } else {
            tx.exec(
                "UPDATE deliveries SET state = 'delivering', runner = ?2, lease_until = ?3, updated_at = ?4
                 WHERE id = ?1 AND (state = 'queued' OR (state = 'delivering' AND lease_until < ?4))",
                &[&id, &runner, &until, &now],
            )?
        };
        if n == 1 {
            return get(tx, &id);
        }
    }
    Ok(None)
}

/// When the earliest lease of a delivery being delivered runs out (an idle runner sleeps until
/// then, to take it over), if any.
pub(in crate::store) fn next_lease_end(tx: &mut dyn Tx) -> Result<Option<Millis>, StoreError> {
    let row = tx.one("SELECT min(lease_until) FROM deliveries WHERE state = 'delivering'", &[])?;
    row.get(0)
}

/// Whether the run `runner` holds delivery `id` (extending its lease to `until` when it does).
///
/// **The holder check is the guarded write itself** (never a `SELECT` then a write): the
/// delivery's row is updated only where `runner` still holds it, and the answer is the row
/// count. On PostgreSQL the `UPDATE` takes the row's lock and re-reads the row once a
/// concurrent writer committed, and the lock is kept to the end of the operation's
/// transaction; a takeover ([`claim`]) updates the same row, so it waits for this operation
/// or this operation sees it — a run whose delivery was taken over after its lease ran out
/// changes nothing. On SQLite the single writer makes the check and the write atomic anyway.
fn hold(tx: &mut dyn Tx, id: &str, runner: &str, until: Option<Millis>, now: Millis) -> Result<bool, StoreError> {
    Ok(tx.exec(
        "UPDATE deliveries SET lease_until = coalesce(?3, lease_until), updated_at = ?4
         WHERE id = ?1 AND runner = ?2 AND state = 'delivering'",
        &[&id, &runner, &until, &now],
    )? == 1)
}

/// The facts of a file about to be written.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct FileFacts {
    pub sha256: String,
    pub bytes: i64,
    pub width: i64,
    pub height: i64,
}

/// Durably mark item `position` of delivery `id` `writing` with the facts of the file about
/// to be written, before the write is attempted; extends the lease. `false` (nothing changed)
/// when `runner` does not hold the delivery any more.
#[allow(clippy::too_many_arguments)]
pub(in crate::store) fn record_writing(
    tx: &mut dyn Tx,
    id: &str,
    position: i64,
    runner: &str,
    file: &FileFacts,
    now: Millis,
    lease_ms: Millis,
) -> Result<bool, StoreError> {
    if !hold(tx, id, runner, Some(now + lease_ms), now)? {
        return Ok(false);
    }
    let n = tx.exec(
        "UPDATE delivery_items SET state = 'writing', attempts = attempts + 1, sha256 = ?3, bytes = ?4, width = ?5,
                height = ?6, why = NULL, retry_safe = NULL, updated_at = ?7
         WHERE delivery_id = ?1 AND position = ?2 AND state <> 'delivered'",
        &[&id, &position, &file.sha256, &file.bytes, &file.width, &file.height, &now],
    )?;
    Ok(n == 1)
}

/// Record how item `position` of delivery `id` ended; answers the state its items now give
/// (the delivery itself stays `delivering` until [`settle`]). `None` (nothing changed) when
/// `runner` does not hold the delivery any more.
pub(in crate::store) fn confirm(
    tx: &mut dyn Tx,
    id: &str,
    position: i64,
    runner: &str,
    outcome: &ItemOutcome,
    now: Millis,
) -> Result<Option<DeliveryState>, StoreError> {
    if !hold(tx, id, runner, None, now)? {
        return Ok(None);
    }
    let (state, why, safe, remote) = match outcome {
        ItemOutcome::Delivered => (ItemState::Delivered, None, None, None),
        ItemOutcome::DeliveredAs { remote_id } => (ItemState::Delivered, None, None, Some(remote_id.as_str())),
        ItemOutcome::Failed { why, retry_safe } => (ItemState::Failed, Some(why.as_str()), Some(*retry_safe), None),
        ItemOutcome::Unknown { why } => (ItemState::Unknown, Some(why.as_str()), None, None),
    };
    tx.exec(
        "UPDATE delivery_items SET state = ?3, why = ?4, retry_safe = ?5, updated_at = ?6,
                remote_id = coalesce(?7, remote_id)
         WHERE delivery_id = ?1 AND position = ?2",
        &[&id, &position, &state.as_str(), &why, &safe, &now, &remote],
    )?;
    let states: Vec<ItemState> = tx
        .rows("SELECT state FROM delivery_items WHERE delivery_id = ?1", &[&id])?
        .iter()
        .map(|r| ItemState::parse(&r.get::<String>(0)?))
        .collect::<Result<_, _>>()?;
    Ok(Some(derive_state(&states, true)))
}

/// Finish a delivery whose items are all settled: its state from its items, written once the
/// runner has written the manifest (so a delivery that says it ended has its manifest beside
/// its files; after a crash in between, the next run writes the manifest and then this).
/// `None` when `runner` does not hold it.
pub(in crate::store) fn settle(
    tx: &mut dyn Tx,
    id: &str,
    runner: &str,
    now: Millis,
) -> Result<Option<DeliveryState>, StoreError> {
    if !hold(tx, id, runner, None, now)? {
        return Ok(None);
    }
    let states: Vec<ItemState> = tx
        .rows("SELECT state FROM delivery_items WHERE delivery_id = ?1", &[&id])?
        .iter()
        .map(|r| ItemState::parse(&r.get::<String>(0)?))
        .collect::<Result<_, _>>()?;
    let derived = derive_state(&states, true);
    if derived.is_final() {
        tx.exec(
            "UPDATE deliveries SET state = ?2, runner = NULL, lease_until = NULL, updated_at = ?3 WHERE id = ?1",
            &[&id, &derived.as_str(), &now],
        )?;
    }
    Ok(Some(derived))
}

/// Queue again every item of a finished delivery that is not `delivered` (their recorded
/// sha256 is kept: whoever sends one next looks at the target first), and the delivery.
pub(in crate::store) fn retry(tx: &mut dyn Tx, id: &str, now: Millis) -> Result<RetryDeliveryOutcome, StoreError> {
    let Some(row) = tx.opt("SELECT state FROM deliveries WHERE id = ?1", &[&id])? else {
        return Ok(RetryDeliveryOutcome::NoDelivery);
    };
    let state = DeliveryState::parse(&row.get::<String>(0)?)?;
    if !state.is_final() {
        return Ok(RetryDeliveryOutcome::Busy(state));
    }
    let n = tx.exec(
        "UPDATE delivery_items SET state = 'queued', why = NULL, retry_safe = NULL, updated_at = ?2
         WHERE delivery_id = ?1 AND state <> 'delivered'",
        &[&id, &now],
    )?;
    if n == 0 {
        return Ok(RetryDeliveryOutcome::NothingToRetry);
    }
    tx.exec(
        "UPDATE deliveries SET state = 'queued', runner = NULL, lease_until = NULL, updated_at = ?2 WHERE id = ?1",
        &[&id, &now],
    )?;
    let view = get(tx, id)?.ok_or_else(|| StoreError::Invalid(format!("delivery {id} vanished")))?;
    Ok(RetryDeliveryOutcome::Requeued(view, n as usize))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ItemState::*;

    #[test]
    fn a_delivery_s_state_is_derived_from_its_items() {
        assert_eq!(derive_state(&[Queued, Queued], false), DeliveryState::Queued);
        assert_eq!(derive_state(&[Delivered, Writing], true), DeliveryState::Delivering);
        assert_eq!(derive_state(&[Delivered, Delivered], true), DeliveryState::Delivered);
        assert_eq!(derive_state(&[Delivered, Failed], true), DeliveryState::PartlyDelivered);
        assert_eq!(derive_state(&[Delivered, Unknown], true), DeliveryState::PartlyDelivered);
        assert_eq!(derive_state(&[Failed, Failed], true), DeliveryState::Failed);
        assert_eq!(derive_state(&[Failed, Unknown], true), DeliveryState::Unknown);
        assert_eq!(derive_state(&[], true), DeliveryState::Delivered);
        for s in [Queued, Writing, Delivered, Failed, Unknown] {
            assert_eq!(ItemState::parse(s.as_str()).ok(), Some(s));
        }
        assert!(!DeliveryState::Delivering.is_final() && DeliveryState::Unknown.is_final());
    }
}
