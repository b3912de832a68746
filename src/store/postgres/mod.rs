//! The PostgreSQL backend: the same store operations as the SQLite backend, for several tally
//! daemons ("nodes") sharing one database.
//!
//! Shape: a few dedicated OS threads each own one synchronous `postgres::Client` and take
//! operations from one queue. An operation is a synchronous closure over one transaction
//! ([`Tx`]), so, exactly as on SQLite, **no transaction spans a network call**: a closure cannot
//! await a provider. Callers get the result through a oneshot once `COMMIT` returned. The
//! node's own connection (`node.rs`) holds the node's advisory lock and listens for wake-ups.
//!
//! Rules every operation here keeps (they replace SQLite's single writer):
//! - **L — lock first, then look.** Under READ COMMITTED, an operation on a task first locks
//!   the task's envelope row (`SELECT … FOR UPDATE`; a set operation locks the set row first):
//!   one writer per task. Each later statement takes a fresh snapshot, so after the lock it
//!   sees every commit that preceded it. Lock order: set → envelope → execution.
//! - **E — evidence under the lock.** A decision made in an earlier transaction (the
//!   reconciler's leftovers) is re-verified after L; if anything changed it is skipped
//!   (`store::ops::recovery`: its `lock_envelopes` hook, then `evidence_holds`).
//! - **G — guarded writes.** Every UPDATE still carries its own predicate and its row count
//!   is checked.
//! - **C — commit class.** [`Commit::Ordered`] operations commit with
//!   `synchronous_commit = off` (the server's WAL is one ordered stream, so the next durable
//!   commit's flush covers them); durable ones with the server's setting (`on` unless the
//!   server is configured otherwise).
//! - **A — ambiguous commit.** A connection lost during `COMMIT` is reported as
//!   [`StoreError::Commit`]: the caller must act as if it may or may not have committed.
//! - **T — time.** With `db_clock`, every operation reads the database's clock at its start
//!   and uses it instead of the caller's `now`, so leases of all nodes expire on one clock.
//!   That read travels with the transaction's `START TRANSACTION` in one round trip (`conn.rs`).
//! - Deadlocks and serialization failures are retried (the closure is `FnMut`: operations
//!   are pure database functions, so running one again is safe).
//!
//! Longer than 600 lines on purpose: opening a node (connect, migrate, take the node lock,
//! start the threads and the watcher) and the queue every operation goes through are one
//! lifecycle; the operations themselves are `store::ops`, the threads' transactions `conn.rs`.

mod check;
mod conn;
mod node;
mod read;
mod timeouts;
mod watch;

pub use check::check;
use conn::op_loop;
pub(crate) use conn::{Conn, Tx};
pub use node::NodeState;
pub use timeouts::Timeouts;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::Duration;

use postgres::{Client, NoTls};
use tokio::sync::oneshot;

use super::{Commit, StoreError};
use crate::config::Durability;

/// The full current PostgreSQL schema.
const SCHEMA: &str = include_str!("../../../schema-pg.sql");

/// The PostgreSQL schema version this build writes (independent of SQLite's
/// `SCHEMA_VERSION`). Older databases are migrated by [`MIGRATIONS`]; newer ones refused.
pub const PG_SCHEMA_VERSION: i32 = 17;

