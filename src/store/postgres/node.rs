//! The node connection: one PostgreSQL session per running node that holds the node's
//! session advisory lock and listens for other nodes' wake-ups.
//!
//! **Liveness.** The lock (class [`LOCK_CLASS`], key [`lock_key`] of the node name) is held for
//! as long as this session lives, so "the lock is free" proves that no process of that node
//! is connected: its leases can be recovered at once (what the data-directory lock proves on
//! SQLite). The session runs no statement after taking the lock and starting to listen — a
//! session busy in a statement would keep its lock after its client died until the statement
//! ends — it waits for notifications, and after every quiet `probe_every` sends an empty query
//! that must answer within `probe_timeout` ([`Timeouts`], derived from the lease). The session
//! also asks the server for short TCP keepalives and `tcp_user_timeout`, so that the server
//! ends the session of a node that vanished (and frees its lock) within about a third of a
//! lease instead of the server's two-hour default.
//!
//! **Self-fencing.** When the session ends (the server terminated it, the network dropped,
//! the server restarted) or its liveness check goes unanswered (packets dropped without a
//! reset; a proxy between node and server whose far side is dead), the state changes to
//! [`NodeState::Lost`]: from then on another node may recover this node's work, so the owner
//! must stop starting work of its own before anything else (`engine::nodes`). An unanswered
//! check also marks the store unreachable: its operations then fail at once.
//!
//! Wake-ups (`tally_due`, `tally_lease`, `tally_task`, `tally_node`) are hints, never data:
//! each only makes the engine re-read the database. A lost session is also a lost listener;
//! whoever restarts the node re-reads once.
//!
//! **Channels are per schema.** PostgreSQL's channels belong to the database, and several
//! schemas of one database may each hold a tally cluster (the tests and the benchmark do;
//! so may a shared server). So every channel name ends in the oid of the table whose trigger
//! sends it (`tally_due_<envelopes oid>`, `tally_lease_<envelopes oid>`,
//! `tally_task_<tasks oid>`, and the node's own `tally_node_<envelopes oid>`), read when the
//! node starts listening ([`Channels`]): a node hears its own schema's hints only. Before
//! schema version 9 the names were bare, and idle nodes of one schema ran a dispatch and a
//! deadline read for every wake-up of every other schema's busy nodes (issue #28, "idle under
//! load").

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use postgres::fallible_iterator::FallibleIterator;
use postgres::{Client, NoTls};
use tokio::sync::watch;

use super::{LOCK_CLASS, PgOptions, Shared, Signals, StoreError, Timeouts, timeouts};

/// The state of a node's lock connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeState {
    /// The lock is held: this process is the node.
    Held,
    /// The lock connection ended (why): stop the workers; another node may now recover
    /// this node's work.
    Lost(String),
    /// The store closed and released the lock.
    Released,
}

/// A stable 31-bit key for a node name (FNV-1a), salted with the schema so that nodes of
/// different schemas in one database (the tests) never share a lock.
pub(super) fn lock_key(schema: &str, name: &str) -> i32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in schema.bytes().chain([b'/']).chain(name.bytes()) {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    (h & 0x7fff_ffff) as i32
}

/// A running node connection.
pub(super) struct Node {
    stop: Arc<AtomicBool>,
    state: watch::Receiver<NodeState>,
    pid: Arc<AtomicI32>,
    config: postgres::Config,
    key: i32,
    /// How long a stop waits to reach the server (to wake the waiting thread).
    connect_wait: Duration,
    thread: Option<thread::JoinHandle<()>>,
}

/// How long a node start waits for its own lock when another session holds it: a peer may
/// hold it for an instant, and the session of a process that just died may take a moment
/// to end on the server.
const LOCK_WAIT: Duration = Duration::from_secs(3);

