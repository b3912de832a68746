//! The worker's operations on PostgreSQL, from `calling` to finish (the claim is the
//! dispatcher's, in `dispatch.rs`). Everything after the claim starts with
//! [`fence`](super::fence).

use super::*;
use crate::domain::{Actor, Charge, Millis, TaskStatus};
use crate::store::ops::with_money;
use crate::store::pg::PgStore;
use crate::store::{CallingFacts, CallingOutcome, Finish, NewArtifact};

/// Durably record "about to call the provider", with the request's price, model and whether
/// the provider bills (as `store::ops::exec::record_calling`). First, in the same
/// transaction and under the budget lock (`pg::spend`), the budget check: a call that would
/// take a period's spend over a limit is not recorded; the execution is abandoned, the
/// envelope waits until the period ends (its hand-off taken back, as a busy release does),
/// and the task is `waiting` with the reason. Nothing was sent and no attempt is counted.
fn record_calling(
    tx: &mut Tx<'_, '_>,
    exec: &str,
    lease: &str,
    now: Millis,
    facts: &CallingFacts,
) -> Result<CallingOutcome, StoreError> {
    let task = fence(tx, exec, lease, now)?;
    if let (true, Some(cost)) = (facts.billable, facts.cost_micros) {
        let provider: String = tx.one("SELECT provider FROM tasks WHERE id = $1", &[&task])?.get(0);
        if let Some((due_at, reason)) = crate::store::pg::spend::check(tx, &provider, cost, &facts.limits, now)? {
            let n = tx.exec(
                "UPDATE executions SET status = 'abandoned', finished_at = $2, error = $3 WHERE token = $1 AND phase = 'claimed'",
                &[&exec, &now, &reason],
            )?;
            if n == 0 {
                return Err(StoreError::Fenced);
            }
            // Back to the recovery lane, waiting until the period ends (as a busy release).
            requeue_envelope(tx, &task, due_at, Some("budget"), now)?;
            tx.exec(
                "UPDATE envelopes SET send_count = send_count - 1, budget_hold = true WHERE task_id = $1",
                &[&task],
            )?;
            set_task(tx, &task, TaskStatus::Waiting, Some(&reason), None, now)?;
            event(tx, &task, now, Actor::Worker, "budget", &reason, Some(exec))?;
            return Ok(CallingOutcome::Held { due_at, reason });
        }
    }
    let charge = if facts.billable { Charge::Possible } else { Charge::None };
    let attempt: i64 = tx
        .opt(
            "UPDATE executions SET phase = 'calling', calling_at = $2, charge = $3, billable = $4, cost_micros = $5,
                    currency = $6, model = $7
             WHERE token = $1 AND phase = 'claimed'
             RETURNING attempt",
            &[&exec, &now, &charge.as_str(), &facts.billable, &facts.cost_micros, &facts.currency, &facts.model],
        )?
        .map(|r| r.get(0))
        .ok_or(StoreError::Fenced)?;
    // The dispatch claim already cleared any budget hold (`dispatch::claim_picked`).
    tx.exec("UPDATE tasks SET attempts = attempts + 1, updated_at = $2 WHERE id = $1", &[&task, &now])?;
    // The timeline says only what is true now: the request is leaving. What it cost is said
    // by the outcome's line, from the evidence.
    let price = match (facts.billable, facts.cost_micros, &facts.currency) {
        (false, _, _) => " (this provider never charges)".to_string(),
        (true, Some(m), Some(cur)) => format!(" (its price: about {})", crate::domain::money(m, cur)),
        _ => String::new(),
    };
    let msg = format!("attempt {attempt}: sending the request to the provider{price}");
    event(tx, &task, now, Actor::Worker, "calling", &msg, Some(exec))?;
    Ok(CallingOutcome::Calling)
}

/// Persist the provider's job id the moment it arrives.
fn record_accepted(
    tx: &mut Tx<'_, '_>,
    exec: &str,
    lease: &str,
    job: &str,
    handle: Option<&str>,
    now: Millis,
) -> Result<(), StoreError> {
    let task = fence(tx, exec, lease, now)?;
    tx.exec(
        "UPDATE executions SET phase = 'accepted', provider_job_id = $2, provider_handle = $3 WHERE token = $1",
        &[&exec, &job, &handle],
    )?;
    event(tx, &task, now, Actor::Worker, "accepted", &format!("the provider accepted the job as {job}"), Some(exec))?;
    Ok(())
}

