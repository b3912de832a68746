//! Submit: the outbox write (a task and its envelope in one transaction). The envelope starts
//! in the fresh lane, ready at once with its place among its fairness key's tasks (see
//! `store::ops::dispatch`), or waiting while a task of another shot of its set is live.

use super::common::{Keyed, PerDialect, event, new_id, pass_sql, replay_of, set_admits};
use super::{NewTask, SubmitOutcome, fair_key};
use crate::domain::{Actor, Millis};
use crate::store::StoreError;
use crate::store::tx::{Dialect, Tx};

static ENVELOPE: PerDialect = PerDialect::new(envelope_sql);

fn envelope_sql(d: Dialect) -> String {
    format!(
        "INSERT INTO envelopes (id, task_id, provider, status, due_at, lane, fair_key, pass)
         VALUES (?1, ?2, ?3, 'pending', ?4, 'fresh', ?5, {})",
        pass_sql(d, "CAST(?3 AS TEXT)", "'fresh'", "CAST(?5 AS TEXT)", "CAST(?4 AS BIGINT)", "CAST(?6 AS BIGINT)")
    )
}

/// Insert a task and its envelope in one transaction (the outbox write). A task of a set is due
/// at once only when its set is started and nothing of the set is live or every live task of
/// it is of the same position (more candidates of the running shot, or a retry of one of them,
/// go at once beside it); else it waits (no due time) — for the set's current shot to settle,
/// or for the start of a copy to edit. Decided under the set's lock, so a set's live tasks
/// always belong to one position (`common::schedule_next_shot_of`).
pub(in crate::store) fn submit(tx: &mut dyn Tx, t: &NewTask, now: Millis) -> Result<SubmitOutcome, StoreError> {
    let hash = t.hash();
    let id = new_id();
    let (set_id, position, role, candidate) = match &t.shot {
        Some(s) => (Some(s.set_id.as_str()), Some(s.position), Some(s.role.as_str()), s.candidate),
        None => (None, None, None, 0),
    };
    // A key used before makes the insert do nothing (one statement instead of a look-up and
    // an insert for every submit); the earlier task then answers. On PostgreSQL an insert of
    // the same key on another node still in flight is waited for, then seen by the look-up.
    let inserted = tx.exec(
        "INSERT INTO tasks (id, idempotency_key, request_hash, provider, prompt, params, status, retry_of,
                            set_id, set_position, shot_role, created_at, updated_at, retry_key, group_key, candidate,
                            operation, source_kind, source_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'queued', ?7, ?8, ?9, ?10, ?11, ?11, ?12, ?13, ?14, ?15, ?16, ?17)
         ON CONFLICT (idempotency_key) DO NOTHING",
        &[
            &id,
            &t.idempotency_key,
            &hash,
            &t.provider,
            &t.prompt,
            &t.params.to_string(),
            &t.retry_of,
            &set_id,
            &position,
            &role,
            &now,
            &t.retry_key,
            &t.group,
            &candidate,
            &t.operation.as_str(),
            &t.source.as_ref().map(|s| s.kind.as_str()),
            &t.source.as_ref().map(|s| s.id.as_str()),
        ],
    )?;
    if inserted == 0 {
        return replay_of(tx, Keyed::Tasks, t.idempotency_key.as_deref(), &hash)?.ok_or_else(|| {
            StoreError::Fatal("a submit's insert did nothing, yet no task holds its idempotency key".into())
        });
    }
    // A copy to edit that was not started schedules nothing (its start does).
    let mut unstarted = false;
    let due = match set_id {
        Some(set) => {
            tx.lock_set(set)?;
            unstarted = !super::sets::set_started(tx, set)?;
            let admitted = match position {
                Some(p) => set_admits(tx, set, p)?,
                None => false,
            };
            if unstarted || !admitted { None } else { Some(now) }
        }
        None => Some(now),
    };
    let key = fair_key(set_id, t.group.as_deref());
    let sql = ENVELOPE.get(tx);
    tx.exec(sql, &[&new_id(), &id, &t.provider, &due, &key, &now])?;
    use crate::domain::words::{say, say_with};
    let mut msg = match &t.retry_of {
        Some(orig) => say_with("say.submitted_retry", &[("task", orig)]),
        None => say("say.submitted"),
    };
    if let Some(src) = &t.source {
        let key = match t.operation {
            crate::domain::operation::Operation::Cutout => "say.submitted_cutout",
            _ => "say.submitted_edit",
        };
        msg = say_with(key, &[("head", &msg), ("id", &src.id)]);
    }
    if let Some(s) = &t.shot {
        let key = match (s.candidate > 0, unstarted, due.is_none()) {
            (false, true, _) => "say.submitted_shot_unstarted",
            (true, true, _) => "say.submitted_shot_candidate_unstarted",
            (false, false, true) => "say.submitted_shot_waits",
            (true, false, true) => "say.submitted_shot_candidate_waits",
            (false, false, false) => "say.submitted_shot",
            (true, false, false) => "say.submitted_shot_candidate",
        };
        let (n, c) = ((s.position + 1).to_string(), (s.candidate + 1).to_string());
        msg = say_with(key, &[("head", &msg), ("n", &n), ("role", &s.role), ("set", &s.set_id), ("c", &c)]);
    }
    event(tx, &id, now, Actor::Api, "submitted", &msg, None)?;
    Ok(SubmitOutcome::Created(id))
}