/// Migrations from version `n` to `n + 1`, indexed by `n - 1`. Each runs in the transaction
/// that records the new version, under the migration lock, and only while no other node of
/// this database is running (an older build would go on writing rows without what the
/// migration adds). Columns are appended, so a migrated schema has the same catalog as a new
/// one (`tests/it/conformance/pg_migrate.rs` compares them, from `tests/fixtures/pg-schema-v1.sql`).
const MIGRATIONS: &[&str] = &[
    // 1 → 2: charge evidence per execution, prices, budget holds, retry keys per original
    // (as SQLite's 4 → 5). Version 1 recorded only "calling was reached", so an old request
    // that did not succeed is backfilled as 'possible' (what tally told the user then),
    // never 'refused'.
    "ALTER TABLE tasks ADD COLUMN retry_key text;
     CREATE UNIQUE INDEX tasks_by_retry_key ON tasks(retry_of, retry_key) WHERE retry_key IS NOT NULL;
     ALTER TABLE envelopes ADD COLUMN budget_hold boolean NOT NULL DEFAULT false;
     ALTER TABLE executions ADD COLUMN charge text NOT NULL DEFAULT 'none'
        CHECK (charge IN ('none', 'refused', 'possible', 'charged'));
     ALTER TABLE executions ADD COLUMN billable boolean NOT NULL DEFAULT true;
     ALTER TABLE executions ADD COLUMN cost_micros bigint;
     ALTER TABLE executions ADD COLUMN currency text;
     ALTER TABLE executions ADD COLUMN model text;
     UPDATE executions SET charge = CASE WHEN calling_at IS NULL THEN 'none'
                                         WHEN status = 'succeeded' THEN 'charged' ELSE 'possible' END;
     ALTER TABLE executions ADD CONSTRAINT executions_charge_needs_a_call
        CHECK (charge = 'none' OR (calling_at IS NOT NULL AND billable));
     CREATE INDEX executions_paid ON executions(calling_at) WHERE charge <> 'none';",
    // 2 → 3: dispatch by lanes and fairness keys for free provider slots (as SQLite's 5 → 6).
    "ALTER TABLE tasks ADD COLUMN group_key text;
     ALTER TABLE envelopes ADD COLUMN lane text NOT NULL DEFAULT 'fresh' CHECK (lane IN ('fresh', 'recovery'));
     ALTER TABLE envelopes ADD COLUMN fair_key text COLLATE \"C\" NOT NULL DEFAULT '';
     ALTER TABLE envelopes ADD COLUMN pass bigint CHECK (pass IS NULL OR status = 'pending');
     UPDATE envelopes SET lane = 'recovery' WHERE task_id IN (SELECT id FROM tasks WHERE status = 'waiting' OR attempts > 0);
     UPDATE envelopes e SET fair_key = 'set:' || t.set_id FROM tasks t WHERE t.id = e.task_id AND t.set_id IS NOT NULL;
     DROP INDEX envelopes_due;
     DROP INDEX envelopes_sent_by_provider;
     CREATE INDEX envelopes_waiting ON envelopes(due_at) WHERE status = 'pending' AND pass IS NULL AND due_at IS NOT NULL;
     CREATE INDEX envelopes_ready ON envelopes(provider, lane, pass, id) WHERE status = 'pending' AND pass IS NOT NULL;
     CREATE INDEX envelopes_ready_key ON envelopes(provider, lane, fair_key, pass) WHERE status = 'pending' AND pass IS NOT NULL;
     CREATE INDEX envelopes_in_flight ON envelopes(provider, lane) WHERE status = 'sent';
     CREATE TABLE providers (
        name text COLLATE \"C\" PRIMARY KEY, max_concurrency bigint NOT NULL CHECK (max_concurrency >= 1),
        reserve bigint NOT NULL DEFAULT 1 CHECK (reserve >= 0),
        fresh_weight bigint NOT NULL DEFAULT 4 CHECK (fresh_weight >= 1),
        recovery_weight bigint NOT NULL DEFAULT 1 CHECK (recovery_weight >= 1),
        fifo boolean NOT NULL DEFAULT false, configured boolean NOT NULL DEFAULT true,
        paused_until bigint, recovery_limit bigint,
        fresh_pass bigint NOT NULL DEFAULT 0, recovery_pass bigint NOT NULL DEFAULT 0);",
    // 3 → 4: held envelopes (as SQLite's 6 → 7; `store::held`). PostgreSQL has no lineage:
    // it is not copied as a file, so only the hold and its release exist here.
    "ALTER TABLE envelopes ADD COLUMN held_at bigint;
     ALTER TABLE envelopes ADD COLUMN held_reason text;
     CREATE INDEX envelopes_held ON envelopes(held_at) WHERE status = 'pending' AND held_at IS NOT NULL;",
    // 4 → 5: candidates per shot, the owner's choice, a set's timeline (as SQLite's 7 → 8).
    "ALTER TABLE tasks ADD COLUMN candidate bigint NOT NULL DEFAULT 0 CHECK (candidate >= 0);
     CREATE TABLE set_choices (
        set_id text COLLATE \"C\" NOT NULL REFERENCES sets(id), position bigint NOT NULL,
        artifact_id text COLLATE \"C\" NOT NULL REFERENCES artifacts(id), chosen_at bigint NOT NULL,
        PRIMARY KEY (set_id, position));
     CREATE TABLE set_events (
        id bigserial PRIMARY KEY, set_id text COLLATE \"C\" NOT NULL REFERENCES sets(id), at bigint NOT NULL,
        kind text NOT NULL, message text NOT NULL);
     CREATE INDEX set_events_by_set ON set_events(set_id, id);",
    // 5 → 6: the owner's record of a charge, budgets set from the page or CLI, and web
    // sessions that survive a restart (as SQLite's 8 → 9).
    "ALTER TABLE executions ADD COLUMN charge_recorded_at bigint;
     CREATE INDEX executions_recorded ON executions(calling_at) WHERE charge_recorded_at IS NOT NULL;
     CREATE TABLE budget_setting (
        id integer PRIMARY KEY CHECK (id = 1), limits text NOT NULL, set_at bigint NOT NULL);
     CREATE TABLE web_sessions (
        id_hash text COLLATE \"C\" PRIMARY KEY, csrf text NOT NULL, created_at bigint NOT NULL,
        last_used_at bigint NOT NULL);",
    // 6 → 7: deliveries and their items (as SQLite's 9 → 10; store::ops::deliveries).
    "CREATE TABLE deliveries (
         id               text COLLATE \"C\" PRIMARY KEY,
         set_id           text COLLATE \"C\" NOT NULL,
         profile          text NOT NULL,
         target           text NOT NULL,
         forced           boolean NOT NULL DEFAULT false,
         state            text NOT NULL DEFAULT 'queued'
                          CHECK (state IN ('queued', 'delivering', 'delivered', 'partly_delivered', 'failed', 'unknown')),
         runner           text,
         lease_until      bigint,
         created_at       bigint NOT NULL,
         updated_at       bigint NOT NULL
     );
     CREATE INDEX deliveries_by_set ON deliveries(set_id, id);
     CREATE INDEX deliveries_open ON deliveries(id) WHERE state IN ('queued', 'delivering');
     
     CREATE TABLE delivery_items (
         delivery_id      text COLLATE \"C\" NOT NULL REFERENCES deliveries(id),
         position         bigint NOT NULL,
         task_id          text COLLATE \"C\" NOT NULL,
         artifact_id      text COLLATE \"C\" NOT NULL,
         shot_role        text,
         file_name        text NOT NULL,
         state            text NOT NULL DEFAULT 'queued'
                          CHECK (state IN ('queued', 'writing', 'delivered', 'failed', 'unknown')),
         attempts         bigint NOT NULL DEFAULT 0,
         sha256           text,
         bytes            bigint,
         width            bigint,
         height           bigint,
         why              text,
         retry_safe       boolean,
         updated_at       bigint NOT NULL,
         PRIMARY KEY (delivery_id, position)
     );",
    // 7 → 8: provider slot rows, the capacity rule across nodes without a cluster-wide lock
    // (issue #28, `store::ops::slot_rows`); PostgreSQL only. The last statement sizes every
    // provider's rows, giving each envelope already `sent` one.
    concat!(include_str!("slots-v8.sql"), "\nUPDATE providers SET max_concurrency = max_concurrency;"),
    // 8 → 9: wake-up channels of this schema only (their names end in the sending table's
    // oid): nodes of another schema in the same database woke this schema's idle nodes, which
    // then ran SQL for nothing (the "idle under load" finding of issue #28). Only functions
    // change; a node of an older build is not running while it runs (`refuse_with_live_nodes`).
    include_str!("notify-v9.sql"),
    // 9 → 10: operation kinds (issue #35; as SQLite's 10 → 11).
    "ALTER TABLE tasks ADD COLUMN operation text NOT NULL DEFAULT 'generate';
     ALTER TABLE tasks ADD COLUMN source_kind text CHECK (source_kind IN ('artifact', 'upload'));
     ALTER TABLE tasks ADD COLUMN source_id text COLLATE \"C\";
     ALTER TABLE tasks ADD CONSTRAINT tasks_source_whole CHECK ((source_kind IS NULL) = (source_id IS NULL));
     CREATE INDEX tasks_by_source ON tasks(source_id) WHERE source_id IS NOT NULL;
     ALTER TABLE providers ADD COLUMN paused_reason text CHECK (paused_reason IN ('circuit', 'rate_limit'));
     CREATE TABLE notices (id bigserial PRIMARY KEY, kind text NOT NULL, at bigint NOT NULL, data text NOT NULL,
        dismissed_at bigint);",
    // 10 → 11: a delivery names the product a `shopify` target attaches to, and each item keeps
    // the id the destination gave it (issue #38).
    "ALTER TABLE deliveries ADD COLUMN shopify_product text;
     ALTER TABLE delivery_items ADD COLUMN remote_id text;",
    // 11 → 12: drafts (issue #36; as SQLite's 12 → 13).
    concat!(
        "ALTER TABLE sets ADD COLUMN draft_id text COLLATE \"C\"; ALTER TABLE sets ADD COLUMN draft_revision bigint;",
        include_str!("drafts-v12.sql")
    ),
    // 12 → 13: more shot roles (as SQLite's 13 → 14): the column's CHECK replaced (whatever
    // it was named: every CHECK of `tasks` that names `shot_role` — only that one — is dropped first).
    "DO $$
     DECLARE c record;
     BEGIN
       FOR c IN SELECT conname FROM pg_constraint
                 WHERE conrelid = 'tasks'::regclass AND contype = 'c'
                   AND pg_get_constraintdef(oid) LIKE '%shot_role%' LOOP
         EXECUTE format('ALTER TABLE tasks DROP CONSTRAINT %I', c.conname);
       END LOOP;
     END $$;
     ALTER TABLE tasks ADD CONSTRAINT tasks_shot_role_check CHECK (shot_role IN ('main', 'selling_point', 'scene', 'detail', 'size', 'main_white'));",
    // 13 → 14: a copy to edit until it is started (as SQLite's 14 → 15).
    "ALTER TABLE sets ADD COLUMN started_at bigint;
     UPDATE sets SET started_at = created_at;",
    // 14 → 15: a web session names the device it signed in (as SQLite's 15 → 16).
    "ALTER TABLE web_sessions ADD COLUMN device text;",
    // 15 → 16: settings the owner changes in the page, when a provider's pause began and what
    // failed (as SQLite's 16 → 17).
    "CREATE TABLE shop_settings (key text PRIMARY KEY, value text NOT NULL, set_at bigint NOT NULL);
     ALTER TABLE providers ADD COLUMN paused_at bigint, ADD COLUMN paused_why text;",
    // 16 → 17: listing images (as SQLite's 17 → 18).
    "ALTER TABLE sets ADD COLUMN overlays text;
     ALTER TABLE delivery_items ADD COLUMN profile text, ADD COLUMN overlay text;",
];

