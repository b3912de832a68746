//! The seam: [`Store`] is what the engine, the API and the web page hold, an enum over the two
//! backends — [`SqliteStore`] (one file, one writer thread; the default) and [`PgStore`]
//! (several nodes on one PostgreSQL database). Every operation is written once over
//! [`Tx`] in `store::ops` and run here through [`Store::op`], `op_at` or `query`, which hand it
//! the backend's transaction; the store conformance suite (`tests/it/conformance`) runs every
//! test against this very type on both backends. An enum, not a trait object: one `match` per
//! transaction, no boxing of the store.
//!
//! Where each backend keeps each rule (stated once here, kept in the named functions):
//!
//! | rule | SQLite | PostgreSQL |
//! |---|---|---|
//! | one writer per task (check-then-act is atomic) | the single writer thread (`store::sqlite`) | the task's envelope row lock first (`Tx::lock_task`, `postgres::conn`), set row first for set decisions |
//! | fencing | `ops::common::fence` (or its predicate inside the first write: `ops::exec`) inside the writer | the same, after the task lock (`Tx::lock_task`); the same `ops::common::fence` |
//! | recovery on current evidence | `ops::recovery::apply_recovery` re-checks `evidence_holds` in the applying transaction | the same, after the hook `ops::recovery::lock_envelopes` (the batch's envelopes locked in id order) |
//! | a claim goes to one worker, only for a free slot | single writer | a free slot row taken `FOR UPDATE SKIP LOCKED` per claim (`ops::slot_rows::take`), the candidates `FOR UPDATE SKIP LOCKED` (`ops::dispatch::candidates_sql`); no dispatch waits for another |
//! | `calling` durable before the request | durable ops answered after an fsync of the WAL that started after their commit — the flusher's, or the writer's own after a lone operation (`sqlite::flush`, `Flush::sync_inline`) | `synchronous_commit` on for durable ops (off for ordered ones) |
//! | one commit to pickup: a submit claims its own task and records `calling` only for a free slot the fair order would give it | single writer (`ops::pickup`, with `ops::dispatch::dispatch_only`) | the same operation; its slot row taken `FOR UPDATE SKIP LOCKED` as a dispatch takes it (`ops::slot_rows::take`); a node whose slot rows are all held by other dispatches takes the normal path |
//! | earlier runs are dead | the data-directory lock (`ops::recovery::Liveness::Process`) | the node's session advisory lock (`postgres::node`), read by `ops::recovery::Liveness::Nodes` |
//! | lease expiry clock | the engine's clock | the database's clock (`db_clock`) |
//! | no transaction across a network call | sync closures on the writer thread | sync closures on the store's own threads |
//! | a budget holds before the money leaves | the check and `calling` in one writer operation (`ops::exec::record_calling`) | the same transaction under the budget advisory lock (`spend::budget_lock`, taken by `spend::budget_check`), so nodes check one at a time |
//! | money is evidence (a charge needs a call) | `ops::common::settle_charge` + table CHECK | the same `ops::common::settle_charge` + table CHECK |
//! | one live retry per task and shot candidate | single writer (`ops::user::retry`) | the original's envelope lock, then its set row (`ops::user::retry` with `Tx::lock_task`, `Tx::lock_set`) |
//! | a choice names a succeeded candidate of its shot; more candidates join the set's one-at-a-time order | single writer (`ops::choice::choose`, `ops::choice::add_candidates`) | the set row locked first (`choice`, `Tx::lock_set`) |
//! | a shot is edited only while nothing was sent for it and no worker holds it (the set's photos: while no request of the set left); a set is deleted only when all of it failed or was canceled | single writer (`ops::set_edit`) | the set row, then each task's envelope in id order (`Tx::lock_set`, `Tx::lock_task`), re-read under the locks; a claim leases the envelope and marks the task `running` in one transaction |
//! | provider capacity across the cluster | the slots counted by the single writer (`ops::dispatch::dispatch_due`) | one `provider_slots` row per slot, held by each `sent` envelope (`ops::slot_rows`; freed and sized by the schema's triggers); a provider's own row is locked only to change its lane places, pause or slow start, or to take from its recovery lane (`ops::dispatch::lock_provider`) |
//! | an older copy sends nothing unsettled on its own | `sqlite::lineage::judge` at start-up, then `ops::held::hold_unsettled`; held envelopes have no due time or place | no copies by file (no lineage); the same held state and release (`held`) |
//! | retention keeps what someone still needs | the plan re-checked per delete on the writer (`prune`) | the same plan and deletes (`prune`), each delete re-checked under the task's envelope, set or photo lock (`prune::delete_singles`, `delete_set`, `delete_uploads`) |
//! | a delivery is worked by one run at a time; a file is never written twice where the target cannot tell | the claim, `writing` and every confirm check that this run holds the delivery, in one writer operation (`ops::deliveries`) | the same checks, each the guarded `UPDATE` of the delivery's row itself (`ops::deliveries::hold`), which locks the row to the end of the transaction, so a takeover (`ops::deliveries::claim`, only when queued or its lease ran out, or of this node's own earlier runs at start-up) waits for it or is seen by it; a new delivery re-checks each shot's choice under `Tx::lock_set` |
//!
//! Longer than 600 lines on purpose: it is the one list of every store operation (about ninety
//! methods of a few lines each, each running its one implementation in `store::ops`), and an
//! index reads best whole.

use std::path::Path;

