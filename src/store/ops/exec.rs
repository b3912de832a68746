//! The worker's operations, from `calling` to finish (the claim itself is the dispatcher's, in
//! `store::ops::dispatch`), written once over [`Tx`] for both backends.
//!
//! **Fencing invariant.** Every write after the claim is fenced on both tokens: it applies only
//! while the execution is `running` with the worker's token and the envelope still carries the
//! worker's lease token — by [`fence`], or by the same predicate inside the operation's first
//! write (`record_calling`, `finish`), with zero rows meaning [`StoreError::Fenced`] and
//! nothing written. Where transactions run side by side (PostgreSQL, [`Tx::locking`]) the
//! task's envelope is locked before that first write, so a recovery or a person's action on
//! the task waits for the worker's write, or the worker's write sees theirs.
//!
//! How a finish that is not a success leaves its task (settled, or waiting for another
//! attempt, and the words of its timeline line) is the pure [`ending`], unit-tested below.

use super::common::{
    consume_envelope, event, fence, insert_artifact, on_settled, requeue_envelope, schedule_next_shot_of, set_task,
    settle_charge,
};
use super::{CallingFacts, CallingOutcome, Finish, NewArtifact, charge_words, with_money};
use crate::domain::words::{say, say_with};
use crate::domain::{Actor, Charge, FailureKind, Micros, Millis, TaskStatus};
use crate::store::StoreError;
use crate::store::spend::Limit;
use crate::store::tx::Tx;

pub use crate::providers::provider_key;

/// Lock the task of execution `exec` where locks are real ([`Tx::locking`]); false when no
/// such execution exists. (The lock needs the task id, which only the execution row knows:
/// [`Tx::lock_task_of_execution`] finds it and locks in one round trip.)
fn lock_task_of(tx: &mut dyn Tx, exec: &str) -> Result<bool, StoreError> {
    tx.lock_task_of_execution(exec)
}

/// The budget check of a priced, billed call of execution `exec` costing `cost` (see
/// `store::spend`): `None` when it fits every limit at `now`, else when it can next fit and
/// why. The check and its lock are `store::spend::budget_check`.
fn budget_check(
    tx: &mut dyn Tx,
    exec: &str,
    cost: Micros,
    limits: &[Limit],
    now: Millis,
) -> Result<Option<(Millis, String)>, StoreError> {
    let provider: Option<String> = if limits.is_empty() {
        None
    } else {
        let p = tx
            .opt("SELECT t.provider FROM executions x JOIN tasks t ON t.id = x.task_id WHERE x.token = ?1", &[&exec])?
            .map(|r| r.get(0))
            .transpose()?;
        Some(p.ok_or(StoreError::Fenced)?)
    };
    // With no limit configured the provider does not matter: the check only takes the
    // budget lock, shared (`store::spend::budget_check`).
    crate::store::spend::budget_check(tx, provider.as_deref().unwrap_or(""), cost, limits, now)
}