impl Node {
    /// Connect, take the lock, record the node, start listening. Fails with a clear message
    /// when another live process holds the lock.
    pub(super) fn start(
        config: &postgres::Config,
        opts: &PgOptions,
        key: i32,
        shared: Arc<Shared>,
    ) -> Result<Node, StoreError> {
        let (ready_tx, ready_rx) = mpsc::channel::<Result<i32, StoreError>>();
        let (state_tx, state) = watch::channel(NodeState::Held);
        let stop = Arc::new(AtomicBool::new(false));
        let pid = Arc::new(AtomicI32::new(0));
        let (cfg, name, listen, stop2, pid2) =
            (config.clone(), opts.node.clone(), opts.listen, stop.clone(), pid.clone());
        let connect_wait = shared.timeouts.connect;
        let thread = thread::Builder::new()
            .name("tally-pg-node".into())
            .spawn(move || {
                let t = shared.timeouts;
                let (mut client, channels) = match take_lock(&cfg, &name, key, listen, &t) {
                    Ok((c, backend, channels)) => {
                        pid2.store(backend, Ordering::Relaxed);
                        let _ = ready_tx.send(Ok(backend));
                        (c, channels)
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let ended = wait(&mut client, &channels, &stop2, &shared.signals, &t);
                if stop2.load(Ordering::Relaxed) && !matches!(ended, Ended::Unreachable(_)) {
                    // A clean stop: give the lock back before the session ends.
                    let _ = client.execute("SELECT pg_advisory_unlock($1, $2)", &[&LOCK_CLASS, &key]);
                    let _ = state_tx.send(NodeState::Released);
                    return;
                }
                let why = match ended {
                    Ended::Unreachable(why) => {
                        // Before the state changes: the guard's first look must see it.
                        shared.down.send_replace(Some(why.clone()));
                        why
                    }
                    Ended::Failed(why) => why,
                };
                tracing::error!(reason = %why, "lost the node's lock connection to PostgreSQL");
                let _ = state_tx.send(NodeState::Lost(why));
                // Dropping the client closes the socket; a server that cannot be reached
                // ends the session by its own keepalive settings (set in `take_lock`).
            })
            .map_err(|e| StoreError::Fatal(format!("cannot start the node thread: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok(_)) => Ok(Node { stop, state, pid, config: config.clone(), key, connect_wait, thread: Some(thread) }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(StoreError::Fatal("the node thread ended before taking the lock".into()))
            }
        }
    }

    pub(super) fn state(&self) -> watch::Receiver<NodeState> {
        self.state.clone()
    }

    pub(super) fn backend_pid(&self) -> i32 {
        self.pid.load(Ordering::Relaxed)
    }

    /// Release the lock and end the session: wake the waiting thread with a notification on
    /// its private channel (from a short-lived connection), then join it. A thread that
    /// already ended (the session was lost) is only joined. If the server cannot be reached
    /// within the connect timeout, the thread is left to end at its next liveness check.
    pub(super) fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let Some(t) = self.thread.take() else { return };
        if t.is_finished() {
            let _ = t.join();
            return;
        }
        let (config, key) = (self.config.clone(), self.key);
        let (tx, rx) = mpsc::channel();
        let _ = thread::Builder::new().name("tally-pg-node-stop".into()).spawn(move || {
            let woke = (|| -> Result<(), StoreError> {
                let mut c = config.connect(NoTls)?;
                c.batch_execute(&format!("NOTIFY tally_ctl_{key}"))?;
                Ok(())
            })();
            let _ = tx.send(woke.is_ok());
        });
        let wait = self.connect_wait * 2;
        if matches!(rx.recv_timeout(wait), Ok(true)) || t.is_finished() {
            let _ = t.join();
        }
    }
}

/// Connect and take the lock (waiting up to [`LOCK_WAIT`] while someone else holds it), record
/// the node's row, and LISTEN on this schema's channels. Returns the client, its backend pid
/// and the channels.
fn take_lock(
    config: &postgres::Config,
    name: &str,
    key: i32,
    listen: bool,
    t: &Timeouts,
) -> Result<(Client, i32, Channels), StoreError> {
    let mut client = config.connect(NoTls)?;
    // The server must notice when this node vanishes, and free its lock, within the lease.
    timeouts::apply_server_tcp(&mut client, t);
    let start = std::time::Instant::now();
    loop {
        let got: bool = client.query_one("SELECT pg_try_advisory_lock($1, $2)", &[&LOCK_CLASS, &key])?.get(0);
        if got {
            break;
        }
        if start.elapsed() >= LOCK_WAIT {
            let holder: Option<i32> = client
                .query_opt(
                    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::bigint::oid
                       AND objid = $2::bigint::oid AND objsubid = 2 AND granted LIMIT 1",
                    &[&i64::from(LOCK_CLASS), &i64::from(key)],
                )?
                .map(|r| r.get(0));
            let who = holder.map(|p| format!(" (its database session is server process {p})")).unwrap_or_default();
            return Err(StoreError::Invalid(format!(
                "another tally serve with node name `{name}` is already connected to this database{who}; \
                 stop it first, or give this machine its own [node] name"
            )));
        }
        thread::sleep(Duration::from_millis(100));
    }
    let host = crate::config::default_node_name();
    let pid = std::process::id() as i32;
    let row = client.query_opt(
        "INSERT INTO nodes (name, lock_key, host, pid, started_at)
         VALUES ($1, $2, $3, $4, (extract(epoch from clock_timestamp()) * 1000)::bigint)
         ON CONFLICT (name) DO UPDATE SET host = excluded.host, pid = excluded.pid, started_at = excluded.started_at
         WHERE nodes.lock_key = excluded.lock_key
         RETURNING name",
        &[&name, &key, &host, &pid],
    );
    match row {
        Ok(Some(_)) => {}
        Ok(None) => {
            return Err(StoreError::Fatal(format!(
                "the nodes row of `{name}` has another lock key; it was written by an incompatible tally"
            )));
        }
        Err(e) if e.code() == Some(&postgres::error::SqlState::UNIQUE_VIOLATION) => {
            return Err(StoreError::Invalid(format!(
                "node name `{name}` hashes to the same lock key as another node's name; choose another [node] name"
            )));
        }
        Err(e) => return Err(e.into()),
    }
    let ch = Channels::read(&mut client)?;
    let mut listen_sql = format!("LISTEN tally_ctl_{key};");
    if listen {
        listen_sql.push_str(&format!(" LISTEN {}; LISTEN {}; LISTEN {};", ch.due, ch.lease, ch.task));
    }
    // Peers' watchers re-choose whom to watch when a node starts.
    listen_sql.push_str(&format!(" LISTEN {0}; NOTIFY {0};", ch.node));
    client.batch_execute(&listen_sql)?;
    let backend: i32 = client.query_one("SELECT pg_backend_pid()", &[])?.get(0);
    Ok((client, backend, ch))
}

/// This schema's channel names (see the module docs): each ends in the oid of the table
/// whose trigger sends it, as `schema-pg.sql`'s notify functions name them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Channels {
    pub due: String,
    pub lease: String,
    pub task: String,
    pub node: String,
}

impl Channels {
    /// Read the tables' oids in the session's schema.
    fn read(client: &mut Client) -> Result<Channels, StoreError> {
        let row = client.query_one("SELECT 'envelopes'::regclass::oid::bigint, 'tasks'::regclass::oid::bigint", &[])?;
        let (envelopes, tasks): (i64, i64) = (row.get(0), row.get(1));
        Ok(Channels {
            due: format!("tally_due_{envelopes}"),
            lease: format!("tally_lease_{envelopes}"),
            task: format!("tally_task_{tasks}"),
            node: format!("tally_node_{envelopes}"),
        })
    }
}

/// Why the lock session's wait ended.
enum Ended {
    /// The session ended or failed (or a stop was asked for).
    Failed(String),
    /// The liveness check went unanswered: the database cannot be reached.
    Unreachable(String),
}

/// Wait for notifications until the session ends, its liveness check goes unanswered, or a
/// stop is asked for; returns why the wait ended.
fn wait(client: &mut Client, ch: &Channels, stop: &AtomicBool, signals: &Signals, t: &Timeouts) -> Ended {
    let heard = |c: &AtomicU64| {
        c.fetch_add(1, Ordering::Relaxed);
    };
    loop {
        let next = client.notifications().timeout_iter(t.probe_every).next();
        match next {
            Ok(None) => {
                if stop.load(Ordering::Relaxed) {
                    return Ended::Failed("stopped".into());
                }
                if client.is_closed() {
                    return Ended::Failed("the server closed the connection".into());
                }
                // Quiet for `probe_every`: is the server still there?
                if let Err(e) = client.is_valid(t.probe_timeout) {
                    if client.is_closed() || e.code().is_some() {
                        return Ended::Failed(format!("the connection failed: {e}"));
                    }
                    return Ended::Unreachable(format!(
                        "PostgreSQL did not answer the node's liveness check within {} ms ({e})",
                        t.probe_timeout.as_millis()
                    ));
                }
            }
            Ok(Some(n)) => {
                if stop.load(Ordering::Relaxed) {
                    return Ended::Failed("stopped".into());
                }
                if super::lock(&signals.own_pids).contains(&n.process_id()) {
                    continue; // this node's own hint: its engine already woke itself
                }
                tracing::debug!(channel = n.channel(), from = n.process_id(), "a hint from another session");
                let channel = n.channel();
                if channel == ch.node {
                    heard(&signals.heard.node);
                    let ctl = super::lock(&signals.watch_ctl).clone();
                    if let Some(ctl) = ctl {
                        ctl.retarget();
                    }
                } else if channel == ch.due {
                    heard(&signals.heard.due);
                    signals.due.notify_one();
                } else if channel == ch.lease {
                    heard(&signals.heard.lease);
                    signals.lease.notify_one();
                } else if channel == ch.task {
                    heard(&signals.heard.task);
                    if let Some((task, status)) = n.payload().rsplit_once(':')
                        && let Some(tx) = super::lock(&signals.tasks).as_ref()
                    {
                        let _ = tx.send((task.to_string(), status.to_string()));
                    }
                }
            }
            Err(e) => return Ended::Failed(format!("the connection failed: {e}")),
        }
    }
}