pub use crate::store::locks::LOCK_CLASS;

/// How to open a PostgreSQL store.
#[derive(Clone)]
#[allow(missing_docs)]
pub struct PgOptions {
    /// The connection URL (credentials included; never logged).
    pub url: String,
    /// This node's stable name (`[node] name`).
    pub node: String,
    /// Operation connections (threads).
    pub connections: usize,
    pub durability: Durability,
    /// A schema to create and use instead of the URL's default (the tests give every store
    /// its own). It also salts the node-lock key, so nodes of different schemas never meet.
    pub schema: Option<String>,
    /// Use the database's clock for every operation's `now` (production); off, operations
    /// use the `now` their caller passes (tests with a manual clock).
    pub db_clock: bool,
    /// LISTEN for other nodes' wake-ups on the node connection; `false` with `poll` set is
    /// the degraded poll-only mode.
    pub listen: bool,
    /// Poll-only mode: how often the engine looks for work without being told.
    pub poll: Option<Duration>,
    /// Watch a peer node's lock to recover its work the moment it dies (`watch.rs`).
    pub watch_peers: bool,
    /// The engine's lease (`[engine] lease_secs`): every network and statement timeout of
    /// this node's connections is derived from it ([`Timeouts`]).
    pub lease: Duration,
}

impl std::fmt::Debug for PgOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgOptions")
            .field("url", &crate::config::redact_url(&self.url))
            .field("node", &self.node)
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

