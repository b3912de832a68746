//! The operation threads of the PostgreSQL store: each owns one synchronous client and its
//! statement cache, runs one operation per transaction ([`Tx`]), retries deadlocks and
//! serialization failures, reconnects after a lost connection, and reports a connection lost
//! during `COMMIT` as an ambiguous commit (rule A in `store::postgres`).
//!
//! **Round trips.** A transaction is opened lazily ([`Begin`]): its `START TRANSACTION` (and a
//! relaxed commit's `SET LOCAL synchronous_commit = off`) goes out with the operation's first
//! statement when that is the database clock's read — every `op_at` operation with `db_clock`
//! — as one simple-query batch, so opening costs no round trip of its own; otherwise on its
//! own just before the first statement. An operation that sends nothing commits nothing.
//! `statements` counts SQL statements, `round_trips` what reached the server separately
//! (statement preparation included).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, mpsc};

use postgres::error::SqlState;
use postgres::types::ToSql;
use postgres::{Client, NoTls, Row, Statement};

use super::{Job, Kind, Shared, lock};
use crate::config::Durability;
use crate::domain::Millis;
use crate::stages::{self, Stage};
use crate::store::tx::{self, Dialect, Param, Value};
use crate::store::{Commit, StoreError};

/// An operation thread: take jobs until the store closes.
pub(super) fn op_loop(rx: Arc<Mutex<mpsc::Receiver<Job>>>, config: postgres::Config, shared: Arc<Shared>) {
    let mut conn = Conn { config, client: None, cache: HashMap::new(), shared };
    loop {
        let job = match lock(&rx).recv() {
            Ok(job) => job,
            Err(_) => break,
        };
        job(&mut conn);
    }
}

/// One operation connection with its statement cache (the `postgres` crate has none).
pub(crate) struct Conn {
    config: postgres::Config,
    client: Option<Client>,
    cache: HashMap<&'static str, Statement>,
    shared: Arc<Shared>,
}

/// How many times a deadlock or serialization failure is retried.
const RETRIES: usize = 8;

fn retryable(e: &postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(&SqlState::T_R_DEADLOCK_DETECTED)
            | Some(&SqlState::T_R_SERIALIZATION_FAILURE)
            | Some(&SqlState::UNIQUE_VIOLATION)
    )
}

impl Conn {
    /// The connected client, reconnecting (with an empty statement cache) if the last
    /// connection was lost.
    pub(super) fn client(&mut self) -> Result<&mut Client, StoreError> {
        if self.client.as_ref().is_some_and(|c| c.is_closed()) {
            self.client = None;
        }
        if self.client.is_none() {
            self.cache.clear();
            let mut c = self.config.connect(NoTls)?;
            // Short transactions only: a stuck one must not pin the vacuum horizon, nor hold
            // row locks past the lease; no wait for a row lock outlasts a third of a lease
            // (`timeouts`).
            let t = self.shared.timeouts;
            c.batch_execute(&t.statement_sql())?;
            super::timeouts::apply_server_tcp(&mut c, &t);
            let pid: i32 = c.query_one("SELECT pg_backend_pid()", &[])?.get(0);
            lock(&self.shared.signals.own_pids).insert(pid);
            self.client = Some(c);
        }
        self.client.as_mut().ok_or(StoreError::Closed)
    }