/// Durably record "about to call the provider", with the request's price, model and
/// whether the provider bills. From here on, no automatic path calls the provider again for
/// this task unless the adapter can prove it is safe.
///
/// First, in the same operation, the budget check ([`budget_check`], under the budget lock on
/// PostgreSQL): a call that would take a period's spend over a limit is not recorded; the
/// execution is abandoned, the envelope waits in the recovery lane until the period ends (its
/// dispatch not counted as a lost one), and the task is `waiting` with the reason. Nothing was
/// sent and no attempt is counted. Both outcomes are fenced on both tokens in their first
/// write (module docs); on PostgreSQL the fence comes first of all, so a fenced worker never
/// waits for the budget lock. A call with no price to check takes no budget lock, so on
/// PostgreSQL it only locks the task first: its phase change is the fence, in one statement.
pub(in crate::store) fn record_calling(
    tx: &mut dyn Tx,
    exec: &str,
    lease: &str,
    now: Millis,
    facts: &CallingFacts,
) -> Result<CallingOutcome, StoreError> {
    let budgeted = facts.billable && facts.cost_micros.is_some();
    if budgeted && tx.locking() {
        fence(tx, exec, lease, now)?;
    } else if !lock_task_of(tx, exec)? {
        // No budget lock to wait for: the lock alone, since the phase change below is
        // fenced on both tokens in its own statement (a fenced worker writes nothing).
        return Err(StoreError::Fenced);
    }
    if let (true, Some(cost)) = (facts.billable, facts.cost_micros)
        && let Some((due_at, reason)) = budget_check(tx, exec, cost, &facts.limits, now)?
    {
        let task: String = tx
            .opt(
                "UPDATE executions SET status = 'abandoned', finished_at = ?3, error = ?4
                 WHERE token = ?1 AND status = 'running' AND phase = 'claimed'
                   AND EXISTS (SELECT 1 FROM envelopes e WHERE e.task_id = executions.task_id
                               AND e.status = 'sent' AND e.lease_token = ?2)
                 RETURNING task_id",
                &[&exec, &lease, &now, &reason],
            )?
            .ok_or(StoreError::Fenced)?
            .get(0)?;
        requeue_envelope(tx, &task, due_at, Some("budget"), now)?;
        tx.exec("UPDATE envelopes SET send_count = send_count - 1, budget_hold = true WHERE task_id = ?1", &[&task])?;
        set_task(tx, &task, TaskStatus::Waiting, Some(&reason), None, now)?;
        event(tx, &task, now, Actor::Worker, "budget", &reason, Some(exec))?;
        return Ok(CallingOutcome::Held { due_at, reason });
    }
    let charge = if facts.billable { Charge::Possible } else { Charge::None };
    // The fence and the phase change in one statement: only a `claimed` execution that still
    // holds both tokens moves to `calling`.
    let row = tx
        .opt(
            "UPDATE executions SET phase = 'calling', calling_at = ?3, heartbeat_at = ?3, charge = ?4, billable = ?5,
                    cost_micros = ?6, currency = ?7, model = ?8
             WHERE token = ?1 AND status = 'running' AND phase = 'claimed'
               AND EXISTS (SELECT 1 FROM envelopes e WHERE e.task_id = executions.task_id
                           AND e.status = 'sent' AND e.lease_token = ?2)
             RETURNING task_id, attempt",
            &[
                &exec,
                &lease,
                &now,
                &charge.as_str(),
                &facts.billable,
                &facts.cost_micros,
                &facts.currency,
                &facts.model,
            ],
        )?
        .ok_or(StoreError::Fenced)?;
    let (task, attempt): (String, i64) = (row.get(0)?, row.get(1)?);
    // The dispatch claim already cleared any budget hold (`dispatch`'s claim).
    tx.exec("UPDATE tasks SET attempts = attempts + 1, updated_at = ?2 WHERE id = ?1", &[&task, &now])?;
    // The timeline says only what is true now: the request is leaving. What it cost is
    // said by the outcome's line, from the evidence.
    let n = attempt.to_string();
    let msg = match (facts.billable, facts.cost_micros, &facts.currency) {
        (false, _, _) => say_with("say.calling_free", &[("n", &n)]),
        (true, Some(m), Some(cur)) => {
            say_with("say.calling_price", &[("n", &n), ("amount", &crate::domain::money(m, cur))])
        }
        _ => say_with("say.calling", &[("n", &n)]),
    };
    event(tx, &task, now, Actor::Worker, "calling", &msg, Some(exec))?;
    Ok(CallingOutcome::Calling)
}

/// Persist the provider's job id (and the adapter's handle for polling it, JSON) the moment
/// it arrives.
pub(in crate::store) fn record_accepted(
    tx: &mut dyn Tx,
    exec: &str,
    lease: &str,
    job: &str,
    handle: Option<&str>,
    now: Millis,
) -> Result<(), StoreError> {
    let task = fence(tx, exec, lease, now)?;
    tx.exec(
        "UPDATE executions SET phase = 'accepted', provider_job_id = ?2, provider_handle = ?3 WHERE token = ?1",
        &[&exec, &job, &handle],
    )?;
    event(tx, &task, now, Actor::Worker, "accepted", &say_with("say.accepted", &[("job", job)]), Some(exec))?;
    Ok(())
}