/// What other nodes told this one (through LISTEN), for the engine to act on. Every signal
/// is a hint: the receiver re-reads the database.
#[derive(Default)]
pub struct Signals {
    /// An envelope became due (or a provider slot freed): the dispatcher should look.
    pub due: tokio::sync::Notify,
    /// An envelope was handed out somewhere: the reconciler should re-read its next deadline.
    pub lease: tokio::sync::Notify,
    /// Task status changes made by any node: `(task id, status)`.
    pub tasks: Mutex<Option<tokio::sync::broadcast::Sender<(String, String)>>>,
    /// Another node's lock freed (its process is gone): its leases are leftovers now.
    pub peer_gone: tokio::sync::Notify,
    /// Hints heard from other sessions of this schema, by channel (tests and diagnostics).
    pub heard: Heard,
    /// Steers the peer watcher (a node started: it picks its target again).
    pub(in crate::store::postgres) watch_ctl: Mutex<Option<Arc<watch::WatchCtl>>>,
    /// Server process ids of this store's own operation connections: hints sent by this node
    /// itself are not echoed back to it (its engine already woke itself).
    pub(in crate::store::postgres) own_pids: Mutex<std::collections::HashSet<i32>>,
}

/// How many hints a node's connection heard from other sessions, by channel (its own
/// operation connections' hints are not counted: they are not heard).
#[derive(Default, Debug)]
pub struct Heard {
    /// An envelope became due, or a provider slot freed (`tally_due_…`).
    pub due: AtomicU64,
    /// An envelope was handed out (`tally_lease_…`).
    pub lease: AtomicU64,
    /// A task's status changed (`tally_task_…`).
    pub task: AtomicU64,
    /// A node of this schema started.
    pub node: AtomicU64,
}

