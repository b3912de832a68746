//! The one transaction interface every store operation is written over, so each operation
//! exists once and runs on both backends (River's driver executor, sqlx's `Any` backend).
//!
//! An operation is a synchronous function `fn(&mut dyn Tx, ...) -> Result<_, StoreError>`: it
//! cannot await, so no transaction spans a network call. The backend decides how the
//! transaction runs and commits (SQLite's single writer thread with group commit; one
//! PostgreSQL transaction per operation on the store's own threads); the operation decides which
//! rows are read and written, in which order, under which lock.
//!
//! **SQL is written once, in SQLite's spelling of placeholders (`?1`, `?2`, …)**; the
//! PostgreSQL implementation rewrites them to `$1`, `$2`, … once, when it prepares the statement.
//! Write what both dialects take: `true`/`false` and bare boolean columns (never `= 1`),
//! `CAST(?2 AS BIGINT)` where PostgreSQL needs a parameter's type (never `::bigint`), `RETURNING`,
//! `ON CONFLICT … DO`. Where the dialects genuinely differ (`greatest` vs `max`, `FOR UPDATE`,
//! `SKIP LOCKED`), the operation picks by [`Tx::dialect`], or uses a named hook below.
//!
//! **Locking invariant.** Under SQLite one writer thread runs every write, so a check followed
//! by an act is atomic with no lock. PostgreSQL runs operations concurrently, so an operation
//! that decides on a task (or a set) first locks it with [`Tx::lock_task`] (or
//! [`Tx::lock_set`]) — a row lock held to the end of its transaction; on SQLite these hooks cost
//! nothing. [`Tx::locking`] says whether locks are real, for the few operations that must look a
//! row up before they can lock it.
//!
//! Parameters are anything both drivers can bind ([`Param`]); rows come back owned ([`Row`]) and
//! are read with [`Row::get`], which fails (never panics) on a type it cannot convert.

use crate::domain::Millis;
use crate::store::StoreError;

/// The SQL dialect under a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

/// A transaction of one store operation.
pub trait Tx {
    /// Which dialect runs the SQL.
    fn dialect(&self) -> Dialect;

    /// Execute a statement; the number of rows it changed.
    fn exec(&mut self, sql: &'static str, p: &[&dyn Param]) -> Result<u64, StoreError>;

    /// Every row of a query.
    fn rows(&mut self, sql: &'static str, p: &[&dyn Param]) -> Result<Vec<Row>, StoreError>;

    /// At most one row (the first, if the query returns several).
    fn opt(&mut self, sql: &'static str, p: &[&dyn Param]) -> Result<Option<Row>, StoreError>;

    /// Exactly one row; none is [`StoreError::Invalid`] naming the query.
    fn one(&mut self, sql: &'static str, p: &[&dyn Param]) -> Result<Row, StoreError> {
        self.opt(sql, p)?.ok_or_else(|| StoreError::Invalid(format!("expected one row from: {}", first_line(sql))))
    }

    /// The `now` an operation uses: the caller's clock, or the database's where the backend
    /// keeps lease time on the database clock (PostgreSQL with `db_clock`).
    fn now(&mut self, given: Millis) -> Result<Millis, StoreError>;

    /// Whether other transactions run at the same time, so that an operation must lock what it
    /// decides on ([`Tx::lock_task`], [`Tx::lock_set`]) — false under SQLite's single writer.
    fn locking(&self) -> bool {
        self.dialect() == Dialect::Postgres
    }

    /// Lock a task's envelope row to the end of the transaction, so two operations on one task
    /// never interleave (PostgreSQL: `FOR UPDATE`; SQLite: nothing, the writer is alone).
    /// Every operation on one task locks it before it reads what it decides on.
    fn lock_task(&mut self, task: &str) -> Result<(), StoreError> {
        if self.locking() {
            let _t = crate::stages::span(crate::stages::Stage::LockStatement);
            self.opt("SELECT 1 FROM envelopes WHERE task_id = ?1 FOR UPDATE", &[&task])?;
        }
        Ok(())
    }

    /// Lock the envelope row of the task of execution `exec` to the end of the transaction, as
    /// [`Tx::lock_task`] does, in one round trip (PostgreSQL: the execution's task id and the
    /// lock in one statement; the id never changes, so reading it before the lock is safe).
    /// False when no such execution exists; true without a statement where locks are not real
    /// (SQLite). The envelope row is locked if it exists, as [`Tx::lock_task`] does.
    fn lock_task_of_execution(&mut self, exec: &str) -> Result<bool, StoreError> {
        if !self.locking() {
            return Ok(true);
        }
        let _t = crate::stages::span(crate::stages::Stage::LockStatement);
        let row = self.opt(
            "SELECT x.task_id, (SELECT 1 FROM envelopes e WHERE e.task_id = x.task_id FOR UPDATE)
             FROM executions x WHERE x.token = ?1",
            &[&exec],
        )?;
        Ok(row.is_some())
    }

    /// Lock an image set's row to the end of the transaction (set decisions: the next shot,
    /// candidates, the choice), the same way.
    fn lock_set(&mut self, set: &str) -> Result<(), StoreError> {
        if self.locking() {
            let _t = crate::stages::span(crate::stages::Stage::LockStatement);
            self.opt("SELECT 1 FROM sets WHERE id = ?1 FOR UPDATE", &[&set])?;
        }
        Ok(())
    }
}

fn first_line(sql: &str) -> &str {
    sql.trim().lines().next().unwrap_or("")
}

/// A value both drivers can bind: `&str`, `String`, `i64`, `i32`, `bool`, `f64`, `&[u8]`,
/// `Vec<u8>` and `Option`s of them. (`usize` and `u64` are not: PostgreSQL has no unsigned
/// integers; convert to `i64` first.)
pub trait Param: Sync {
    /// For rusqlite.
    fn sqlite(&self) -> &dyn rusqlite::ToSql;
    /// For postgres.
    fn pg(&self) -> &(dyn postgres::types::ToSql + Sync);
}

impl<T: rusqlite::ToSql + postgres::types::ToSql + Sync> Param for T {
    fn sqlite(&self) -> &dyn rusqlite::ToSql {
        self
    }
    fn pg(&self) -> &(dyn postgres::types::ToSql + Sync) {
        self
    }
}

/// One column's value, owned.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum Value {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
    Bool(bool),
}

/// One row of a result, owned (so a query's rows outlive its statement on both drivers).
#[derive(Debug, Clone, PartialEq)]
pub struct Row(pub(crate) Vec<Value>);

impl Row {
    /// Column `i` as a `T`; a missing column or a value of another type is an error naming both.
    pub fn get<T: FromValue>(&self, i: usize) -> Result<T, StoreError> {
        let v = self.0.get(i).ok_or_else(|| StoreError::Invalid(format!("no column {i} in a row")))?;
        T::from_value(v).ok_or_else(|| StoreError::Invalid(format!("column {i} holds {v:?}, not a {}", T::NAME)))
    }

    /// The number of columns.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the row has no columns.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A Rust type a column converts to (see [`Row::get`]).
pub trait FromValue: Sized {
    /// The type's name, for errors.
    const NAME: &'static str;
    /// The value as this type, if it is one.
    fn from_value(v: &Value) -> Option<Self>;
}

impl FromValue for i64 {
    const NAME: &'static str = "integer";
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Int(i) => Some(*i),
            Value::Bool(b) => Some(i64::from(*b)),
            _ => None,
        }
    }
}

impl FromValue for i32 {
    const NAME: &'static str = "32-bit integer";
    fn from_value(v: &Value) -> Option<Self> {
        i64::from_value(v).and_then(|i| i32::try_from(i).ok())
    }
}

impl FromValue for u32 {
    const NAME: &'static str = "non-negative 32-bit integer";
    fn from_value(v: &Value) -> Option<Self> {
        i64::from_value(v).and_then(|i| u32::try_from(i).ok())
    }
}

impl FromValue for u64 {
    const NAME: &'static str = "non-negative integer";
    fn from_value(v: &Value) -> Option<Self> {
        i64::from_value(v).and_then(|i| u64::try_from(i).ok())
    }
}

impl FromValue for usize {
    const NAME: &'static str = "non-negative integer";
    fn from_value(v: &Value) -> Option<Self> {
        i64::from_value(v).and_then(|i| usize::try_from(i).ok())
    }
}

impl FromValue for bool {
    const NAME: &'static str = "boolean";
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Bool(b) => Some(*b),
            Value::Int(i) => Some(*i != 0),
            _ => None,
        }
    }
}

