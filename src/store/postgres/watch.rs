//! The peer watcher: notices at once when another node's process is gone, so that its work
//! is recovered in well under a second instead of when its leases run out.
//!
//! Each node watches one other live node — the next one by name, in a ring, so that every
//! live node is watched by one peer — by blocking in `pg_advisory_lock` on that node's lock key
//! on a connection of its own. The call returns the moment the watched node's lock session
//! ends (process killed, connection terminated): the watcher releases the lock at once (a
//! restarting node waits for its own lock for a moment, see `node::LOCK_WAIT`), raises
//! [`Signals::peer_gone`](super::Signals) so the engine runs its reconciler, and picks its
//! next target. A blocked lock wait executes no further statement. When a
//! node starts (`tally_node` notification) the wait is cancelled and the target re-chosen.
//!
//! Correctness never depends on the watcher: recovery re-checks its evidence under row
//! locks, and leases expire anyway. The watcher only makes recovery prompt.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::Duration;

use postgres::{CancelToken, Client, NoTls};

use super::{LOCK_CLASS, Signals, StoreError, Timeouts, timeouts};

/// A running watcher.
pub(super) struct Watcher {
    ctl: Arc<WatchCtl>,
    thread: Mutex<Option<thread::JoinHandle<()>>>,
}

/// What others use to steer a running watcher.
pub(super) struct WatchCtl {
    stop: AtomicBool,
    /// Wakes the watcher when it has no target (a node started), or ends it (dropped).
    poke: Mutex<Option<mpsc::Sender<()>>>,
    /// Cancels the watcher's blocked lock wait (re-target, or stop).
    cancel: Mutex<Option<CancelToken>>,
}

impl WatchCtl {
    /// A node started somewhere: choose the target again.
    pub(super) fn retarget(&self) {
        if let Some(tx) = super::lock(&self.poke).as_ref() {
            let _ = tx.send(());
        }
        cancel_wait(&self.cancel);
    }
}

impl Watcher {
    pub(super) fn start(
        config: postgres::Config,
        me: String,
        my_key: i32,
        signals: Arc<Signals>,
        t: Timeouts,
    ) -> Watcher {
        let (tx, rx) = mpsc::channel();
        let ctl =
            Arc::new(WatchCtl { stop: AtomicBool::new(false), poke: Mutex::new(Some(tx)), cancel: Mutex::new(None) });
        *super::lock(&signals.watch_ctl) = Some(ctl.clone());
        let ctl2 = ctl.clone();
        let thread = thread::Builder::new()
            .name("tally-pg-watch".into())
            .spawn(move || run(config, me, my_key, signals, ctl2, rx, t))
            .ok();
        Watcher { ctl, thread: Mutex::new(thread) }
    }

    /// Stop the watcher and wait for its thread. A cancel reaches only a query that is
    /// running: one sent while the watcher is between statements is lost, and the watcher
    /// may then block in its next `pg_advisory_lock` (on a live peer: for ever, which hung a
    /// `tally prune` on close once). So the cancel is repeated until the thread has ended.
    pub(super) fn stop(&self) {
        self.ctl.stop.store(true, Ordering::Relaxed);
        super::lock(&self.ctl.poke).take();
        let Some(t) = super::lock(&self.thread).take() else { return };
        while !t.is_finished() {
            cancel_wait(&self.ctl.cancel);
            thread::sleep(Duration::from_millis(20));
        }
        let _ = t.join();
    }
}

fn cancel_wait(cancel: &Mutex<Option<CancelToken>>) {
    let token = super::lock(cancel).clone();
    if let Some(t) = token {
        // A cancel request is a connection of its own; it does nothing when no query runs.
        let _ = thread::spawn(move || t.cancel_query(NoTls)).join();
    }
}

fn run(
    config: postgres::Config,
    me: String,
    my_key: i32,
    signals: Arc<Signals>,
    ctl: Arc<WatchCtl>,
    poke: mpsc::Receiver<()>,
    t: Timeouts,
) {
    let (stop, cancel) = (&ctl.stop, &ctl.cancel);
    let mut client: Option<Client> = None;
    while !stop.load(Ordering::Relaxed) {
        if client.as_ref().is_none_or(|c| c.is_closed()) {
            match config.connect(NoTls) {
                Ok(mut c) => {
                    // A lock this session wins for a node that then vanished must be freed by
                    // the server within the lease, or the peer it watched could not restart.
                    timeouts::apply_server_tcp(&mut c, &t);
                    *super::lock(cancel) = Some(c.cancel_token());
                    client = Some(c);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the peer watcher cannot connect; peers are recovered by lease expiry meanwhile");
                    if poke
                        .recv_timeout(Duration::from_secs(5))
                        .is_err_and(|e| e == mpsc::RecvTimeoutError::Disconnected)
                    {
                        return;
                    }
                    continue;
                }
            }
        }
        let Some(c) = client.as_mut() else { continue };
        let target = match next_target(c, &me, my_key) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "the peer watcher cannot read the live nodes");
                client = None;
                continue;
            }
        };
        let Some((name, key)) = target else {
            // Alone: wait until a node starts (or the store closes).
            while poke.try_recv().is_ok() {}
            if poke.recv().is_err() {
                return;
            }
            continue;
        };
        while poke.try_recv().is_ok() {}
        // An error is a cancel (re-target or stop) or a failed connection: choose again.
        if c.execute("SELECT pg_advisory_lock($1, $2)", &[&LOCK_CLASS, &key]).is_ok() {
            let _ = c.execute("SELECT pg_advisory_unlock($1, $2)", &[&LOCK_CLASS, &key]);
            if stop.load(Ordering::Relaxed) {
                return;
            }
            tracing::info!(node = %name, "a peer node's lock was released: recovering its work now");
            signals.peer_gone.notify_one();
        }
    }
}

/// The live node after `me` in name order (wrapping), or `None` when no other node is live.
fn next_target(c: &mut Client, me: &str, my_key: i32) -> Result<Option<(String, i32)>, StoreError> {
    let rows = c.query(
        "SELECT n.name, n.lock_key FROM nodes n
         WHERE n.lock_key <> $2 AND n.lock_key::bigint IN (
             SELECT objid::bigint FROM pg_locks
             WHERE locktype = 'advisory' AND classid = $3::bigint::oid AND objsubid = 2 AND granted
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))
         ORDER BY (n.name <= $1), n.name",
        &[&me, &my_key, &i64::from(LOCK_CLASS)],
    )?;
    Ok(rows.first().map(|r| (r.get(0), r.get(1))))
}