/// A handle to a PostgreSQL-backed store. Cheap to clone.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
    opts: PgOptions,
    config: postgres::Config,
    lock_key: i32,
    sender: Mutex<Option<mpsc::Sender<Job>>>,
    threads: Mutex<Vec<thread::JoinHandle<()>>>,
    shared: Arc<Shared>,
    node: Mutex<Option<node::Node>>,
    watcher: Mutex<Option<watch::Watcher>>,
    signals: Arc<Signals>,
    /// The database clock minus this machine's, measured at open (ms).
    clock_offset: i64,
}

/// Counters and settings every operation thread reads.
struct Shared {
    signals: Arc<Signals>,
    statements: AtomicU64,
    /// Round trips to the server of the operation connections (a batch of statements sent
    /// together is one).
    round_trips: AtomicU64,
    commits: AtomicU64,
    durability: Durability,
    db_clock: bool,
    closed: AtomicBool,
    timeouts: Timeouts,
    /// Why this node cannot reach the database now, while it cannot: its lock session's
    /// liveness check went unanswered, or taking the lock again failed to connect. Meanwhile
    /// every operation fails at once with [`StoreError::Unreachable`] (the API answers 503)
    /// instead of queueing behind connections that hang; cleared when the lock is held again.
    down: tokio::sync::watch::Sender<Option<String>>,
}

/// What kind of transaction an operation needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Write(Commit),
    /// A read-only REPEATABLE READ transaction: one snapshot for every statement in it.
    Read,
}

/// An operation queued for the operation threads.
type Job = Box<dyn FnOnce(&mut Conn) + Send>;