/// A lost create whose candidates cannot be told apart yet: the execution stays `running` in
/// `calling` (nothing is sent again) and its envelope waits in the recovery lane until
/// `due_at`, when a worker looks again. Fenced on both tokens; `false`, with nothing but the
/// fence written, when the evidence the decision rests on no longer holds: the execution is
/// not in `calling`, or `until` (when the provider stops keeping its jobs) has passed.
pub(in crate::store) fn look_again(
    tx: &mut dyn Tx,
    exec: &str,
    lease: &str,
    due_at: Millis,
    until: Millis,
    why: &str,
    now: Millis,
) -> Result<bool, StoreError> {
    let task = fence(tx, exec, lease, now)?;
    let n = tx.exec(
        "UPDATE executions SET heartbeat_at = ?2 WHERE token = ?1 AND phase = 'calling' AND ?2 < ?3",
        &[&exec, &now, &until],
    )?;
    if n == 0 {
        return Ok(false);
    }
    requeue_envelope(tx, &task, due_at.min(until), Some("looking for a lost create again later"), now)?;
    set_task(tx, &task, TaskStatus::Waiting, Some(why), None, now)?;
    event(tx, &task, now, Actor::Worker, "recovering", why, Some(exec))?;
    Ok(true)
}

/// Extend the worker's lease to `now + lease_ms`.
pub(in crate::store) fn heartbeat(
    tx: &mut dyn Tx,
    exec: &str,
    lease: &str,
    now: Millis,
    lease_ms: Millis,
) -> Result<(), StoreError> {
    let task = fence(tx, exec, lease, now)?;
    tx.exec("UPDATE envelopes SET lease_expires_at = ?2 WHERE task_id = ?1", &[&task, &(now + lease_ms)])?;
    Ok(())
}

/// How a finish that is not a success leaves its task (the decision of [`finish`], pure).
#[derive(Debug, Clone, PartialEq)]
pub(in crate::store) enum Ending {
    /// The task settles: its status, reason and failure kind; its envelope is consumed (with
    /// `envelope_error` as its last error, if any); the timeline gets `line` as `event`.
    Settle {
        status: TaskStatus,
        reason: String,
        kind: Option<FailureKind>,
        envelope_error: Option<String>,
        event: &'static str,
        line: String,
    },
    /// The task waits (reason `why`) for another attempt at `due_at`; its envelope goes back
    /// to the recovery lane with `error`; the timeline gets `line` as `retry_scheduled`.
    Retry { due_at: Millis, why: String, error: String, line: String },
}

/// The transition of a finish `f` that is not a success ([`None`] for
/// [`Finish::Succeeded`], which stores its image instead). `attempts` is the task's count of
/// attempts after this finish's own correction (a retry that is not `counted` gives its
/// attempt back); `words` are the money words of the settled charge (`charge_words`), added
/// to every line but a cancel's (nothing was sent).
///
/// The retry rule: a counted retry whose attempts reach `max_attempts` fails the task ("gave
/// up after N attempts"); any other retry waits, saying when it tries again.
pub(in crate::store) fn ending(f: &Finish, attempts: i64, words: &str, now: Millis) -> Option<Ending> {
    let settle = |status, reason: &str, kind, envelope_error: Option<&str>, event, line: &str| Ending::Settle {
        status,
        reason: reason.to_string(),
        kind,
        envelope_error: envelope_error.map(str::to_string),
        event,
        line: with_money(line, words),
    };
    Some(match f {
        Finish::Succeeded(_) | Finish::Answered(_) => return None,
        Finish::Failed { kind, reason, .. } => {
            settle(TaskStatus::Failed, reason, Some(*kind), Some(reason), "failed", reason)
        }
        Finish::Unknown { reason } => {
            let line = say_with("say.retries_stopped", &[("reason", reason)]);
            settle(TaskStatus::Unknown, reason, None, Some(reason), "unknown", &line)
        }
        Finish::RetryLater { due_at, kind, reason, max_attempts, counted, .. } => {
            if *counted && attempts >= *max_attempts {
                let why = say_with("say.gave_up", &[("n", &attempts.to_string()), ("reason", reason)]);
                settle(TaskStatus::Failed, &why, Some(*kind), Some(reason), "failed", &why)
            } else {
                let secs = (due_at - now).max(0) as f64 / 1000.0;
                let secs = format!("{secs:.1}");
                let why = if *counted {
                    say_with("say.retry_in", &[("n", &attempts.to_string()), ("reason", reason), ("secs", &secs)])
                } else {
                    say_with("say.not_taken_yet", &[("reason", reason), ("secs", &secs)])
                };
                let line = with_money(&why, words);
                Ending::Retry { due_at: *due_at, why, error: reason.clone(), line }
            }
        }
        Finish::CanceledBeforeCall => Ending::Settle {
            status: TaskStatus::Canceled,
            reason: say("say.nothing_sent"),
            kind: None,
            envelope_error: None,
            event: "canceled",
            line: say("say.canceled_before"),
        },
    })
}