    pub(super) fn run<R>(
        &mut self,
        kind: Kind,
        f: &mut dyn FnMut(&mut Tx<'_>) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let relaxed = kind == Kind::Write(Commit::Ordered) || self.shared.durability == Durability::Normal;
        let begin = match kind {
            Kind::Read => Begin { sql: "START TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY", statements: 1 },
            Kind::Write(_) if relaxed => {
                Begin { sql: "START TRANSACTION; SET LOCAL synchronous_commit = off", statements: 2 }
            }
            Kind::Write(_) => Begin { sql: "START TRANSACTION", statements: 1 },
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            self.client()?;
            let Conn { client: slot, cache, shared, .. } = self;
            let client = slot.as_mut().ok_or(StoreError::Closed)?;
            let mut tx = Tx { client, begin: Some(begin), cache, shared };
            let run = stages::start();
            // A panic inside an operation must not leave the session inside its transaction
            // for the next job: the connection is dropped (the server rolls back).
            let result = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut tx))) {
                Ok(r) => r,
                Err(panic) => {
                    *slot = None;
                    std::panic::resume_unwind(panic);
                }
            };
            if kind != Kind::Read {
                stages::record(Stage::StoreRun, run);
            }
            let open = tx.begin.is_none();
            let client = tx.client;
            match result {
                // Nothing was sent: there is no transaction to end.
                Ok(r) if !open => {
                    shared.commits.fetch_add(1, Ordering::Relaxed);
                    return Ok(r);
                }
                Ok(r) => {
                    shared.statements.fetch_add(1, Ordering::Relaxed);
                    shared.round_trips.fetch_add(1, Ordering::Relaxed);
                    let commit = stages::start();
                    let committed = client.batch_execute("COMMIT");
                    if kind != Kind::Read {
                        stages::record(Stage::Commit, commit);
                    }
                    return match committed {
                        Ok(()) => {
                            shared.commits.fetch_add(1, Ordering::Relaxed);
                            Ok(r)
                        }
                        Err(e) if retryable(&e) && attempt < RETRIES => continue,
                        Err(e) if e.is_closed() || e.code().is_none() => Err(StoreError::Commit {
                            message: format!(
                                "the connection was lost during COMMIT; it may or may not have committed: {e}"
                            ),
                            code: None,
                        }),
                        Err(e) => Err(StoreError::Commit { message: e.to_string(), code: None }),
                    };
                }
                Err(e) => {
                    if open {
                        // A lost connection cannot roll back; the server does, and the next
                        // job reconnects (`client`).
                        let _ = client.batch_execute("ROLLBACK");
                        shared.round_trips.fetch_add(1, Ordering::Relaxed);
                    }
                    match e {
                        StoreError::Postgres(e) if retryable(&e) && attempt < RETRIES => continue,
                        e => return Err(e),
                    }
                }
            }
        }
    }
}

/// The statements that open an operation's transaction: sent with its first statement when
/// that is the database clock's read (one round trip for both), else on their own just
/// before it. (The client's own `transaction()` would send `BEGIN` at once, in a round trip
/// of its own.)
#[derive(Debug, Clone, Copy)]
struct Begin {
    sql: &'static str,
    /// How many statements `sql` holds (for the statement count).
    statements: u64,
}

/// One transaction of an operation, with cached statements and counting. The transaction is
/// opened lazily ([`Begin`]); **invariant**: every statement of the operation runs after it is
/// opened ([`Tx::open`] first in each method), and `run` ends it with `COMMIT` or `ROLLBACK`
/// if it was opened.
pub(crate) struct Tx<'a> {
    client: &'a mut Client,
    begin: Option<Begin>,
    cache: &'a mut HashMap<&'static str, Statement>,
    shared: &'a Shared,
}

/// Parameters of a statement.
pub(crate) type Params<'p> = [&'p (dyn ToSql + Sync)];

/// The database clock, in milliseconds since the epoch.
const DB_MS: &str = "SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint";

impl Tx<'_> {
    /// Send the transaction's opening statements if they are still to be sent.
    fn open(&mut self) -> Result<(), StoreError> {
        if let Some(b) = self.begin.take() {
            self.shared.statements.fetch_add(b.statements, Ordering::Relaxed);
            self.shared.round_trips.fetch_add(1, Ordering::Relaxed);
            self.client.batch_execute(b.sql)?;
        }
        Ok(())
    }

    fn stmt(&mut self, sql: &'static str) -> Result<Statement, StoreError> {
        self.open()?;
        if let Some(s) = self.cache.get(sql) {
            return Ok(s.clone());
        }
        // Operations shared with SQLite write `?N`; PostgreSQL's own SQL writes `$N` already.
        self.shared.round_trips.fetch_add(1, Ordering::Relaxed);
        let s = self.client.prepare(&crate::store::tx::dollar_placeholders(sql))?;
        self.cache.insert(sql, s.clone());
        Ok(s)
    }

    /// Count one statement in a round trip of its own.
    fn count(&self) {
        self.shared.statements.fetch_add(1, Ordering::Relaxed);
        self.shared.round_trips.fetch_add(1, Ordering::Relaxed);
    }

    /// Execute a statement; the number of rows it changed.
    pub(crate) fn exec(&mut self, sql: &'static str, p: &Params<'_>) -> Result<u64, StoreError> {
        let _t = stages::span(Stage::Sql);
        let s = self.stmt(sql)?;
        self.count();
        Ok(self.client.execute(&s, p)?)
    }

    /// Every row of a query.
    pub(crate) fn rows(&mut self, sql: &'static str, p: &Params<'_>) -> Result<Vec<Row>, StoreError> {
        let _t = stages::span(Stage::Sql);
        let s = self.stmt(sql)?;
        self.count();
        Ok(self.client.query(&s, p)?)
    }

    /// At most one row.
    pub(crate) fn opt(&mut self, sql: &'static str, p: &Params<'_>) -> Result<Option<Row>, StoreError> {
        let _t = stages::span(Stage::Sql);
        let s = self.stmt(sql)?;
        self.count();
        Ok(self.client.query_opt(&s, p)?)
    }

    /// Exactly one row.
    pub(crate) fn one(&mut self, sql: &'static str, p: &Params<'_>) -> Result<Row, StoreError> {
        let _t = stages::span(Stage::Sql);
        let s = self.stmt(sql)?;
        self.count();
        Ok(self.client.query_one(&s, p)?)
    }

    /// The database's clock, in milliseconds since the epoch. As an operation's first
    /// statement (where `op_at` reads it) it travels with the transaction's opening
    /// statements, in one simple-query batch: one round trip instead of two.
    pub(crate) fn db_ms(&mut self) -> Result<Millis, StoreError> {
        let Some(b) = self.begin.take() else {
            return Ok(self.one(DB_MS, &[])?.get(0));
        };
        let _t = stages::span(Stage::Sql);
        self.shared.statements.fetch_add(b.statements + 1, Ordering::Relaxed);
        self.shared.round_trips.fetch_add(1, Ordering::Relaxed);
        let batch = format!("{}; {DB_MS}", b.sql);
        for m in self.client.simple_query(&batch)? {
            if let postgres::SimpleQueryMessage::Row(r) = m {
                let text = r.get(0).unwrap_or("");
                return text
                    .parse::<Millis>()
                    .map_err(|_| StoreError::Invalid(format!("the database clock read {text:?}, not milliseconds")));
            }
        }
        Err(StoreError::Invalid("the database clock read returned no row".into()))
    }

    /// The `now` an operation uses: the database's clock with `db_clock`, else the caller's.
    pub(crate) fn now(&mut self, given: Millis) -> Result<Millis, StoreError> {
        if self.shared.db_clock { self.db_ms() } else { Ok(given) }
    }
}