use rusqlite::Connection;

use super::postgres::PgStore;
use super::spend::{BudgetUse, Group, Limit, PaidRequest, SpendReport};
use super::sqlite::tx::SqliteTx;
use super::tx::Tx;
use super::*;
use crate::config::Durability;
use crate::domain::{Millis, TaskStatus};

/// tally's store, on either backend. Cheap to clone.
#[derive(Clone)]
#[allow(missing_docs)]
pub enum Store {
    Sqlite(SqliteStore),
    Postgres(PgStore),
}

macro_rules! each {
    ($self:expr, $s:ident => $body:expr) => {
        match $self {
            Store::Sqlite($s) => $body,
            Store::Postgres($s) => $body,
        }
    };
}

/// The error a SQLite-only call gives on PostgreSQL.
fn sqlite_only(what: &str) -> StoreError {
    StoreError::Invalid(format!("{what} works on the SQLite backend only"))
}

impl From<SqliteStore> for Store {
    fn from(s: SqliteStore) -> Self {
        Store::Sqlite(s)
    }
}

impl From<PgStore> for Store {
    fn from(s: PgStore) -> Self {
        Store::Postgres(s)
    }
}

impl Store {
    /// Open (creating or migrating) the SQLite database at `path`.
    pub fn open(path: &Path, durability: Durability) -> Result<Store, StoreError> {
        SqliteStore::open(path, durability).map(Store::Sqlite)
    }

    /// Connect to PostgreSQL as one node (see [`postgres::PgStore::open`]).
    pub fn open_postgres(opts: postgres::PgOptions) -> Result<Store, StoreError> {
        PgStore::open(opts).map(Store::Postgres)
    }

    /// The SQLite store, when that is the backend.
    pub fn sqlite(&self) -> Option<&SqliteStore> {
        match self {
            Store::Sqlite(s) => Some(s),
            Store::Postgres(_) => None,
        }
    }

    /// The PostgreSQL store, when that is the backend.
    pub fn postgres(&self) -> Option<&PgStore> {
        match self {
            Store::Postgres(s) => Some(s),
            Store::Sqlite(_) => None,
        }
    }