/// End (or pause) an execution, fenced on both tokens, recording what its outcome proves
/// about money (the rule of `settle_charge`, kept here in the same statement as the fence);
/// then the task's transition ([`ending`], or the stored image of a success) and, when the
/// task settled, the next shot of its set.
pub(in crate::store) fn finish(
    tx: &mut dyn Tx,
    exec: &str,
    lease: &str,
    f: &Finish,
    now: Millis,
) -> Result<TaskStatus, StoreError> {
    // An answer that does not match the schema fails the task as a failed finish would, the
    // answer kept.
    let invalid;
    let (f, answer) = match f {
        Finish::Answered(a) => match &a.invalid {
            None => (f, Some(a)),
            Some(why) => {
                invalid = Finish::Failed {
                    kind: FailureKind::InvalidResult,
                    reason: say_with("say.draft_answer_invalid", &[("why", why)]),
                    charge: Charge::Charged,
                };
                (&invalid, Some(a))
            }
        },
        _ => (f, None),
    };
    let (exec_status, error) = match f {
        Finish::Succeeded(_) | Finish::Answered(_) => ("succeeded", None),
        Finish::Failed { reason, .. } | Finish::RetryLater { reason, .. } => ("failed", Some(reason.as_str())),
        Finish::Unknown { reason } => ("unknown", Some(reason.as_str())),
        Finish::CanceledBeforeCall => ("abandoned", Some("canceled before the call")),
    };
    if !lock_task_of(tx, exec)? {
        return Err(StoreError::Fenced);
    }
    // The fence, the execution's end and its charge evidence in one statement.
    let wanted = f.charge();
    let row = tx
        .opt(
            "UPDATE executions SET status = ?3, finished_at = ?4, heartbeat_at = ?4, error = ?5,
                    charge = CASE WHEN calling_at IS NULL OR NOT billable THEN 'none' ELSE ?6 END
             WHERE token = ?1 AND status = 'running'
               AND EXISTS (SELECT 1 FROM envelopes e WHERE e.task_id = executions.task_id
                           AND e.status = 'sent' AND e.lease_token = ?2)
             RETURNING task_id, charge, calling_at IS NOT NULL, cost_micros, currency",
            &[&exec, &lease, &exec_status, &now, &error, &wanted.as_str()],
        )?
        .ok_or(StoreError::Fenced)?;
    let (task, stored, called, cost, currency): (String, String, bool, Option<Micros>, Option<String>) =
        (row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?);
    let charge = Charge::parse(&stored).unwrap_or(Charge::Possible);
    let mut cost = cost;
    if let Some(a) = answer {
        tx.exec(
            "INSERT INTO answers (task_id, execution_token, body, usage, valid, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            &[&task, &exec, &a.body, &a.usage.to_string(), &a.invalid.is_none(), &now],
        )?;
        if let Some(actual) = a.cost_micros.filter(|_| charge != Charge::None) {
            // The price from the answer's usage replaces the estimate made with the ceiling.
            tx.exec("UPDATE executions SET cost_micros = ?2 WHERE token = ?1", &[&exec, &actual])?;
            cost = Some(actual);
        }
    }
    let words = charge_words(called, charge, wanted, cost, currency.as_deref());
    let ex = Some(exec);
    if let Finish::Answered(a) = f {
        let set: Option<String> = tx
            .one(
                "UPDATE tasks SET status = 'succeeded', failure_kind = NULL, updated_at = ?2, reason = NULL
                 WHERE id = ?1 RETURNING set_id",
                &[&task, &now],
            )?
            .get(0)?;
        consume_envelope(tx, &task, "consumed", None)?;
        let saved =
            say_with("say.answer_stored", &[("bytes", &a.body.len().to_string()), ("usage", &a.usage.to_string())]);
        event(tx, &task, now, Actor::Worker, "succeeded", &with_money(&saved, &words), ex)?;
        crate::failpoint::crash("before-finish-commit");
        if let Some(set) = set {
            schedule_next_shot_of(tx, &set, now)?;
        }
        return Ok(TaskStatus::Succeeded);
    }
    if let Finish::Succeeded(a) = f {
        insert_artifact(tx, &task, exec, a, now)?;
        let reason = match charge {
            Charge::Charged => say("say.cancel_kept_charged"),
            _ => say("say.cancel_kept"),
        };
        let set: Option<String> = tx
            .one(
                "UPDATE tasks SET status = 'succeeded', failure_kind = NULL, updated_at = ?2,
                        reason = CASE WHEN cancel_requested THEN ?3 END
                 WHERE id = ?1 RETURNING set_id",
                &[&task, &now, &reason],
            )?
            .get(0)?;
        consume_envelope(tx, &task, "consumed", None)?;
        let saved = say_with("say.image_stored", &[("bytes", &a.image.len().to_string()), ("sha", a.image.sha256())]);
        event(tx, &task, now, Actor::Worker, "succeeded", &with_money(&saved, &words), ex)?;
        // Crash matrix: the image and `succeeded` are written but not committed.
        crate::failpoint::crash("before-finish-commit");
        if let Some(set) = set {
            schedule_next_shot_of(tx, &set, now)?;
        }
        return Ok(TaskStatus::Succeeded);
    }
    let mut attempts = 0;
    if let Finish::RetryLater { counted, .. } = f {
        if !*counted {
            // A "not now": the provider refused this request, so it is not an attempt.
            tx.exec(
                "UPDATE tasks SET attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END WHERE id = ?1",
                &[&task],
            )?;
            tx.exec(
                "UPDATE envelopes SET send_count = CASE WHEN send_count > 0 THEN send_count - 1 ELSE 0 END
                 WHERE task_id = ?1",
                &[&task],
            )?;
        }
        attempts = tx.one("SELECT attempts FROM tasks WHERE id = ?1", &[&task])?.get(0)?;
    }
    match ending(f, attempts, &words, now) {
        Some(Ending::Settle { status, reason, kind, envelope_error, event: kind_of_event, line }) => {
            set_task(tx, &task, status, Some(&reason), kind, now)?;
            consume_envelope(tx, &task, "consumed", envelope_error.as_deref())?;
            event(tx, &task, now, Actor::Worker, kind_of_event, &line, ex)?;
            on_settled(tx, &task, now)?;
            Ok(status)
        }
        Some(Ending::Retry { due_at, why, error, line }) => {
            set_task(tx, &task, TaskStatus::Waiting, Some(&why), None, now)?;
            requeue_envelope(tx, &task, due_at, Some(&error), now)?;
            event(tx, &task, now, Actor::Worker, "retry_scheduled", &line, ex)?;
            Ok(TaskStatus::Waiting)
        }
        None => Err(StoreError::Invalid("a success has no ending without its image".into())),
    }
}