/// Extend the worker's lease.
fn heartbeat(tx: &mut Tx<'_, '_>, exec: &str, lease: &str, now: Millis, lease_ms: Millis) -> Result<(), StoreError> {
    let task = fence(tx, exec, lease, now)?;
    tx.exec("UPDATE envelopes SET lease_expires_at = $2 WHERE task_id = $1", &[&task, &(now + lease_ms)])?;
    Ok(())
}

/// End (or pause) an execution, fenced on both tokens, recording what its outcome proves
/// about money (as `store::ops::exec::finish`).
fn finish(tx: &mut Tx<'_, '_>, exec: &str, lease: &str, f: &Finish, now: Millis) -> Result<TaskStatus, StoreError> {
    let task = fence(tx, exec, lease, now)?;
    fn set_exec(
        tx: &mut Tx<'_, '_>,
        exec: &str,
        status: &str,
        now: Millis,
        error: Option<&str>,
    ) -> Result<(), StoreError> {
        tx.exec(
            "UPDATE executions SET status = $2, finished_at = $3, error = $4 WHERE token = $1",
            &[&exec, &status, &now, &error],
        )?;
        Ok(())
    }
    let ex = Some(exec);
    let (charge, words) = settle_charge(tx, exec, f.charge())?;
    let status = match f {
        Finish::Succeeded(a) => {
            set_exec(tx, exec, "succeeded", now, None)?;
            insert_artifact(tx, &task, exec, a, now)?;
            let canceled: bool = tx.one("SELECT cancel_requested FROM tasks WHERE id = $1", &[&task])?.get(0);
            let reason = match (canceled, charge) {
                (false, _) => None,
                (true, Charge::Charged) => Some(
                    "A cancel was requested after the request had been sent; the image was kept because the provider \
                     charges for it.",
                ),
                (true, _) => Some("A cancel was requested after the request had been sent; the image was kept."),
            };
            set_task(tx, &task, TaskStatus::Succeeded, reason, None, now)?;
            consume_envelope(tx, &task, "consumed", None)?;
            let saved = format!("image stored ({} bytes, sha256 {})", a.image.len(), a.image.sha256());
            event(tx, &task, now, Actor::Worker, "succeeded", &with_money(&saved, &words), ex)?;
            // Crash matrix: the image and `succeeded` are written but not committed.
            crate::failpoint::crash("before-finish-commit");
            TaskStatus::Succeeded
        }
        Finish::Failed { kind, reason, .. } => {
            set_exec(tx, exec, "failed", now, Some(reason))?;
            set_task(tx, &task, TaskStatus::Failed, Some(reason), Some(*kind), now)?;
            consume_envelope(tx, &task, "consumed", Some(reason))?;
            event(tx, &task, now, Actor::Worker, "failed", &with_money(reason, &words), ex)?;
            TaskStatus::Failed
        }
        Finish::Unknown { reason } => {
            set_exec(tx, exec, "unknown", now, Some(reason))?;
            set_task(tx, &task, TaskStatus::Unknown, Some(reason), None, now)?;
            consume_envelope(tx, &task, "consumed", Some(reason))?;
            let line = format!("{reason}; automatic retries stopped");
            event(tx, &task, now, Actor::Worker, "unknown", &with_money(&line, &words), ex)?;
            TaskStatus::Unknown
        }
        Finish::RetryLater { due_at, kind, reason, max_attempts, counted, .. } => {
            set_exec(tx, exec, "failed", now, Some(reason))?;
            if !*counted {
                // A "not now": the provider refused this request, so it is not an attempt.
                tx.exec("UPDATE tasks SET attempts = greatest(0, attempts - 1) WHERE id = $1", &[&task])?;
                tx.exec("UPDATE envelopes SET send_count = greatest(0, send_count - 1) WHERE task_id = $1", &[&task])?;
            }
            let attempts: i64 = tx.one("SELECT attempts FROM tasks WHERE id = $1", &[&task])?.get(0);
            if *counted && attempts >= *max_attempts {
                let why = format!("gave up after {attempts} attempts; the last one: {reason}");
                set_task(tx, &task, TaskStatus::Failed, Some(&why), Some(*kind), now)?;
                consume_envelope(tx, &task, "consumed", Some(reason))?;
                event(tx, &task, now, Actor::Worker, "failed", &with_money(&why, &words), ex)?;
                TaskStatus::Failed
            } else {
                let secs = (due_at - now).max(0) as f64 / 1000.0;
                let why = if *counted {
                    format!("attempt {attempts} did not go through ({reason}); trying again in {secs:.1} s")
                } else {
                    format!("the provider did not take the request yet ({reason}); trying again in {secs:.1} s")
                };
                set_task(tx, &task, TaskStatus::Waiting, Some(&why), None, now)?;
                requeue_envelope(tx, &task, *due_at, Some(reason), now)?;
                event(tx, &task, now, Actor::Worker, "retry_scheduled", &with_money(&why, &words), ex)?;
                return Ok(TaskStatus::Waiting);
            }
        }
        Finish::CanceledBeforeCall => {
            set_exec(tx, exec, "abandoned", now, Some("canceled before the call"))?;
            set_task(tx, &task, TaskStatus::Canceled, Some("Nothing was sent to the provider."), None, now)?;
            consume_envelope(tx, &task, "consumed", None)?;
            event(tx, &task, now, Actor::Worker, "canceled", "canceled before anything was sent", ex)?;
            TaskStatus::Canceled
        }
    };
    on_settled(tx, &task, now)?;
    Ok(status)
}

