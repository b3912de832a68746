//! Submit: the outbox write (a task and its envelope in one transaction). The envelope starts
//! in the fresh lane, ready at once with its place among its fairness key's tasks (see
//! `store::ops::dispatch`), or waiting while another shot of its set is live.

use rusqlite::{Connection, params};

use super::*;
use crate::domain::{Actor, Millis};

/// Insert a task and its envelope in one transaction (the outbox write).
pub(in crate::store) fn submit(c: &Connection, t: &NewTask, now: Millis) -> Result<SubmitOutcome, StoreError> {
    let hash = t.hash();
    if let Some(seen) = replay_of(c, "tasks", t.idempotency_key.as_deref(), &hash)? {
        return Ok(seen);
    }
    let id = new_id();
    let (set_id, position, role, candidate) = match &t.shot {
        Some(s) => (Some(s.set_id.as_str()), Some(s.position), Some(s.role.as_str()), s.candidate),
        None => (None, None, None, 0),
    };
    c.prepare_cached(
        "INSERT INTO tasks (id, idempotency_key, request_hash, provider, prompt, params, status, retry_of,
                            set_id, set_position, shot_role, created_at, updated_at, retry_key, group_key, candidate)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'queued', ?7, ?8, ?9, ?10, ?11, ?11, ?12, ?13, ?14)",
    )?
    .execute(params![
        id,
        t.idempotency_key,
        hash,
        t.provider,
        t.prompt,
        t.params.to_string(),
        t.retry_of,
        set_id,
        position,
        role,
        now,
        t.retry_key,
        t.group,
        candidate
    ])?;
    // A shot waits (due_at NULL) while another shot of its set is scheduled: one at a time.
    let due = match set_id {
        Some(set) if crate::store::sets::set_has_live_shot(c, set)? => None,
        _ => Some(now),
    };
    static ENVELOPE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "INSERT INTO envelopes (id, task_id, provider, status, due_at, lane, fair_key, pass)
             VALUES (?1, ?2, ?3, 'pending', ?4, 'fresh', ?5, {})",
            pass_sql("?3", "'fresh'", "?5", "?4", "?6")
        )
    });
    let key = fair_key(set_id, t.group.as_deref());
    c.prepare_cached(&ENVELOPE)?.execute(params![new_id(), id, t.provider, due, key, now])?;
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
    event(c, &id, now, Actor::Api, "submitted", &msg, None)?;
    Ok(SubmitOutcome::Created(id))
}

impl SqliteStore {
    /// Insert a task and its envelope in one transaction.
    pub async fn submit(&self, t: NewTask, now: Millis) -> Result<SubmitOutcome, StoreError> {
        self.write(move |c| submit(c, &t, now)).await
    }

    /// Like [`SqliteStore::submit`], and also read the task back in the same operation (saves the
    /// API a separate read after each submit).
    pub async fn submit_and_get(
        &self,
        t: NewTask,
        now: Millis,
    ) -> Result<(SubmitOutcome, Option<crate::store::TaskView>), StoreError> {
        self.write(move |c| {
            let out = submit(c, &t, now)?;
            let view = crate::store::get_task(c, out.task_id())?;
            Ok((out, view))
        })
        .await
    }
}
