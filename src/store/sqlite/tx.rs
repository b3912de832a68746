//! [`Tx`] over a rusqlite connection: what SQLite's writer thread (and its readers) hand to a
//! store operation. Statements are prepared once per connection (`prepare_cached`); the
//! writer thread alone writes, so the lock hooks cost nothing here (see `store::tx`).

use rusqlite::Connection;
use rusqlite::types::ValueRef;

use crate::domain::Millis;
use crate::stages::{self, Stage};
use crate::store::StoreError;
use crate::store::tx::{Dialect, Param, Row, Tx, Value};

/// A store operation's transaction on SQLite: the writer's (or a reader's) connection, inside
/// the transaction its caller opened.
pub(crate) struct SqliteTx<'c> {
    c: &'c Connection,
}

impl<'c> SqliteTx<'c> {
    /// Wrap a connection that is inside a transaction.
    pub(crate) fn new(c: &'c Connection) -> Self {
        SqliteTx { c }
    }
}

fn bind<'p>(p: &'p [&'p dyn Param]) -> impl Iterator<Item = &'p dyn rusqlite::ToSql> + 'p {
    p.iter().map(|x| x.sqlite())
}

fn value(v: ValueRef<'_>) -> Value {
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Int(i),
        ValueRef::Real(f) => Value::Real(f),
        ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Value::Blob(b.to_vec()),
    }
}

fn row(r: &rusqlite::Row<'_>, n: usize) -> rusqlite::Result<Row> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        out.push(value(r.get_ref(i)?));
    }
    Ok(Row(out))
}

impl Tx for SqliteTx<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn exec(&mut self, sql: &'static str, p: &[&dyn Param]) -> Result<u64, StoreError> {
        let _t = stages::span(Stage::Sql);
        let n = self.c.prepare_cached(sql)?.execute(rusqlite::params_from_iter(bind(p)))?;
        Ok(n as u64)
    }

    fn rows(&mut self, sql: &'static str, p: &[&dyn Param]) -> Result<Vec<Row>, StoreError> {
        let _t = stages::span(Stage::Sql);
        let mut st = self.c.prepare_cached(sql)?;
        let n = st.column_count();
        let mut rows = st.query(rusqlite::params_from_iter(bind(p)))?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            out.push(row(r, n)?);
        }
        Ok(out)
    }

    fn opt(&mut self, sql: &'static str, p: &[&dyn Param]) -> Result<Option<Row>, StoreError> {
        let _t = stages::span(Stage::Sql);
        let mut st = self.c.prepare_cached(sql)?;
        let n = st.column_count();
        let mut rows = st.query(rusqlite::params_from_iter(bind(p)))?;
        Ok(match rows.next()? {
            Some(r) => Some(row(r, n)?),
            None => None,
        })
    }

    fn now(&mut self, given: Millis) -> Result<Millis, StoreError> {
        Ok(given)
    }
}
