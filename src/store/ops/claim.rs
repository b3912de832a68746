//! The claim: what a dispatch writes for the envelopes it picked (`store::ops::dispatch`
//! decides which). For the whole batch at once, however many it holds: lease the envelopes,
//! adopt the running executions of resumed calls, open executions for the others, mark the
//! tasks `running` (one statement each), then read back everything a worker needs (one
//! statement, plus a set's reference images) and note each resumed call on its timeline.
//!
//! Written once for both backends. The statements are built once per dialect where the two
//! genuinely differ: a list of ids is bound as one JSON array, which SQLite reads with
//! `json_each` and PostgreSQL turns into an array for `= ANY` ([`in_ids`]); PostgreSQL's leases
//! and executions also name the node holding them (`lease_node`, `node_id`: bound as the last
//! parameter, on PostgreSQL only — [`node_sql`], [`with_node`]); and an execution token is
//! drawn by each database's own random function. The claimed rows were locked by the dispatch
//! (`FOR UPDATE SKIP LOCKED` on PostgreSQL), so nothing here waits on another node.

use std::collections::HashMap;

use serde_json::Value;

use super::common::{PerDialect, event};
use super::dispatch::Candidate;
use super::{Claim, Lane};
use crate::domain::words::say_with;
use crate::domain::{Actor, Millis, Phase};
use crate::store::tx::{Dialect, Param, Row, Tx};
use crate::store::{StoreError, UploadView};

/// Who takes the leases of one dispatch.
pub(super) struct Lease<'a> {
    /// How long a lease lasts.
    pub ms: Millis,
    /// The process run taking them.
    pub boot: &'a str,
    /// The PostgreSQL node taking them (`None` on SQLite).
    pub node: Option<&'a str>,
}

/// Lease the picked envelopes: `?1` now, `?2` the lease token, `?3` its length, `?4` the run,
/// `?5` the envelope ids (`?6` the node).
static LEASE: PerDialect = PerDialect::new(lease_sql);

fn lease_sql(d: Dialect) -> String {
    format!(
        "UPDATE envelopes SET status = 'sent', sent_at = ?1, send_count = send_count + 1, lease_token = ?2,
                lease_expires_at = CAST(?1 AS BIGINT) + CAST(?3 AS BIGINT), lease_boot = ?4, pass = NULL,
                budget_hold = false{node}
         WHERE id {ids} AND status = 'pending'",
        ids = in_ids(d, "?5"),
        node = node_sql(d, ", lease_node = ?6"),
    )
}

/// Adopt the running executions of resumed calls: `?1` now, `?2` the run, `?3` the task ids
/// (`?4` the node).
static ADOPT: PerDialect = PerDialect::new(adopt_sql);

fn adopt_sql(d: Dialect) -> String {
    format!(
        "UPDATE executions SET boot_id = ?2, heartbeat_at = ?1{node}
         WHERE status = 'running' AND task_id {ids}",
        ids = in_ids(d, "?3"),
        node = node_sql(d, ", node_id = ?4"),
    )
}

/// Open an execution for each of the other tasks: `?1` now, `?2` the run, `?3` the task ids
/// (`?4` the node). The provider key is `store::provider_key(task, attempt)`, written in SQL.
static OPEN: PerDialect = PerDialect::new(open_sql);

fn open_sql(d: Dialect) -> String {
    format!(
        "INSERT INTO executions (token, task_id, attempt, status, phase, idempotency_key, boot_id, heartbeat_at,
                                 started_at{node_column})
         SELECT {token}, t.id, t.attempts + 1, 'running', 'claimed',
                'tally-' || t.id || '-' || (t.attempts + 1), ?2, ?1, ?1{node}
         FROM tasks t WHERE t.id {ids}",
        token = match d {
            Dialect::Sqlite => "lower(hex(randomblob(16)))",
            Dialect::Postgres => "CAST(gen_random_uuid() AS TEXT)",
        },
        ids = in_ids(d, "?3"),
        node_column = node_sql(d, ", node_id"),
        node = node_sql(d, ", ?4"),
    )
}

/// Mark the tasks `running`: `?1` now, `?2` the task ids.
static RUNNING: PerDialect = PerDialect::new(running_sql);

fn running_sql(d: Dialect) -> String {
    format!(
        "UPDATE tasks SET status = 'running', reason = NULL, failure_kind = NULL, updated_at = ?1 WHERE id {ids}",
        ids = in_ids(d, "?2")
    )
}

/// Everything a worker needs, per claimed envelope: `?1` the envelope ids, `?2` the lease token.
static READ: PerDialect = PerDialect::new(read_sql);