/// A result that arrived after the task was marked `unknown`, from the same execution: it is
/// evidence, resolves the task, and proves the request was charged. Returns false if the
/// execution is not `unknown` (then nothing is stored: the image bytes are dropped with the
/// operation).
pub(in crate::store) fn late_result(
    tx: &mut dyn Tx,
    exec: &str,
    a: &NewArtifact,
    now: Millis,
) -> Result<bool, StoreError> {
    if !lock_task_of(tx, exec)? {
        return Ok(false);
    }
    let task: Option<String> = tx
        .opt(
            "UPDATE executions SET status = 'succeeded', finished_at = ?2
             WHERE token = ?1 AND status = 'unknown'
               AND EXISTS (SELECT 1 FROM tasks t WHERE t.id = executions.task_id AND t.status = 'unknown')
             RETURNING task_id",
            &[&exec, &now],
        )?
        .map(|r| r.get(0))
        .transpose()?;
    let Some(task) = task else { return Ok(false) };
    let (_, words) = settle_charge(tx, exec, Charge::Charged)?;
    insert_artifact(tx, &task, exec, a, now)?;
    set_task(tx, &task, TaskStatus::Succeeded, Some(&say("say.late_answer")), None, now)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// [`ending`] with its said lines in English, as the tests read them.
    fn ending(f: &Finish, attempts: i64, words: &str, now: Millis) -> Option<Ending> {
        let en = |s: &str| crate::domain::words::english(s);
        super::ending(f, attempts, words, now).map(|e| match e {
            Ending::Settle { status, reason, kind, envelope_error, event, line } => Ending::Settle {
                status,
                reason: en(&reason),
                kind,
                envelope_error: envelope_error.map(|x| en(&x)),
                event,
                line: en(&line),
            },
            Ending::Retry { due_at, why, error, line } => {
                Ending::Retry { due_at, why: en(&why), error: en(&error), line: en(&line) }
            }
        })
    }

    fn retry(counted: bool, max_attempts: i64) -> Finish {
        Finish::RetryLater {
            due_at: 12_500,
            kind: FailureKind::RateLimited,
            reason: "HTTP 503".into(),
            max_attempts,
            charge: Charge::Refused,
            counted,
        }
    }

    #[test]
    fn a_counted_retry_waits_until_the_attempts_are_used_up_then_fails() {
        let now = 10_000;
        assert_eq!(
            ending(&retry(true, 3), 2, "", now),
            Some(Ending::Retry {
                due_at: 12_500,
                why: "attempt 2 did not go through (HTTP 503); trying again in 2.5 s".into(),
                error: "HTTP 503".into(),
                line: "attempt 2 did not go through (HTTP 503); trying again in 2.5 s".into(),
            })
        );
        let why = "gave up after 3 attempts; the last one: HTTP 503";
        assert_eq!(
            ending(&retry(true, 3), 3, "it may have been charged", now),
            Some(Ending::Settle {
                status: TaskStatus::Failed,
                reason: why.into(),
                kind: Some(FailureKind::RateLimited),
                envelope_error: Some("HTTP 503".into()),
                event: "failed",
                line: format!("{why} — it may have been charged"),
            })
        );
    }

    #[test]
    fn a_not_now_is_not_an_attempt_and_never_uses_them_up() {
        let Some(Ending::Retry { why, line, .. }) = ending(&retry(false, 1), 5, "a definite refusal", 20_000) else {
            panic!("a retry that is not counted always waits");
        };
        assert_eq!(why, "the provider did not take the request yet (HTTP 503); trying again in 0.0 s");
        assert_eq!(line, format!("{why} — a definite refusal"), "a due time already past waits 0 s, not less");
    }

    #[test]
    fn settled_endings_say_what_happened_and_a_cancel_names_no_money() {
        let unknown =
            ending(&Finish::Unknown { reason: "the connection dropped".into() }, 0, "it may have been charged", 0);
        assert_eq!(
            unknown,
            Some(Ending::Settle {
                status: TaskStatus::Unknown,
                reason: "the connection dropped".into(),
                kind: None,
                envelope_error: Some("the connection dropped".into()),
                event: "unknown",
                line: "the connection dropped; automatic retries stopped — it may have been charged".into(),
            })
        );
        let failed =
            Finish::Failed { kind: FailureKind::Rejected, reason: "prompt refused".into(), charge: Charge::Refused };
        let Some(Ending::Settle { status, kind, line, .. }) = ending(&failed, 0, "", 0) else { panic!("settles") };
        assert_eq!((status, kind, line.as_str()), (TaskStatus::Failed, Some(FailureKind::Rejected), "prompt refused"));
        let Some(Ending::Settle { status, envelope_error, line, .. }) =
            ending(&Finish::CanceledBeforeCall, 0, "ignored", 0)
        else {
            panic!("settles")
        };
        assert_eq!(
            (status, envelope_error, line.as_str()),
            (TaskStatus::Canceled, None, "canceled before anything was sent")
        );
    }
}