    /// `sqlite` or `postgres`.
    pub fn backend_name(&self) -> &'static str {
        match self {
            Store::Sqlite(_) => "sqlite",
            Store::Postgres(_) => "postgres",
        }
    }

    /// The SQLite database file (SQLite only).
    pub fn path(&self) -> Option<&Path> {
        self.sqlite().map(SqliteStore::path)
    }

    /// What opening did to an older database, in plain words.
    pub fn migration_notes(&self) -> &[String] {
        match self {
            Store::Sqlite(s) => s.migration_notes(),
            Store::Postgres(_) => &[],
        }
    }

    /// SQL statements executed so far (idle checks, benchmarks).
    pub fn statements(&self) -> u64 {
        each!(self, s => s.statements())
    }

    /// Transactions committed so far.
    pub fn commits(&self) -> u64 {
        each!(self, s => s.commits())
    }

    /// Transactions that changed a row (SQLite; on PostgreSQL the commits).
    pub fn writes(&self) -> u64 {
        match self {
            Store::Sqlite(s) => s.writes(),
            Store::Postgres(s) => s.commits(),
        }
    }

    /// The sidecar's noted and durable `seq` (SQLite while served; `None` on PostgreSQL,
    /// which keeps no sidecar).
    pub fn sidecar_seqs(&self) -> Option<(i64, Option<i64>)> {
        match self {
            Store::Sqlite(s) => s.sidecar_seqs(),
            Store::Postgres(_) => None,
        }
    }

    /// fsyncs of the WAL by the flusher (SQLite; 0 on PostgreSQL, whose server groups its own
    /// flushes).
    pub fn fsyncs(&self) -> u64 {
        match self {
            Store::Sqlite(s) => s.fsyncs(),
            Store::Postgres(_) => 0,
        }
    }

    /// Durable operations answered after an fsync (SQLite; 0 on PostgreSQL).
    pub fn durable_waits(&self) -> u64 {
        match self {
            Store::Sqlite(s) => s.durable_waits(),
            Store::Postgres(_) => 0,
        }
    }

    /// Resolves with the reason once the store stopped itself (SQLite: a failed fsync,
    /// `store::sqlite::flush`); never otherwise (PostgreSQL's server handles its own fsyncs).
    pub async fn failed(&self) -> String {
        match self {
            Store::Sqlite(s) => s.failed().await,
            Store::Postgres(_) => std::future::pending().await,
        }
    }

    /// Why the store stopped itself, if it did (see [`Store::failed`]).
    pub fn failure(&self) -> Option<String> {
        match self {
            Store::Sqlite(s) => s.failure(),
            Store::Postgres(_) => None,
        }
    }

    /// Stop the store's threads (SQLite: and checkpoint the WAL into the file).
    pub fn close(&self) -> Result<(), StoreError> {
        each!(self, s => s.close())
    }

    /// A raw write on the SQLite writer (benchmarks and tests; SQLite only).
    pub async fn write<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnMut(&Connection) -> Result<R, StoreError> + Send + 'static,
    {
        match self {
            Store::Sqlite(s) => s.write(f).await,
            Store::Postgres(_) => Err(sqlite_only("a raw SQLite write")),
        }
    }

    /// A raw ordered write on the SQLite writer (SQLite only).
    pub async fn write_ordered<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnMut(&Connection) -> Result<R, StoreError> + Send + 'static,
    {
        match self {
            Store::Sqlite(s) => s.write_ordered(f).await,
            Store::Postgres(_) => Err(sqlite_only("a raw SQLite write")),
        }
    }

    /// A raw read on a SQLite reader connection (SQLite only).
    pub async fn read<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> Result<R, StoreError> + Send + 'static,
    {
        match self {
            Store::Sqlite(s) => s.read(f).await,
            Store::Postgres(_) => Err(sqlite_only("a raw SQLite read")),
        }
    }

    /// A raw read on the current thread (SQLite only).
    pub fn read_blocking<R>(&self, f: impl FnOnce(&Connection) -> Result<R, StoreError>) -> Result<R, StoreError> {
        match self {
            Store::Sqlite(s) => s.read_blocking(f),
            Store::Postgres(_) => Err(sqlite_only("a raw SQLite read")),
        }
    }

    // ---- how an operation runs ----

    /// Run one store operation (written once over [`Tx`], in `store::ops`) as a write: on
    /// SQLite's writer thread in its group commit, or in its own PostgreSQL transaction; the
    /// caller is answered once it is committed as `commit` asks. `weight` is the image bytes it
    /// stores (SQLite bounds a commit's images by it). The operation may run more than once (a
    /// batch re-run, a serialization retry): it must be a function of the database alone.
    async fn op<R, F>(&self, commit: Commit, weight: usize, mut f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnMut(&mut dyn Tx) -> Result<R, StoreError> + Send + 'static,
    {
        match self {
            Store::Sqlite(s) => {
                s.send(commit, weight, move |c| f(&mut SqliteTx::new(c)))?.await.map_err(|_| StoreError::Closed)?
            }
            Store::Postgres(p) => match commit {
                Commit::Durable => p.write(move |tx| f(tx)).await,
                Commit::Ordered => p.write_ordered(move |tx| f(tx)).await,
            },
        }
    }

    /// Run one read (written once over [`Tx`]): on a SQLite reader connection, or in one
    /// read-only PostgreSQL snapshot. It never writes.
    async fn query<R, F>(&self, mut f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnMut(&mut dyn Tx) -> Result<R, StoreError> + Send + 'static,
    {
        match self {
            Store::Sqlite(s) => s.read(move |c| f(&mut SqliteTx::new(c))).await,
            Store::Postgres(p) => p.read(move |tx| f(tx)).await,
        }
    }

    /// [`Store::op`] for an operation that takes the time: `now` is the caller's clock, or
    /// the database's where the backend keeps time there (PostgreSQL with `db_clock`).
    async fn op_at<R, F>(&self, commit: Commit, weight: usize, now: Millis, mut f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnMut(&mut dyn Tx, Millis) -> Result<R, StoreError> + Send + 'static,
    {
        self.op(commit, weight, move |tx| {
            let now = tx.now(now)?;
            f(tx, now)
        })
        .await
    }

    // ---- deliveries (`ops::deliveries`) ----

    /// Record a delivery and its queued items (each item's artifact re-checked as its shot's
    /// choice under the set's lock).
    pub async fn create_delivery(&self, d: NewDelivery, now: Millis) -> Result<DeliveryCreateOutcome, StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| ops::deliveries::create(tx, &d, now)).await
    }

    /// Hand the next delivery to the engine run `runner` (see `ops::deliveries::claim`;
    /// `takeover`: the id prefix of dead runs whose deliveries it takes at once).
    pub async fn claim_delivery(
        &self,
        runner: String,
        now: Millis,
        lease_ms: Millis,
        takeover: Option<String>,
    ) -> Result<Option<DeliveryView>, StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| {
            ops::deliveries::claim(tx, &runner, now, lease_ms, takeover.as_deref())
        })
        .await
    }

    /// Durably record an item's write before it is attempted; `false` if `runner` lost the
    /// delivery.
    pub async fn record_delivery_writing(
        &self,
        id: String,
        position: i64,
        runner: String,
        file: FileFacts,
        now: Millis,
        lease_ms: Millis,
    ) -> Result<bool, StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| {
            ops::deliveries::record_writing(tx, &id, position, &runner, &file, now, lease_ms)
        })
        .await
    }

    /// Record how an item's write ended; the delivery's derived state (`None`: `runner` lost it).
    pub async fn confirm_delivery_item(
        &self,
        id: String,
        position: i64,
        runner: String,
        outcome: ItemOutcome,
        now: Millis,
    ) -> Result<Option<DeliveryState>, StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| {
            ops::deliveries::confirm(tx, &id, position, &runner, &outcome, now)
        })
        .await
    }

    /// Write a held delivery's state from its items (none open).
    pub async fn settle_delivery(
        &self,
        id: String,
        runner: String,
        now: Millis,
    ) -> Result<Option<DeliveryState>, StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| ops::deliveries::settle(tx, &id, &runner, now)).await
    }

    /// Queue again what a finished delivery did not deliver.
    pub async fn retry_delivery(&self, id: String, now: Millis) -> Result<RetryDeliveryOutcome, StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| ops::deliveries::retry(tx, &id, now)).await
    }

    /// One delivery with its items.
    pub async fn delivery(&self, id: String) -> Result<Option<DeliveryView>, StoreError> {
        self.query(move |tx| ops::deliveries::get(tx, &id)).await
    }

    /// A set's deliveries, oldest first.
    pub async fn set_deliveries(&self, set: String) -> Result<Vec<DeliveryView>, StoreError> {
        self.query(move |tx| ops::deliveries::list_for_set(tx, &set)).await
    }

    /// When the earliest lease of a delivery being delivered runs out.
    pub async fn next_delivery_lease_end(&self) -> Result<Option<Millis>, StoreError> {
        self.query(ops::deliveries::next_lease_end).await
    }

    // ---- write operations ----

    /// Insert a task and its envelope in one transaction (the outbox write).
    pub async fn submit(&self, t: NewTask, now: Millis) -> Result<SubmitOutcome, StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| ops::submit(tx, &t, now)).await
    }

    /// Submit and read the task back in the same operation.
    pub async fn submit_and_get(
        &self,
        t: NewTask,
        now: Millis,
    ) -> Result<(SubmitOutcome, Option<TaskView>), StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| {
            let out = ops::submit(tx, &t, now)?;
            let view = read::task(tx, out.task_id())?;
            Ok((out, view))
        })
        .await
    }

    /// Submit, and where the fast path applies (`ops::pickup`: a free slot, the fair order
    /// picks this task first) claim it and record `calling` in the same durable commit; with
    /// `view`, the task as committed too. The lease is this process run's (`boot`) and, on
    /// PostgreSQL, this node's.
    pub async fn submit_and_pick_up(
        &self,
        t: NewTask,
        now: Millis,
        mut p: Pickup,
        view: bool,
    ) -> Result<(SubmitOutcome, Option<TaskView>, PickedUp), StoreError> {
        p.node = self.postgres().map(|s| s.node().to_string());
        self.op_at(Commit::Durable, 0, now, move |tx, now| {
            let (out, picked) = ops::pickup::submit_and_pick_up(tx, &t, now, &p)?;
            let task = if view { read::task(tx, out.task_id())? } else { None };
            Ok((out, task, picked))
        })
        .await
    }

    /// Claim ready envelopes for free provider slots, in lane and fairness order
    /// (`ops::dispatch`), and say when to look again. An ordered commit: nothing leaves for a
    /// provider before the next durable one (`record_calling`, whose flush covers the claim
    /// too); if a power loss erases it, the envelopes are simply still `pending`.
    pub async fn dispatch_due(
        &self,
        now: Millis,
        limit: usize,
        lease_ms: Millis,
        boot: &str,
    ) -> Result<DispatchBatch, StoreError> {
        let boot = boot.to_string();
        let node = self.postgres().map(|p| p.node().to_string());
        self.op_at(Commit::Ordered, 0, now, move |tx, now| {
            ops::dispatch::dispatch_due(tx, now, limit, lease_ms, &boot, node.as_deref())
        })
        .await
    }

    /// Write the configured providers for the dispatcher (engine start).
    pub async fn configure_providers(&self, list: Vec<ProviderSlots>) -> Result<(), StoreError> {
        self.op(Commit::Durable, 0, move |tx| ops::slots::configure_providers(tx, &list)).await
    }

    /// Pause dispatching to a provider (its circuit opened, or it asked tally to wait). Ordered:
    /// if a power loss erases it, the provider is simply not paused.
    pub async fn pause_provider(&self, provider: String, pause: Pause) -> Result<(), StoreError> {
        self.op(Commit::Ordered, 0, move |tx| ops::slots::pause_provider(tx, &provider, &pause)).await
    }

    /// A call's outcome while the provider's recovery lane is in its slow start.
    pub async fn slow_start_feedback(&self, provider: String, ok: bool) -> Result<(), StoreError> {
        self.op(Commit::Ordered, 0, move |tx| ops::slots::slow_start_feedback(tx, &provider, ok)).await
    }

    /// Hand a claim back before anything was sent (its provider's circuit is open).
    pub async fn release_claim(
        &self,
        exec: String,
        lease: String,
        due_at: Millis,
        why: String,
        now: Millis,
    ) -> Result<(), StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| {
            ops::slots::release_claim(tx, &exec, &lease, due_at, &why, now)
        })
        .await
    }

    /// The dispatch statements' query plans (SQLite only; the benchmark report).
    pub async fn dispatch_plans(&self) -> Result<Vec<String>, StoreError> {
        match self {
            Store::Sqlite(s) => s.dispatch_plans().await,
            Store::Postgres(_) => Err(sqlite_only("the dispatch plans")),
        }
    }

    /// Durably record phase `calling`, or hold the call back for a budget.
    pub async fn record_calling(
        &self,
        exec: String,
        lease: String,
        now: Millis,
        facts: CallingFacts,
    ) -> Result<CallingOutcome, StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| ops::exec::record_calling(tx, &exec, &lease, now, &facts))
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
        self.op_at(Commit::Durable, 0, now, move |tx, now| {
            ops::exec::record_accepted(tx, &exec, &lease, &job, None, now)
        })
        .await
    }

    /// Persist an accepted job id with the adapter's handle for polling it
    /// (`executions.provider_handle`, JSON).
    pub async fn record_accepted_with(
        &self,
        exec: String,
        lease: String,
        job: String,
        handle: Option<String>,
        now: Millis,
    ) -> Result<(), StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| {
            ops::exec::record_accepted(tx, &exec, &lease, &job, handle.as_deref(), now)
        })
        .await
    }

    /// Put a lost create's execution back to be looked for again at `due_at` (see
    /// `ops::exec::look_again`); `false` when `until` passed or it is no longer `calling`.
    pub async fn look_again(
        &self,
        exec: String,
        lease: String,
        due_at: Millis,
        until: Millis,
        why: String,
        now: Millis,
    ) -> Result<bool, StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| {
            ops::exec::look_again(tx, &exec, &lease, due_at, until, &why, now)
        })
        .await
    }

    /// Extend a lease (ordered commit: after a power loss every lease counts as expired).
    pub async fn heartbeat(
        &self,
        exec: String,
        lease: String,
        now: Millis,
        lease_ms: Millis,
    ) -> Result<(), StoreError> {
        self.op_at(Commit::Ordered, 0, now, move |tx, now| ops::exec::heartbeat(tx, &exec, &lease, now, lease_ms)).await
    }

    /// End or pause an execution; a `Succeeded` finish stores the image's bytes in the same
    /// transaction.
    pub async fn finish(&self, exec: String, lease: String, f: Finish, now: Millis) -> Result<TaskStatus, StoreError> {
        let bytes = match &f {
            Finish::Succeeded(a) => a.image.len() as usize,
            Finish::Answered(a) => a.body.len(),
            _ => 0,
        };
        self.op_at(Commit::Durable, bytes, now, move |tx, now| ops::exec::finish(tx, &exec, &lease, &f, now)).await
    }

    /// Attach a late result (its bytes in the same transaction) to an `unknown` execution.
    pub async fn late_result(&self, exec: String, a: NewArtifact, now: Millis) -> Result<bool, StoreError> {
        let bytes = a.image.len() as usize;
        self.op_at(Commit::Durable, bytes, now, move |tx, now| ops::exec::late_result(tx, &exec, &a, now)).await
    }

    /// Cancel a task.
    pub async fn cancel(&self, task: String, now: Millis) -> Result<CancelOutcome, StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| ops::user::cancel(tx, &task, now)).await
    }

    /// Retry a task as a new one.
    pub async fn retry(
        &self,
        task: String,
        ack: RetryAck,
        key: Option<String>,
        now: Millis,
    ) -> Result<RetryOutcome, StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| ops::user::retry(tx, &task, &ack, key.as_deref(), now)).await
    }

    /// Resolve an `unknown` task by hand.
    pub async fn resolve(
        &self,
        task: String,
        r: Resolution,
        owner: OwnerCharge,
        note: String,
        now: Millis,
    ) -> Result<ResolveOutcome, StoreError> {
        let bytes = match &r {
            Resolution::Succeeded(a) => a.image.len() as usize,
            Resolution::Failed => 0,
        };
        self.op_at(Commit::Durable, bytes, now, move |tx, now| ops::user::resolve(tx, &task, &r, owner, &note, now))
            .await
    }

    /// Leftovers for the reconciler (`ops::recovery::leftovers`; it writes nothing). SQLite
    /// reads through the writer, so it sees every commit (ordered: no fsync of its own);
    /// PostgreSQL reads in one read-only snapshot and names this node for its liveness hook.
    pub async fn leftovers(&self, now: Millis, boot: &str) -> Result<Vec<LeftoverRow>, StoreError> {
        use ops::recovery::{Liveness, leftovers};
        let boot = boot.to_string();
        match self {
            Store::Sqlite(_) => {
                self.op_at(Commit::Ordered, 0, now, move |tx, now| {
                    leftovers(tx, now, Liveness::Process { boot: &boot })
                })
                .await
            }
            Store::Postgres(p) => {
                let node = p.node().to_string();
                p.read(move |tx| {
                    let now = tx.now(now)?;
                    let alive = Liveness::Nodes { node: &node, boot: &boot, lock_class: postgres::LOCK_CLASS };
                    leftovers(tx, now, alive)
                })
                .await
            }
        }
    }

    /// Apply reconciler decisions, each re-checked on the evidence it was made from
    /// (`ops::recovery::apply_recovery`).
    pub async fn apply_recovery(
        &self,
        items: Vec<(LeftoverRow, Recovery)>,
        now: Millis,
    ) -> Result<Vec<(String, TaskStatus)>, StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| ops::recovery::apply_recovery(tx, &items, now)).await
    }

    /// Store an uploaded image (deduplicated by content).
    pub async fn save_upload(&self, img: NewImage, now: Millis) -> Result<UploadView, StoreError> {
        let bytes = img.len() as usize;
        self.op_at(Commit::Durable, bytes, now, move |tx, now| ops::sets::save_upload(tx, &img, now)).await
    }

    /// Create a set with its shots.
    pub async fn create_set(&self, set: NewSet, now: Millis) -> Result<SubmitOutcome, StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| ops::sets::create_set(tx, &set, now)).await
    }

    // ---- drafts (`ops::drafts`) ----

    /// Create a draft with its photos and its first drafting task, in one transaction.
    pub async fn create_draft(&self, d: NewDraft, now: Millis) -> Result<SubmitOutcome, StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| ops::drafts::create_draft(tx, &d, now)).await
    }

    /// A new revision of a draft after `base` (the latest): the owner's `body`, or a redraft's
    /// drafting `task`.
    pub async fn revise_draft(
        &self,
        id: String,
        base: i64,
        body: Option<String>,
        task: Option<NewTask>,
        now: Millis,
    ) -> Result<DraftChange, StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| {
            ops::drafts::revise(tx, &id, base, body.as_deref(), task.as_ref(), now)
        })
        .await
    }

    /// Confirm a draft's latest revision: its set, created and linked in one transaction.
    pub async fn confirm_draft(
        &self,
        id: String,
        revision: i64,
        set: NewSet,
        now: Millis,
    ) -> Result<ConfirmOutcome, StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| ops::drafts::confirm(tx, &id, revision, &set, now)).await
    }

    /// A draft with its photos and revisions.
    pub async fn get_draft(&self, id: String) -> Result<Option<DraftView>, StoreError> {
        self.query(move |tx| ops::drafts::get_draft(tx, &id)).await
    }

    /// Drafts newest first, after the cursor `before`.
    pub async fn list_drafts(&self, before: Option<String>, limit: usize) -> Result<Vec<DraftView>, StoreError> {
        self.query(move |tx| ops::drafts::list_drafts(tx, before.as_deref(), limit)).await
    }

    /// Cancel a set's unsent shots.
    pub async fn cancel_set(&self, id: String, now: Millis) -> Result<Option<usize>, StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| ops::sets::cancel_set(tx, &id, now)).await
    }

    /// Edit a set before anything was sent for what the edit touches (`store::set_edit`).
    pub async fn edit_set(&self, id: String, edit: SetEdit, now: Millis) -> Result<EditOutcome, StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| ops::set_edit::edit_set(tx, &id, &edit, now)).await
    }

    /// Duplicate a set as a copy to edit, nothing of it scheduled until it is started — or
    /// started at once with `start` (`None`: no such set).
    pub async fn duplicate_set(
        &self,
        id: String,
        key: Option<String>,
        start: bool,
        now: Millis,
    ) -> Result<Option<SubmitOutcome>, StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| {
            ops::set_edit::duplicate_set(tx, &id, key.as_deref(), start, now)
        })
        .await
    }

    /// Set or remove the words drawn on a shot's image (`ops::sets::set_overlay`); `false`: no
    /// such set or shot.
    pub async fn set_overlay(
        &self,
        id: String,
        position: i64,
        overlay: Option<crate::domain::overlay::Overlay>,
        now: Millis,
    ) -> Result<bool, StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| {
            ops::sets::set_overlay(tx, &id, position, overlay.as_ref(), now)
        })
        .await
    }

    /// Start a copy to edit (see `ops::sets::start_set`).
    pub async fn start_set(&self, id: String, now: Millis) -> Result<StartOutcome, StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| ops::sets::start_set(tx, &id, now)).await
    }

    /// Start a copy to edit if it still sends what `priced` (its [`Store::set_as_new`] when the
    /// owner was asked) would: else `Changed`, and nothing is sent.
    pub async fn start_priced_set(&self, id: String, priced: NewSet, now: Millis) -> Result<StartOutcome, StoreError> {
        let hash = priced.hash();
        self.op_at(Commit::Durable, 0, now, move |tx, now| ops::sets::start_priced_set(tx, &id, &hash, now)).await
    }

    /// What a duplicate of a set would create (`None`: no such set): the API prices it first.
    pub async fn set_as_new(&self, id: String) -> Result<Option<NewSet>, StoreError> {
        self.query(move |tx| ops::set_edit::as_new_set(tx, &id, None)).await
    }

    /// Delete a set whose every task failed or was canceled, keeping as jobs of their own the
    /// tasks whose request reached the provider (`store::set_edit`).
    pub async fn delete_set(&self, id: String, now: Millis) -> Result<DeleteOutcome, StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| ops::set_edit::delete_set(tx, &id, now)).await
    }

    /// Retention: delete what settled before `cutoff` (`store::prune`): the plan from one
    /// read, then bounded batches of deletes, each its own write that re-checks what it
    /// deletes; on SQLite the freed pages are then given back to the file system.
    pub async fn prune(&self, cutoff: Millis, dry_run: bool) -> Result<PruneReport, StoreError> {
        let plan = self.query(move |tx| prune::plan(tx, cutoff)).await?;
        if dry_run {
            return Ok(PruneReport { dry_run: true, ..plan.report });
        }
        let before = match self {
            Store::Sqlite(s) => Some(s.db_bytes().await?),
            Store::Postgres(_) => None,
        };
        let mut done = PruneReport { cutoff, ..PruneReport::default() };
        for batch in plan.singles.chunks(prune::TASK_BATCH) {
            let ids = batch.to_vec();
            prune::add(
                &mut done,
                &self.op(Commit::Durable, 0, move |tx| prune::delete_singles(tx, &ids, cutoff)).await?,
            );
        }
        for set in plan.sets {
            prune::add(&mut done, &self.op(Commit::Durable, 0, move |tx| prune::delete_set(tx, &set, cutoff)).await?);
        }
        let uploads = plan.uploads;
        prune::add(
            &mut done,
            &self.op(Commit::Durable, 0, move |tx| prune::delete_uploads(tx, &uploads, cutoff)).await?,
        );
        if let (Store::Sqlite(s), Some(before)) = (self, before) {
            s.vacuum().await?;
            done.freed_bytes = (before - s.db_bytes().await?).max(0);
        }
        done.kept_unknown = plan.report.kept_unknown;
        done.kept_in_sets += plan.report.kept_in_sets;
        done.kept_retried = plan.report.kept_retried;
        done.kept_for_spend = plan.report.kept_for_spend;
        Ok(done)
    }

    /// When the oldest settled task changed at or after `since` last changed.
    pub async fn next_prunable(&self, since: Millis) -> Result<Option<Millis>, StoreError> {
        self.query(move |tx| prune::next_prunable(tx, since)).await
    }

    // ---- held jobs (an older copy of the database: `store::held`, `store::sqlite::lineage`) ----

    /// Hold every unsettled job whose request did not leave, with `reason` (SQLite: at the
    /// start-up of an older database, claims included; PostgreSQL: pending jobs only).
    pub async fn hold_unsettled(&self, reason: String, now: Millis) -> Result<Vec<String>, StoreError> {
        // The caller's clock on both backends, as before the operation was written once.
        self.op(Commit::Durable, 0, move |tx| ops::held::hold_unsettled(tx, &reason, now)).await
    }

    /// Release held jobs: each is queued to be sent again.
    pub async fn release_held(&self, which: held::Release, now: Millis) -> Result<held::ReleaseReport, StoreError> {
        self.op(Commit::Durable, 0, move |tx| ops::held::release_held(tx, &which, now)).await
    }

    /// Apply what a look at the provider decided about a held job, re-checked in its
    /// transaction (`ops::held::settle_held`).
    pub async fn settle_held(&self, look: held::HeldLook, now: Millis) -> Result<held::Settled, StoreError> {
        let node = self.postgres().map(|p| p.node().to_string());
        self.op(Commit::Durable, 0, move |tx| ops::held::settle_held(tx, &look, node.as_deref(), now)).await
    }

    /// Held jobs (at most `limit`), and how many there are.
    pub async fn held_tasks(&self, limit: usize) -> Result<(i64, Vec<TaskView>), StoreError> {
        self.query(move |tx| ops::held::held_tasks(tx, limit)).await
    }

    // ---- reads ----

    /// One task with its artifacts.
    pub async fn get_task(&self, id: String) -> Result<Option<TaskView>, StoreError> {
        self.query(move |tx| read::task(tx, &id)).await
    }

    /// Tasks newest first.
    pub async fn list_tasks(
        &self,
        filter: TaskFilter,
        before: Option<String>,
        limit: usize,
    ) -> Result<Vec<TaskView>, StoreError> {
        self.query(move |tx| read::list_tasks(tx, &filter, before.as_deref(), limit)).await
    }

    // ---- money (charge evidence, spend, budgets) ----

    /// Settled requests by provider and charge, for `/metrics`.
    pub async fn charge_totals(&self) -> Result<Vec<crate::metrics::ChargeTotal>, StoreError> {
        self.query(spend::charge_totals).await
    }

    /// Tasks held back by a budget check it again.
    pub async fn release_budget_holds(&self, now: Millis) -> Result<usize, StoreError> {
        self.op_at(Commit::Ordered, 0, now, spend::release_budget_holds).await
    }

    /// The budget set at run time (its JSON), if one is set.
    pub async fn budget_setting(&self) -> Result<Option<String>, StoreError> {
        self.query(ops::settings::budget_setting).await
    }

    /// A setting the owner changed in the page (`time_zone`), if it is set.
    pub async fn shop_setting(&self, key: &'static str) -> Result<Option<String>, StoreError> {
        self.query(move |tx| ops::settings::shop_setting(tx, key)).await
    }

    /// Store a setting the owner changed, or remove it (the configuration's applies again).
    pub async fn set_shop_setting(
        &self,
        key: &'static str,
        value: Option<String>,
        now: Millis,
    ) -> Result<(), StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| {
            ops::settings::set_shop_setting(tx, key, value.as_deref(), now)
        })
        .await
    }

    /// Store the budget in force, or remove it (the config's applies again).
    pub async fn set_budget_setting(&self, limits: Option<String>, now: Millis) -> Result<(), StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| {
            ops::settings::set_budget_setting(tx, limits.as_deref(), now)
        })
        .await
    }

    // ---- web sessions ----

    /// Record a new web session (the hash of its cookie value and its CSRF token).
    pub async fn insert_session(
        &self,
        id_hash: String,
        csrf: String,
        device: Option<String>,
        now: Millis,
    ) -> Result<(), StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| {
            ops::settings::insert_session(tx, &id_hash, &csrf, device.as_deref(), now)
        })
        .await
    }

    /// Every web session used since `expired_before`, the most recently used first.
    pub async fn sessions(&self, expired_before: Millis) -> Result<Vec<settings::SessionRow>, StoreError> {
        self.query(move |tx| ops::settings::sessions(tx, expired_before)).await
    }

    /// A web session by the hash of its cookie value.
    pub async fn session(&self, id_hash: String) -> Result<Option<settings::StoredSession>, StoreError> {
        self.query(move |tx| ops::settings::session(tx, &id_hash)).await
    }

    /// Note a session's use; delete those unused since `expired_before`.
    pub async fn touch_session(&self, id_hash: String, now: Millis, expired_before: Millis) -> Result<(), StoreError> {
        // The caller's clock on both backends (an ordered write: losing it to a power cut only
        // makes the session look older).
        self.op(Commit::Ordered, 0, move |tx| ops::settings::touch_session(tx, &id_hash, now, expired_before)).await
    }

    /// End one web session, or all (`None`); how many ended.
    pub async fn delete_sessions(&self, id_hash: Option<String>) -> Result<usize, StoreError> {
        self.op(Commit::Durable, 0, move |tx| ops::settings::delete_sessions(tx, id_hash.as_deref())).await
    }

    /// The spend report.
    pub async fn spend(
        &self,
        from: Millis,
        to: Millis,
        group: Group,
        zone: jiff::tz::TimeZone,
    ) -> Result<SpendReport, StoreError> {
        self.query(move |tx| spend::report(tx, from, to, group, &zone)).await
    }

    /// How much of each budget is used.
    pub async fn budget_use(&self, limits: Vec<Limit>, now: Millis) -> Result<Vec<BudgetUse>, StoreError> {
        self.query(move |tx| {
            let now = tx.now(now)?;
            spend::budget_use(tx, &limits, now)
        })
        .await
    }

    /// The requests that may have cost money.
    pub async fn paid_requests(&self, from: Millis, to: Millis) -> Result<Vec<PaidRequest>, StoreError> {
        self.query(move |tx| spend::requests(tx, from, to)).await
    }

    /// A task's timeline.
    pub async fn events(&self, task: String) -> Result<Vec<EventView>, StoreError> {
        self.query(move |tx| read::events(tx, &task)).await
    }

    /// One artifact.
    pub async fn artifact(&self, id: String) -> Result<Option<ArtifactView>, StoreError> {
        self.query(move |tx| read::artifact(tx, &id)).await
    }

    /// What start-up noticed that the owner has not dismissed (`store::read::notices`).
    pub async fn notices(&self) -> Result<Vec<(i64, String, Millis, serde_json::Value)>, StoreError> {
        self.query(read::notices).await
    }

    /// Dismiss a notice; `false` when there was none to dismiss.
    pub async fn dismiss_notice(&self, id: i64, now: Millis) -> Result<bool, StoreError> {
        self.op(Commit::Durable, 0, move |tx| ops::held::dismiss_notice(tx, id, now)).await
    }

    /// How many of `provider`'s tasks are queued, waiting or running.
    pub async fn live_tasks_of(&self, provider: String) -> Result<i64, StoreError> {
        self.query(move |tx| read::live_tasks_of(tx, &provider)).await
    }

    /// Number of tasks per status.
    pub async fn status_counts(&self) -> Result<Vec<(TaskStatus, i64)>, StoreError> {
        self.query(read::status_counts).await
    }

    /// The reconciler's next deadline.
    pub async fn next_sent_deadline(&self) -> Result<Option<Millis>, StoreError> {
        self.query(read::next_sent_deadline).await
    }

    /// A set with its current shots.
    pub async fn get_set(&self, id: String) -> Result<Option<SetView>, StoreError> {
        self.query(move |tx| ops::sets::get_set(tx, &id)).await
    }

    /// Add `count` candidates to shot `position` of a set (`store::choice`).
    pub async fn add_candidates(
        &self,
        set: String,
        position: i64,
        count: u32,
        op: Option<CandidateOp>,
        now: Millis,
    ) -> Result<AddOutcome, StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| {
            ops::choice::add_candidates(tx, &set, position, count, op.as_ref(), now)
        })
        .await
    }

    /// Choose (or, with `None`, clear) the image of shot `position` of a set.
    pub async fn choose(
        &self,
        set: String,
        position: i64,
        artifact: Option<String>,
        now: Millis,
    ) -> Result<ChoiceOutcome, StoreError> {
        self.op_at(Commit::Durable, 0, now, move |tx, now| {
            ops::choice::choose(tx, &set, position, artifact.as_deref(), now)
        })
        .await
    }

    /// Sets newest first.
    pub async fn list_sets(&self, before: Option<String>, limit: usize) -> Result<Vec<SetView>, StoreError> {
        self.query(move |tx| ops::sets::list_sets(tx, before.as_deref(), limit)).await
    }

    /// An upload by id.
    pub async fn upload(&self, id: String) -> Result<Option<UploadView>, StoreError> {
        self.query(move |tx| ops::sets::upload(tx, &id)).await
    }

    /// An upload with the product its download is named after.
    pub async fn upload_for_download(&self, id: String) -> Result<Option<(UploadView, Option<String>)>, StoreError> {
        self.query(move |tx| ops::sets::upload_for_download(tx, &id)).await
    }

    /// The whole image stored under `id`, for small uses.
    pub async fn read_image_bytes(&self, id: String) -> Result<Option<(BlobMeta, Vec<u8>)>, StoreError> {
        each!(self, s => s.read_image_bytes(id).await)
    }

    /// A streaming reader of the image stored under `id`. Blocking: call it off the async
    /// threads.
    pub fn open_blob(&self, id: &str) -> Result<Option<BlobReader>, StoreError> {
        match self {
            Store::Sqlite(s) => s.open_blob(id),
            Store::Postgres(p) => Ok(p.blob_meta_blocking(id)?.map(|meta| BlobReader::postgres(p.clone(), meta))),
        }
    }

    /// [`Store::read_image_bytes`] on the current thread (off the async threads).
    pub fn read_image_bytes_blocking(&self, id: &str) -> Result<Option<(BlobMeta, Vec<u8>)>, StoreError> {
        let Some(mut r) = self.open_blob(id)? else { return Ok(None) };
        let mut out = Vec::with_capacity(r.meta().bytes.max(0) as usize);
        while let Some(chunk) = r.next_chunk(CHUNK)? {
            out.extend_from_slice(&chunk);
        }
        Ok(Some((r.meta().clone(), out)))
    }
}