fn read_sql(d: Dialect) -> String {
    format!(
        "SELECT e.id, e.task_id, e.provider, e.send_count, e.lane, t.prompt, t.params, t.cancel_requested,
                t.created_at, t.set_id, x.token, x.phase, x.provider_job_id, x.provider_handle, x.idempotency_key,
                x.calling_at, x.attempt, t.candidate, t.operation, t.source_kind, t.source_id
         FROM envelopes e JOIN tasks t ON t.id = e.task_id
              JOIN executions x ON x.task_id = e.task_id AND x.status = 'running'
         WHERE e.id {ids} AND e.lease_token = ?2",
        ids = in_ids(d, "?1")
    )
}

/// `IN` a JSON array of ids bound as parameter `p`, in the dialect.
fn in_ids(d: Dialect, p: &str) -> String {
    match d {
        Dialect::Sqlite => format!("IN (SELECT value FROM json_each({p}))"),
        Dialect::Postgres => {
            format!("= ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(CAST({p} AS TEXT) AS jsonb))))")
        }
    }
}

/// `sql` on PostgreSQL (whose leases and executions name the node), nothing on SQLite.
fn node_sql(d: Dialect, sql: &str) -> &str {
    match d {
        Dialect::Sqlite => "",
        Dialect::Postgres => sql,
    }
}

/// A statement's parameters, with the node last on PostgreSQL (whose leases name it).
fn with_node<'a>(tx: &dyn Tx, p: &[&'a dyn Param], node: &'a Option<&'a str>) -> Vec<&'a dyn Param> {
    let mut out = p.to_vec();
    if tx.dialect() == Dialect::Postgres {
        out.push(node);
    }
    out
}

/// Claim the picked envelopes (a few statements for the whole batch, however many it holds):
/// take their leases and executions ([`lease_and_open`]), read back what their workers need
/// ([`read_claims`]), and hand them out in the order they were picked, each resumed call noted
/// on its task's timeline.
pub(super) fn claim_picked(
    tx: &mut dyn Tx,
    picked: &[Candidate],
    slow_start: &[String],
    now: Millis,
    lease: &Lease<'_>,
) -> Result<Vec<Claim>, StoreError> {
    let token = uuid::Uuid::new_v4().to_string();
    let envelopes = json_ids(picked.iter().map(|p| p.id.as_str()));
    lease_and_open(tx, picked, &envelopes, &token, now, lease)?;
    let mut by_task = read_claims(tx, &envelopes, &token, slow_start)?;
    let mut out = Vec::with_capacity(picked.len());
    for p in picked {
        let Some(mut claim) = by_task.remove(&p.task_id) else { continue };
        claim.due_at = p.due_at;
        if claim.resumed {
            let msg = resumed_message(claim.attempt, claim.phase);
            event(tx, &claim.task_id, now, Actor::Worker, "resumed", &msg, Some(&claim.execution_token))?;
        }
        out.push(claim);
    }
    Ok(out)
}

/// The writes of a claim: lease the envelopes (token `token`), adopt the running executions of
/// resumed calls, open new executions for the rest, and mark the tasks `running` — one
/// statement each.
fn lease_and_open(
    tx: &mut dyn Tx,
    picked: &[Candidate],
    envelopes: &str,
    token: &str,
    now: Millis,
    lease: &Lease<'_>,
) -> Result<(), StoreError> {
    let (boot, node) = (lease.boot, &lease.node);
    let sql = LEASE.get(tx);
    let p = with_node(tx, &[&now, &token, &lease.ms, &boot, &envelopes], node);
    tx.exec(sql, &p)?;
    let (resumed, fresh): (Vec<&Candidate>, Vec<&Candidate>) = picked.iter().partition(|p| p.resumed);
    for (group, statement) in [(&resumed, &ADOPT), (&fresh, &OPEN)] {
        if !group.is_empty() {
            let ids = json_ids(group.iter().map(|p| p.task_id.as_str()));
            let sql = statement.get(tx);
            let p = with_node(tx, &[&now, &boot, &ids], node);
            tx.exec(sql, &p)?;
        }
    }
    let tasks = json_ids(picked.iter().map(|p| p.task_id.as_str()));
    let sql = RUNNING.get(tx);
    tx.exec(sql, &[&now, &tasks])?;
    Ok(())
}

/// The claims leased with `token`, by task (`due_at` not yet set), with their set's reference
/// images.
fn read_claims(
    tx: &mut dyn Tx,
    envelopes: &str,
    token: &str,
    slow_start: &[String],
) -> Result<HashMap<String, Claim>, StoreError> {
    let sql = READ.get(tx);
    let mut by_task = HashMap::new();
    for r in tx.rows(sql, &[&envelopes, &token])? {
        let mut claim = claim_of(&r, token, slow_start)?;
        if let Some(set) = r.get::<Option<String>>(9)? {
            claim.references = references_of_set(tx, &set)?;
        } else if claim.operation == crate::domain::operation::Operation::Draft {
            // A drafting call sends its draft's photos.
            claim.references = super::drafts::photos_of_task(tx, &claim.task_id)?;
        }
        by_task.insert(claim.task_id.clone(), claim);
    }
    Ok(by_task)
}