/// The backend-neutral transaction (`store::tx`): the same statements, cache and counting,
/// with owned rows.
impl crate::store::tx::Tx for Tx<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn exec(&mut self, sql: &'static str, p: &[&dyn Param]) -> Result<u64, StoreError> {
        let p: Vec<_> = p.iter().map(|x| x.pg()).collect();
        Tx::exec(self, sql, &p)
    }

    fn rows(&mut self, sql: &'static str, p: &[&dyn Param]) -> Result<Vec<tx::Row>, StoreError> {
        let p: Vec<_> = p.iter().map(|x| x.pg()).collect();
        Tx::rows(self, sql, &p)?.iter().map(owned).collect()
    }

    fn opt(&mut self, sql: &'static str, p: &[&dyn Param]) -> Result<Option<tx::Row>, StoreError> {
        let p: Vec<_> = p.iter().map(|x| x.pg()).collect();
        Tx::opt(self, sql, &p)?.as_ref().map(owned).transpose()
    }

    fn now(&mut self, given: Millis) -> Result<Millis, StoreError> {
        Tx::now(self, given)
    }
}

/// A PostgreSQL row as owned values, by each column's type.
fn owned(r: &Row) -> Result<tx::Row, StoreError> {
    use postgres::types::Type;
    let mut out = Vec::with_capacity(r.len());
    for (i, col) in r.columns().iter().enumerate() {
        let t = col.type_();
        let v = if *t == Type::INT8 {
            r.try_get::<_, Option<i64>>(i)?.map(Value::Int)
        } else if *t == Type::INT4 {
            r.try_get::<_, Option<i32>>(i)?.map(|v| Value::Int(v.into()))
        } else if *t == Type::INT2 {
            r.try_get::<_, Option<i16>>(i)?.map(|v| Value::Int(v.into()))
        } else if *t == Type::BOOL {
            r.try_get::<_, Option<bool>>(i)?.map(Value::Bool)
        } else if *t == Type::FLOAT8 {
            r.try_get::<_, Option<f64>>(i)?.map(Value::Real)
        } else if *t == Type::FLOAT4 {
            r.try_get::<_, Option<f32>>(i)?.map(|v| Value::Real(v.into()))
        } else if *t == Type::BYTEA {
            r.try_get::<_, Option<Vec<u8>>>(i)?.map(Value::Blob)
        } else if [Type::TEXT, Type::VARCHAR, Type::BPCHAR, Type::NAME].contains(t) {
            r.try_get::<_, Option<String>>(i)?.map(Value::Text)
        } else {
            return Err(StoreError::Invalid(format!(
                "column {} is of PostgreSQL type {t}, which the store does not read",
                col.name()
            )));
        };
        out.push(v.unwrap_or(Value::Null));
    }
    Ok(tx::Row(out))
}
