//! Money on PostgreSQL: the spend reads, with the meaning of `store::spend` (whose pure parts
//! — the limit decision and its words, the grouping of the report — both backends share), and
//! the key of the budget lock.
//!
//! **Budget invariant, across nodes.** A request whose price would take a period's spend
//! (`possible` and `charged` requests whose `calling` falls in it) over a limit is never
//! recorded as `calling`, so it is never sent — whichever node records it. On SQLite one
//! writer orders the check and the record; here several nodes record calls at once, so the
//! check and the record happen in one transaction under the **budget lock**, a
//! transaction-level advisory lock (class `taly`, key [`BUDGET_KEY`]) that
//! `store::ops::exec::record_calling` takes (its `budget_lock` hook): a call checked against
//! limits takes it exclusively, so two nodes' checks run one after the other and each sees
//! the other's committed call; a priced call checked against no limit (a node configured
//! without them, or a provider no limit covers) takes it shared, so it can never commit
//! between another node's check and that node's record. Unpriced calls add nothing to any
//! sum and take no lock. The lock is released at commit, a few milliseconds later.

use super::{PgStore, Tx};
use crate::domain::{Charge, Micros, Millis};
use crate::store::StoreError;
use crate::store::spend::{BudgetUse, Group, Limit, PaidRequest, SpendReport};

/// The second key of the budget lock (the first is [`LOCK_CLASS`]; key 0 is the migration
/// lock, 1 the capped dispatch).
pub const BUDGET_KEY: i32 = 2;

/// Sum of the `possible` and `charged` requests in `[start, end)` that count toward `l`.
fn spent(tx: &mut Tx<'_, '_>, l: &Limit, start: Millis, end: Millis) -> Result<Micros, StoreError> {
    let row = match &l.provider {
        None => tx.one(
            "SELECT coalesce(sum(cost_micros), 0)::bigint FROM executions
             WHERE charge IN ('possible', 'charged') AND calling_at >= $1 AND calling_at < $2",
            &[&start, &end],
        )?,
        Some(p) => tx.one(
            "SELECT coalesce(sum(x.cost_micros), 0)::bigint FROM executions x JOIN tasks t ON t.id = x.task_id
             WHERE x.charge IN ('possible', 'charged') AND x.calling_at >= $1 AND x.calling_at < $2
               AND t.provider = $3",
            &[&start, &end, p],
        )?,
    };
    Ok(row.get(0))
}

/// Every request that reached a provider (charge other than `none`) in `[from, to)`, oldest
/// first (as `store::spend::requests`).
fn requests(tx: &mut Tx<'_, '_>, from: Millis, to: Millis) -> Result<Vec<PaidRequest>, StoreError> {
    Ok(tx
        .rows(
            "SELECT x.calling_at, x.task_id, t.provider, x.model, x.charge, x.cost_micros, x.currency,
                    x.charge_recorded_at IS NOT NULL, x.token
             FROM executions x JOIN tasks t ON t.id = x.task_id
             WHERE x.charge <> 'none' AND x.calling_at >= $1 AND x.calling_at < $2
             UNION ALL
             SELECT x.calling_at, x.task_id, t.provider, x.model, x.charge, x.cost_micros, x.currency, true, x.token
             FROM executions x JOIN tasks t ON t.id = x.task_id
             WHERE x.charge = 'none' AND x.charge_recorded_at IS NOT NULL AND x.calling_at >= $1 AND x.calling_at < $2
             ORDER BY 1, 9",
            &[&from, &to],
        )?
        .iter()
        .map(|r| PaidRequest {
            at: r.get(0),
            task_id: r.get(1),
            provider: r.get(2),
            model: r.get(3),
            charge: Charge::parse(r.get(4)).unwrap_or(Charge::Possible),
            cost_micros: r.get(5),
            currency: r.get(6),
            by_hand: r.get(7),
        })
        .collect())
}

/// Make every envelope held back by a budget due now (as `store::spend::release_budget_holds`);
/// each checks the limits in force again when it is claimed.
fn release_budget_holds(tx: &mut Tx<'_, '_>, now: Millis) -> Result<usize, StoreError> {
    Ok(tx.exec(
        "UPDATE envelopes SET due_at = $1, budget_hold = false WHERE status = 'pending' AND budget_hold",
        &[&now],
    )? as usize)
}

/// Settled requests that reached a provider, grouped for the metrics.
fn charge_totals(tx: &mut Tx<'_, '_>) -> Result<Vec<crate::metrics::ChargeTotal>, StoreError> {
    Ok(tx
        .rows(
            "SELECT t.provider, x.charge, x.currency, count(*), coalesce(sum(x.cost_micros), 0)::bigint
             FROM executions x JOIN tasks t ON t.id = x.task_id
             WHERE x.charge <> 'none' AND x.status <> 'running'
             GROUP BY t.provider, x.charge, x.currency",
            &[],
        )?
        .iter()
        .map(|r| (r.get(0), Charge::parse(r.get(1)).unwrap_or(Charge::Possible), r.get(2), r.get(3), r.get(4)))
        .collect())
}

impl PgStore {
    /// Settled requests by provider and charge, for the metrics.
    pub async fn charge_totals(&self) -> Result<Vec<crate::metrics::ChargeTotal>, StoreError> {
        self.read(charge_totals).await
    }

    /// Release budget holds (ordered commit, as on SQLite).
    pub async fn release_budget_holds(&self, now: Millis) -> Result<usize, StoreError> {
        self.write_ordered(move |tx| {
            let now = tx.now(now)?;
            release_budget_holds(tx, now)
        })
        .await
    }

    /// The spend report over `[from, to)`.
    pub async fn spend(&self, from: Millis, to: Millis, group: Group) -> Result<SpendReport, StoreError> {
        self.read(move |tx| Ok(crate::store::spend::group_requests(requests(tx, from, to)?, group))).await
    }

    /// How much of each limit the current period has used (all nodes' requests).
    pub async fn budget_use(&self, limits: Vec<Limit>, now: Millis) -> Result<Vec<BudgetUse>, StoreError> {
        self.read(move |tx| {
            let now = tx.now(now)?;
            crate::store::spend::budget_use_with(&limits, now, |l, start, end| spent(tx, l, start, end))
        })
        .await
    }

    /// Every request that reached a provider in `[from, to)`.
    pub async fn paid_requests(&self, from: Millis, to: Millis) -> Result<Vec<PaidRequest>, StoreError> {
        self.read(move |tx| requests(tx, from, to)).await
    }
}
