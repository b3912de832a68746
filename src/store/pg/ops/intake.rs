//! Submit on PostgreSQL: the outbox write, with the envelope's lane, fairness key and place
//! as on SQLite (`store::ops::intake`).

use super::*;
use crate::domain::{Actor, Millis};
use crate::store::pg::PgStore;
use crate::store::{NewTask, SubmitOutcome, TaskView};

/// Insert a task and its envelope in one transaction (the outbox write).
pub(in crate::store::pg) fn submit(tx: &mut Tx<'_, '_>, t: &NewTask, now: Millis) -> Result<SubmitOutcome, StoreError> {
    let hash = t.hash();
    if let Some(seen) = task_replay(tx, t.idempotency_key.as_deref(), &hash)? {
        return Ok(seen);
    }
    let id = new_id();
    let (set_id, position, role, candidate) = match &t.shot {
        Some(s) => (Some(s.set_id.as_str()), Some(s.position), Some(s.role.as_str()), s.candidate),
        None => (None, None, None, 0),
    };
    tx.exec(
        "INSERT INTO tasks (id, idempotency_key, request_hash, provider, prompt, params, status, retry_of,
                            set_id, set_position, shot_role, group_key, created_at, updated_at, retry_key, candidate)
         VALUES ($1, $2, $3, $4, $5, $6, 'queued', $7, $8, $9, $10, $12, $11, $11, $13, $14)",
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
            &t.group,
            &t.retry_key,
            &candidate,
        ],
    )?;
    // A shot waits (due_at NULL) while another shot of its set is scheduled: one at a time.
    // The set row is locked first, so two nodes cannot both see "no live shot".
    let due = match set_id {
        Some(set) => {
            crate::store::pg::sets::lock_set(tx, set)?;
            if crate::store::pg::sets::set_has_live_shot(tx, set)? { None } else { Some(now) }
        }
        None => Some(now),
    };
    static ENVELOPE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "INSERT INTO envelopes (id, task_id, provider, status, due_at, lane, fair_key, pass)
             VALUES ($1, $2, $3, 'pending', $4, 'fresh', $5, {})",
            pass_sql("$3::text", "'fresh'", "$5::text", "$4::bigint", "$6::bigint")
        )
    });
    let key = crate::store::ops::fair_key(set_id, t.group.as_deref());
    tx.exec(ENVELOPE.as_str(), &[&new_id(), &id, &t.provider, &due, &key, &now])?;
    let mut msg = match &t.retry_of {
        Some(orig) => format!("submitted as a new operation retrying task {orig}"),
        None => "submitted".to_string(),
    };
    if let Some(s) = &t.shot {
        msg.push_str(&format!(" as shot {} ({}) of set {}", s.position + 1, s.role, s.set_id));
        if s.candidate > 0 {
            msg.push_str(&format!(", its candidate {}", s.candidate + 1));
        }
        if due.is_none() {
            msg.push_str("; it waits until the set's current shot is settled");
        }
    }
    event(tx, &id, now, Actor::Api, "submitted", &msg, None)?;
    Ok(SubmitOutcome::Created(id))
}

impl PgStore {
    /// Insert a task and its envelope in one transaction.
    pub async fn submit(&self, t: NewTask, now: Millis) -> Result<SubmitOutcome, StoreError> {
        self.write(move |tx| {
            let now = tx.now(now)?;
            submit(tx, &t, now)
        })
        .await
    }

    /// Like [`PgStore::submit`], and also read the task back in the same operation.
    pub async fn submit_and_get(
        &self,
        t: NewTask,
        now: Millis,
    ) -> Result<(SubmitOutcome, Option<TaskView>), StoreError> {
        self.write(move |tx| {
            let now = tx.now(now)?;
            let out = submit(tx, &t, now)?;
            let view = crate::store::pg::read::get_task(tx, out.task_id())?;
            Ok((out, view))
        })
        .await
    }
}