/// A result that arrived after the task was marked `unknown`, from the same execution: it is
/// evidence, resolves the task, and proves the request was charged.
fn late_result(tx: &mut Tx<'_, '_>, exec: &str, a: &NewArtifact, now: Millis) -> Result<bool, StoreError> {
    let task: Option<String> = tx.opt("SELECT task_id FROM executions WHERE token = $1", &[&exec])?.map(|r| r.get(0));
    let Some(task) = task else { return Ok(false) };
    lock_task(tx, &task)?;
    let n = tx.exec(
        "UPDATE executions SET status = 'succeeded', finished_at = $2
         WHERE token = $1 AND status = 'unknown'
           AND EXISTS (SELECT 1 FROM tasks t WHERE t.id = executions.task_id AND t.status = 'unknown')",
        &[&exec, &now],
    )?;
    if n == 0 {
        return Ok(false);
    }
    let (_, words) = settle_charge(tx, exec, Charge::Charged)?;
    insert_artifact(tx, &task, exec, a, now)?;
    set_task(
        tx,
        &task,
        TaskStatus::Succeeded,
        Some("The answer arrived late, after the outcome had been marked unknown."),
        None,
        now,
    )?;
    event(
        tx,
        &task,
        now,
        Actor::Worker,
        "late_result",
        &with_money("a late answer from the same execution resolved the unknown outcome", &words),
        Some(exec),
    )?;
    Ok(true)
}

impl PgStore {
    /// Check the budgets and durably record phase `calling` (see [`record_calling`]).
    pub async fn record_calling(
        &self,
        exec: String,
        lease: String,
        now: Millis,
        facts: CallingFacts,
    ) -> Result<CallingOutcome, StoreError> {
        self.write(move |tx| {
            let now = tx.now(now)?;
            record_calling(tx, &exec, &lease, now, &facts)
        })
        .await
    }

    /// Persist an accepted job id.
    pub async fn record_accepted(
        &self,
        exec: String,
        lease: String,
        job: String,
        now: Millis,
    ) -> Result<(), StoreError> {
        self.write(move |tx| {
            let now = tx.now(now)?;
            record_accepted(tx, &exec, &lease, &job, None, now)
        })
        .await
    }

    /// Like [`PgStore::record_accepted`], with the adapter's handle for polling the job.
    pub async fn record_accepted_with(
        &self,
        exec: String,
        lease: String,
        job: String,
        handle: Option<String>,
        now: Millis,
    ) -> Result<(), StoreError> {
        self.write(move |tx| {
            let now = tx.now(now)?;
            record_accepted(tx, &exec, &lease, &job, handle.as_deref(), now)
        })
        .await
    }

    /// Extend a lease (ordered commit).
    pub async fn heartbeat(
        &self,
        exec: String,
        lease: String,
        now: Millis,
        lease_ms: Millis,
    ) -> Result<(), StoreError> {
        self.write_ordered(move |tx| {
            let now = tx.now(now)?;
            heartbeat(tx, &exec, &lease, now, lease_ms)
        })
        .await
    }

    /// End or pause an execution.
    pub async fn finish(&self, exec: String, lease: String, f: Finish, now: Millis) -> Result<TaskStatus, StoreError> {
        self.write(move |tx| {
            let now = tx.now(now)?;
            finish(tx, &exec, &lease, &f, now)
        })
        .await
    }

    /// Attach a late result to an `unknown` execution.
    pub async fn late_result(&self, exec: String, a: NewArtifact, now: Millis) -> Result<bool, StoreError> {
        self.write(move |tx| {
            let now = tx.now(now)?;
            late_result(tx, &exec, &a, now)
        })
        .await
    }
}