impl PgStore {
    /// Connect, create or migrate the schema, take this node's advisory lock (refusing to
    /// start when another live process holds it) and start the operation threads.
    ///
    /// Must not be called from a thread that runs a tokio runtime's tasks only if blocking
    /// is forbidden there: all PostgreSQL work happens on threads this store owns.
    pub fn open(opts: PgOptions) -> Result<PgStore, StoreError> {
        let mut config: postgres::Config =
            opts.url.parse().map_err(|e| StoreError::Fatal(format!("bad PostgreSQL URL: {e}")))?;
        let timeouts = Timeouts::from_lease(opts.lease);
        config.application_name(&format!("tally {}", opts.node));
        timeouts.configure(&mut config);
        if let Some(schema) = &opts.schema {
            if !schema.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(StoreError::Invalid(format!("bad schema name {schema}")));
            }
            config.options(&format!("-c search_path={schema}"));
        }
        let lock_key = node::lock_key(opts.schema.as_deref().unwrap_or(""), &opts.node);
        let signals = Arc::new(Signals::default());
        let shared = Arc::new(Shared {
            signals: signals.clone(),
            statements: AtomicU64::new(0),
            round_trips: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            durability: opts.durability,
            db_clock: opts.db_clock,
            closed: AtomicBool::new(false),
            timeouts,
            down: tokio::sync::watch::channel(None).0,
        });
        // The schema is created or migrated on a thread of its own: the client must never
        // run on a thread that drives a tokio runtime.
        let clock_offset = {
            let (config, schema) = (config.clone(), opts.schema.clone());
            thread::spawn(move || migrate(&config, schema.as_deref()))
                .join()
                .map_err(|_| StoreError::Fatal("the migration thread panicked".into()))??
        };
        if clock_offset.abs() > 2_000 {
            tracing::warn!(
                offset_ms = clock_offset,
                "this machine's clock differs from the database's by more than 2 s; tally uses the database's clock for leases and due times, but fix the clock (NTP)"
            );
        }
        let node = node::Node::start(&config, &opts, lock_key, shared.clone())?;
        let watcher = opts
            .watch_peers
            .then(|| watch::Watcher::start(config.clone(), opts.node.clone(), lock_key, signals.clone(), timeouts));
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::new();
        for i in 0..opts.connections.max(1) {
            let (rx, config, shared) = (rx.clone(), config.clone(), shared.clone());
            let h = thread::Builder::new()
                .name(format!("tally-pg-{i}"))
                .spawn(move || op_loop(rx, config, shared))
                .map_err(|e| StoreError::Fatal(format!("cannot start a PostgreSQL thread: {e}")))?;
            threads.push(h);
        }
        Ok(PgStore {
            inner: Arc::new(Inner {
                opts,
                config,
                lock_key,
                sender: Mutex::new(Some(tx)),
                threads: Mutex::new(threads),
                shared,
                node: Mutex::new(Some(node)),
                watcher: Mutex::new(watcher),
                signals,
                clock_offset,
            }),
        })
    }

    /// This node's name.
    pub fn node(&self) -> &str {
        &self.inner.opts.node
    }

    /// SQL statements sent so far by this store's operation connections (idle checks).
    pub fn statements(&self) -> u64 {
        self.inner.shared.statements.load(Ordering::Relaxed)
    }

    /// Transactions committed so far.
    pub fn commits(&self) -> u64 {
        self.inner.shared.commits.load(Ordering::Relaxed)
    }

    /// Round trips the operation connections made to the server so far (statements sent
    /// together in one batch, such as `BEGIN` with the transaction's first statement, count
    /// once; see `conn.rs`).
    pub fn round_trips(&self) -> u64 {
        self.inner.shared.round_trips.load(Ordering::Relaxed)
    }

    /// Wake-ups from other nodes.
    pub fn signals(&self) -> &Arc<Signals> {
        &self.inner.signals
    }

    /// This node's advisory-lock key (class [`LOCK_CLASS`] "taly"), for diagnostics: the
    /// `objid` of its row in `pg_locks`.
    pub fn node_lock_key(&self) -> i32 {
        self.inner.lock_key
    }

    /// Poll-only mode's interval (`None`: wake-ups come through LISTEN/NOTIFY).
    pub fn poll_interval(&self) -> Option<Duration> {
        self.inner.opts.poll
    }

    /// The database's clock minus this machine's, measured when the store opened (ms). The
    /// engine's clock on PostgreSQL is this machine's plus this offset, so its timers agree
    /// with the database's clock that decides leases and due times.
    pub fn clock_offset_ms(&self) -> i64 {
        self.inner.clock_offset
    }

    /// The state of this node's lock connection; it changes to `Lost` when the connection
    /// drops, and the owner must then stop its workers (self-fencing).
    pub fn node_state(&self) -> Option<tokio::sync::watch::Receiver<NodeState>> {
        lock(&self.inner.node).as_ref().map(|n| n.state())
    }

    /// The server process id of the node connection (tests terminate it to force a fence).
    pub fn node_backend_pid(&self) -> Option<i32> {
        lock(&self.inner.node).as_ref().map(|n| n.backend_pid())
    }

    /// Take the node lock again after it was lost (a new lock connection). Fails while
    /// another live process holds it, or while the database cannot be reached (then every
    /// operation fails at once until a later try succeeds: [`PgStore::unreachable`]).
    pub fn relock(&self) -> Result<(), StoreError> {
        let old = lock(&self.inner.node).take();
        if let Some(n) = old {
            n.stop();
        }
        let shared = &self.inner.shared;
        match node::Node::start(&self.inner.config, &self.inner.opts, self.inner.lock_key, shared.clone()) {
            Ok(n) => {
                *lock(&self.inner.node) = Some(n);
                if shared.down.send_replace(None).is_some() {
                    tracing::info!(node = %self.node(), "PostgreSQL can be reached again");
                }
                Ok(())
            }
            Err(e) => {
                if let StoreError::Postgres(pe) = &e
                    && pe.code().is_none()
                {
                    shared.down.send_replace(Some(format!("cannot connect to PostgreSQL: {pe}")));
                }
                Err(e)
            }
        }
    }

    /// Why this node cannot reach the database now (`None`: it can, as far as it knows).
    /// Meanwhile every operation fails at once with [`StoreError::Unreachable`].
    pub fn unreachable(&self) -> Option<String> {
        self.inner.shared.down.borrow().clone()
    }

    /// The timeouts of this node's connections (derived from the lease).
    pub fn timeouts(&self) -> Timeouts {
        self.inner.shared.timeouts
    }

    /// Run a write operation and return its result once committed (durably).
    pub(crate) async fn write<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnMut(&mut Tx<'_>) -> Result<R, StoreError> + Send + 'static,
    {
        self.run(Kind::Write(Commit::Durable), f).await
    }

    /// [`PgStore::write`] for bookkeeping that needs no flush of its own.
    pub(crate) async fn write_ordered<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnMut(&mut Tx<'_>) -> Result<R, StoreError> + Send + 'static,
    {
        self.run(Kind::Write(Commit::Ordered), f).await
    }

    /// Run a read in one snapshot.
    pub(crate) async fn read<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnMut(&mut Tx<'_>) -> Result<R, StoreError> + Send + 'static,
    {
        self.run(Kind::Read, f).await
    }

    /// Run a read and wait for it on the current thread (never on an async thread: this
    /// blocks it). Like [`PgStore::run`], it gives up with [`StoreError::Unreachable`] (within
    /// a tenth of a second) once the node finds the database unreachable, and a read nobody
    /// waits for any more is not run.
    pub(crate) fn read_blocking<R, F>(&self, mut f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnMut(&mut Tx<'_>) -> Result<R, StoreError> + Send + 'static,
    {
        let unreachable = || self.inner.shared.down.borrow().clone().map(StoreError::Unreachable);
        if let Some(e) = unreachable() {
            return Err(e);
        }
        let (tx, rx) = mpsc::channel();
        let gone = Arc::new(AtomicBool::new(false));
        let g = gone.clone();
        let job: Job = Box::new(move |conn: &mut Conn| {
            if !g.load(Ordering::Relaxed) {
                let _ = tx.send(conn.run(Kind::Read, &mut f));
            }
        });
        let sender = lock(&self.inner.sender).clone().ok_or(StoreError::Closed)?;
        sender.send(job).map_err(|_| StoreError::Closed)?;
        loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(r) => return r,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(e) = unreachable() {
                        gone.store(true, Ordering::Relaxed);
                        return Err(e);
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err(StoreError::Closed),
            }
        }
    }

    /// Run an operation and wait for its result, or until the node finds it cannot reach the
    /// database: then the caller gets [`StoreError::Unreachable`] at once, and the operation,
    /// if no thread has started it yet, is dropped unrun (one already running may still
    /// commit when the network heals: the caller must treat the error as "maybe").
    async fn run<R, F>(&self, kind: Kind, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnMut(&mut Tx<'_>) -> Result<R, StoreError> + Send + 'static,
    {
        let mut down = self.inner.shared.down.subscribe();
        let rx = self.send(kind, f)?;
        tokio::select! {
            r = rx => r.map_err(|_| StoreError::Closed)?,
            why = down.wait_for(Option::is_some) => Err(match why {
                Ok(why) => StoreError::Unreachable(why.clone().unwrap_or_default()),
                Err(_) => StoreError::Closed,
            }),
        }
    }

    fn send<R, F>(&self, kind: Kind, mut f: F) -> Result<oneshot::Receiver<Result<R, StoreError>>, StoreError>
    where
        R: Send + 'static,
        F: FnMut(&mut Tx<'_>) -> Result<R, StoreError> + Send + 'static,
    {
        if let Some(why) = self.inner.shared.down.borrow().clone() {
            return Err(StoreError::Unreachable(why));
        }
        let (tx, rx) = oneshot::channel();
        let queued = crate::stages::start();
        let job: Job = Box::new(move |conn: &mut Conn| {
            // Its caller stopped waiting (the node found the database unreachable): an
            // operation nobody waits for is not run late.
            if tx.is_closed() {
                return;
            }
            if kind != Kind::Read {
                crate::stages::record(crate::stages::Stage::StoreQueue, queued);
            }
            let _ = tx.send(conn.run(kind, &mut f));
        });
        let sender = lock(&self.inner.sender).clone().ok_or(StoreError::Closed)?;
        sender.send(job).map_err(|_| StoreError::Closed)?;
        Ok(rx)
    }

    /// Run a closure on an operation thread's client outside any transaction (tests and
    /// tools: e.g. `pg_terminate_backend`).
    pub async fn raw<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Client) -> Result<R, StoreError> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |conn: &mut Conn| {
            let r = conn.client().and_then(f);
            let _ = tx.send(r);
        });
        let sender = lock(&self.inner.sender).clone().ok_or(StoreError::Closed)?;
        sender.send(job).map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// Stop after the operations already queued: release the node lock and close every
    /// connection. Blocks until the threads are gone.
    pub fn close(&self) -> Result<(), StoreError> {
        self.inner.shared.closed.store(true, Ordering::Relaxed);
        lock(&self.inner.sender).take();
        for h in lock(&self.inner.threads).drain(..) {
            let _ = h.join();
        }
        if let Some(w) = lock(&self.inner.watcher).take() {
            w.stop();
        }
        if let Some(n) = lock(&self.inner.node).take() {
            n.stop();
        }
        Ok(())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        lock(&self.sender).take();
        if let Some(w) = lock(&self.watcher).take() {
            w.stop();
        }
        if let Some(n) = lock(&self.node).take() {
            n.stop();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Create the schema (and, for tests, the schema namespace) or migrate it, under a
/// transaction-level advisory lock so that nodes starting together do it once.
fn migrate(config: &postgres::Config, schema: Option<&str>) -> Result<i64, StoreError> {
    let mut client = config.connect(NoTls)?;
    let before = crate::clock::Clock::now(&crate::clock::SystemClock);
    let db: i64 = client.query_one("SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint", &[])?.get(0);
    let after = crate::clock::Clock::now(&crate::clock::SystemClock);
    let offset = db - (before + after) / 2;
    if let Some(s) = schema {
        client.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {s}"))?;
    }
    let mut t = client.transaction()?;
    t.execute("SELECT pg_advisory_xact_lock($1, 0)", &[&LOCK_CLASS])?;
    let installed: bool = t.query_one("SELECT to_regclass('tally_schema') IS NOT NULL", &[])?.get(0);
    if !installed {
        let tables: i64 =
            t.query_one("SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()", &[])?.get(0);
        if tables > 0 {
            return Err(StoreError::NotTally {
                path: "the PostgreSQL schema".into(),
                reason: "it holds another application's tables (no tally_schema table)".into(),
            });
        }
        t.batch_execute(SCHEMA)?;
        t.execute(
            "INSERT INTO tally_schema (version, installed_at) VALUES ($1, (extract(epoch from clock_timestamp()) * 1000)::bigint)",
            &[&PG_SCHEMA_VERSION],
        )?;
    } else {
        let version = schema_version(&mut t)?;
        if version > PG_SCHEMA_VERSION {
            return Err(StoreError::TooNew {
                path: "the PostgreSQL database".into(),
                found: version.into(),
                supported: PG_SCHEMA_VERSION.into(),
            });
        }
        if version < PG_SCHEMA_VERSION {
            refuse_with_live_nodes(&mut t, version)?;
        }
        for v in version..PG_SCHEMA_VERSION {
            let step = MIGRATIONS.get((v - 1) as usize).ok_or_else(|| StoreError::NotTally {
                path: "the PostgreSQL database".into(),
                reason: format!("no migration from schema version {v}"),
            })?;
            t.batch_execute(step)?;
            t.execute(
                "INSERT INTO tally_schema (version, installed_at) VALUES ($1, (extract(epoch from clock_timestamp()) * 1000)::bigint)",
                &[&(v + 1)],
            )?;
        }
    }
    t.commit()?;
    Ok(offset)
}

/// A migration runs only while no node of this database runs: a node of an older build would
/// go on writing rows without what the migration adds (a call recorded with no charge
/// evidence, say). Live nodes are those whose advisory lock is held now.
fn refuse_with_live_nodes(t: &mut postgres::Transaction<'_>, version: i32) -> Result<(), StoreError> {
    let live: Vec<String> = t
        .query(
            "SELECT n.name FROM nodes n WHERE n.lock_key::bigint IN (
                SELECT objid::bigint FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::bigint::oid
                  AND objsubid = 2 AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))
             ORDER BY n.name",
            &[&i64::from(LOCK_CLASS)],
        )?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if live.is_empty() {
        return Ok(());
    }
    Err(StoreError::Invalid(format!(
        "the database has tally schema version {version} and this build needs {PG_SCHEMA_VERSION}: it migrates the \
         schema only while no other node runs, and these do: {}. Stop every node, then start this one first",
        live.join(", ")
    )))
}

/// The schema version `tally_schema` records: an empty table (a hand-edited or half-restored
/// database) is an error that says so, not a panic on its NULL.
fn schema_version(t: &mut postgres::Transaction<'_>) -> Result<i32, StoreError> {
    let row = t.query_one("SELECT max(version) FROM tally_schema", &[])?;
    row.try_get::<_, Option<i32>>(0)?.ok_or_else(|| StoreError::NotTally {
        path: "the PostgreSQL database".into(),
        reason: "its tally_schema table records no version".into(),
    })
}

/// For `tally check`: the schema must be tally's, and not newer than this build.
fn migrate_check(t: &mut postgres::Transaction<'_>) -> Result<(), StoreError> {
    let installed: bool = t.query_one("SELECT to_regclass('tally_schema') IS NOT NULL", &[])?.get(0);
    if !installed {
        return Err(StoreError::NotTally {
            path: "the PostgreSQL schema".into(),
            reason: "it has no tally_schema table".into(),
        });
    }
    let version = schema_version(t)?;
    if version > PG_SCHEMA_VERSION {
        return Err(StoreError::TooNew {
            path: "the PostgreSQL database".into(),
            found: version.into(),
            supported: PG_SCHEMA_VERSION.into(),
        });
    }
    Ok(())
}