/// A claim from a row of [`READ`] (its references and due time left empty).
fn claim_of(r: &Row, token: &str, slow_start: &[String]) -> Result<Claim, StoreError> {
    let phase = Phase::parse(&r.get::<String>(11)?).unwrap_or(Phase::Calling);
    let provider: String = r.get(2)?;
    Ok(Claim {
        execution_token: r.get(10)?,
        lease_token: token.to_string(),
        envelope_id: r.get(0)?,
        send_count: r.get(3)?,
        lane: Lane::parse(&r.get::<String>(4)?),
        slow_start: slow_start.contains(&provider),
        task_id: r.get(1)?,
        provider,
        prompt: r.get(5)?,
        params: serde_json::from_str(&r.get::<String>(6)?).unwrap_or(Value::Null),
        candidate: r.get(17)?,
        attempt: r.get(16)?,
        phase,
        job_id: r.get(12)?,
        job_handle: if phase == Phase::Accepted { r.get(13)? } else { None },
        idempotency_key: r.get(14)?,
        calling_at: r.get(15)?,
        resumed: phase != Phase::Claimed,
        cancel_requested: r.get(7)?,
        created_at: r.get(8)?,
        due_at: 0,
        references: Vec::new(),
        operation: crate::domain::operation::Operation::parse(&r.get::<String>(18)?).unwrap_or_default(),
        source: crate::store::read::source_of(r.get(19)?, r.get(20)?),
    })
}

/// The timeline line of a claim that adopted an earlier worker's call of `attempt` in `phase`.
fn resumed_message(attempt: i64, phase: Phase) -> String {
    let key = match phase {
        Phase::Accepted => "say.resumed_polling",
        _ => "say.resumed_recovering",
    };
    say_with(key, &[("n", &attempt.to_string())])
}

/// An image set's reference images, in order (what a claim of one of its shots sends). A local
/// copy of `store::sets::references_of_set` over [`Tx`], until the sets family is ported.
fn references_of_set(tx: &mut dyn Tx, set: &str) -> Result<Vec<UploadView>, StoreError> {
    tx.rows(
        "SELECT u.id, u.sha256, u.bytes, u.media_type, u.created_at
         FROM set_references r JOIN uploads u ON u.id = r.upload_id WHERE r.set_id = ?1 ORDER BY r.position",
        &[&set],
    )?
    .iter()
    .map(|r| {
        Ok(UploadView {
            id: r.get(0)?,
            sha256: r.get(1)?,
            bytes: r.get(2)?,
            media_type: r.get(3)?,
            created_at: r.get(4)?,
        })
    })
    .collect()
}

/// A list of ids as one JSON array (bound as one parameter; see [`in_ids`]).
fn json_ids<'a>(ids: impl Iterator<Item = &'a str>) -> String {
    Value::Array(ids.map(|s| Value::String(s.to_string())).collect()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A statement's builder.
    type Build = fn(Dialect) -> String;

    /// The highest `?N` placeholder of a statement: how many parameters it binds.
    fn placeholders(sql: &str) -> usize {
        let mut max = 0;
        let mut rest = sql;
        while let Some(i) = rest.find('?') {
            let digits: String = rest[i + 1..].chars().take_while(char::is_ascii_digit).collect();
            max = max.max(digits.parse().unwrap_or(0));
            rest = &rest[i + 1..];
        }
        max
    }

    /// Each claim statement binds what `lease_and_open` and `read_claims` pass it: the node
    /// (last) on PostgreSQL only, whose leases and executions name it; SQLite's name no node.
    #[test]
    fn the_claim_statements_bind_the_node_on_postgres_only() {
        let builders: [(Build, usize, bool); 5] = [
            (lease_sql, 5, true),
            (adopt_sql, 3, true),
            (open_sql, 3, true),
            (running_sql, 2, false),
            (read_sql, 2, false),
        ];
        for (build, base, names_node) in builders {
            let (sqlite, pg) = (build(Dialect::Sqlite), build(Dialect::Postgres));
            assert_eq!(placeholders(&sqlite), base, "{sqlite}");
            assert_eq!(placeholders(&pg), base + usize::from(names_node), "{pg}");
            assert!(!sqlite.contains("node"), "SQLite has no nodes: {sqlite}");
            assert!(sqlite.contains("json_each") && !pg.contains("json_each"), "{sqlite}\n{pg}");
        }
    }

    #[test]
    fn a_resumed_call_says_what_happens_instead_of_sending_again() {
        assert_eq!(
            crate::domain::words::english(&resumed_message(2, Phase::Accepted)),
            "attempt 2 resumed: polling the job the provider already accepted, instead of sending again"
        );
        assert_eq!(
            crate::domain::words::english(&resumed_message(1, Phase::Calling)),
            "attempt 1 resumed: recovering the earlier call without blindly sending it again"
        );
    }
}