impl FromValue for f64 {
    const NAME: &'static str = "number";
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Real(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }
}

impl FromValue for String {
    const NAME: &'static str = "text";
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Text(s) => Some(s.clone()),
            _ => None,
        }
    }
}

impl FromValue for Vec<u8> {
    const NAME: &'static str = "blob";
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Blob(b) => Some(b.clone()),
            Value::Text(s) => Some(s.as_bytes().to_vec()),
            _ => None,
        }
    }
}

impl<T: FromValue> FromValue for Option<T> {
    const NAME: &'static str = T::NAME;
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Null => Some(None),
            v => T::from_value(v).map(Some),
        }
    }
}

/// `?N` placeholders as PostgreSQL's `$N`, outside string literals (done once per statement,
/// when it is prepared).
pub(crate) fn dollar_placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut in_literal = false;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_literal = !in_literal;
                out.push(c);
            }
            '?' if !in_literal && chars.peek().is_some_and(|n| n.is_ascii_digit()) => out.push('$'),
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_rewritten_outside_literals_only() {
        assert_eq!(
            dollar_placeholders("UPDATE t SET a = ?2, b = '?1' WHERE id = ?1 AND c = 'it''s ?3'"),
            "UPDATE t SET a = $2, b = '?1' WHERE id = $1 AND c = 'it''s ?3'"
        );
        assert_eq!(dollar_placeholders("SELECT $1"), "SELECT $1");
    }

    #[test]
    fn rows_convert_or_say_why() {
        let r = Row(vec![Value::Int(3), Value::Null, Value::Text("x".into()), Value::Bool(true)]);
        assert_eq!(r.get::<i64>(0).ok(), Some(3));
        assert_eq!(r.get::<Option<String>>(1).ok(), Some(None));
        assert_eq!(r.get::<String>(2).ok(), Some("x".to_string()));
        assert_eq!(r.get::<bool>(3).ok(), Some(true));
        assert!(r.get::<String>(0).is_err(), "an integer is not text");
        assert!(r.get::<i64>(9).is_err(), "no such column");
        assert!(r.get::<String>(1).is_err(), "NULL is not a String");
    }
}
