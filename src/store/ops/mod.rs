//! Write operations, one function each, named for what they do. Each runs on the writer
//! thread inside its own savepoint (see `store::sqlite`), so each is atomic on its own.
//!
//! **Fencing invariant.** Every operation a worker performs after its claim starts with
//! [`common::fence`]: a conditional UPDATE of the execution row that matches only if the execution
//! token is still `running` *and* the task's envelope still carries the worker's lease token.
//! Zero rows means the worker lost its right; the operation returns [`StoreError::Fenced`]
//! and writes nothing.

use super::SqliteStore;
use super::blobs::NewArtifact;

mod claim;
pub(in crate::store) mod common;
pub mod deliveries;
pub(in crate::store) mod dispatch;
pub(in crate::store) mod drafts;
pub(in crate::store) mod exec;
pub(in crate::store) mod intake;
pub(in crate::store) mod pickup;
pub(in crate::store) mod recovery;
mod slot_rows;
pub(in crate::store) mod slots;
pub(in crate::store) mod user;
// The image-set family: sets and uploads, candidates and the choice, held jobs, settings.
pub(in crate::store) mod choice;
pub(in crate::store) mod held;
pub(in crate::store) mod set_edit;
pub(in crate::store) mod sets;
pub(in crate::store) mod settings;

use crate::domain::{Charge, Micros};
pub(in crate::store) use common::latest_retry;
#[cfg(test)]
use dispatch::{CANDIDATES, PROVIDERS_STATE};
pub(in crate::store) use dispatch::{STRIDE, fair_key};
pub use exec::provider_key;
pub(in crate::store) use intake::submit;

use crate::domain::words::{say, say_with};
pub use crate::store::types::*;
pub use drafts::{AnswerView, ConfirmOutcome, DraftChange, DraftView, NewDraft, RevisionView};

/// The timeline's words about money for a settled charge (both backends): `stored` as the
/// store recorded it, `asked` as the outcome claimed it, `called` whether `calling` had been
/// recorded. Empty when nothing was sent.
pub(in crate::store) fn charge_words(
    called: bool,
    stored: Charge,
    asked: Charge,
    cost: Option<Micros>,
    currency: Option<&str>,
) -> String {
    let amount = match (cost, currency) {
        (Some(m), Some(cur)) => Some(crate::domain::money(m, cur)),
        _ => None,
    };
    let about = |key: &str| match &amount {
        Some(a) => say_with(&format!("{key}_about"), &[("amount", a)]),
        None => say(key),
    };
    match (called, stored) {
        (false, _) => String::new(),
        (true, Charge::None) if asked == Charge::None => say("say.money_nothing_reached"),
        (true, Charge::None) => say("say.money_never_charges"),
        (true, Charge::Refused) => say("say.money_refusal"),
        (true, Charge::Possible) => about("say.money_possible"),
        (true, Charge::Charged) => about("say.money_charged"),
    }
}

/// `text`, then `words` after a dash when there are any.
pub(in crate::store) fn with_money(text: &str, words: &str) -> String {
    if words.is_empty() { text.to_string() } else { say_with("say.with_money", &[("line", text), ("money", words)]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The store turns on SQLite's query-planner stability guarantee: without it a statement
    /// with a `LIMIT ?` or a `due_at <= ?` beside a partial index (the dispatcher's) is
    /// re-prepared on every run with new values, which tripled its cost.
    #[tokio::test]
    async fn hot_statements_are_prepared_once() {
        let dir = std::env::temp_dir().join(format!("tally-qpsg-{}", uuid::Uuid::new_v4()));
        let store = SqliteStore::open(&dir.join("tally.db"), crate::config::Durability::Normal).expect("open");
        let store = crate::store::Store::from(store);
        store.configure_providers(vec![ProviderSlots::new("p", 8)]).await.expect("configure");
        for i in 0..3i64 {
            let t = NewTask { provider: "p".into(), prompt: format!("t{i}"), ..NewTask::default() };
            store
                .write(move |c| submit(&mut crate::store::sqlite::tx::SqliteTx::new(c), &t, 1_000 + i))
                .await
                .expect("submit");
            let batch = store.dispatch_due(1_000 + i, 1 + i as usize, 50, "boot").await.expect("dispatch");
            assert_eq!(batch.claims.len(), 1, "run {i} claims the task just submitted");
        }
        let stats = store
            .write(|c| {
                let mut out = Vec::new();
                for sql in [PROVIDERS_STATE, CANDIDATES] {
                    let st = c.prepare_cached(sql)?;
                    out.push((
                        st.get_status(rusqlite::StatementStatus::Run),
                        st.get_status(rusqlite::StatementStatus::RePrepare),
                    ));
                }
                Ok(out)
            })
            .await
            .expect("status");
        for (runs, reprepares) in stats {
            assert_eq!(runs, 3, "the cached statement is the one the dispatcher ran");
            assert_eq!(reprepares, 0, "new bound values must not re-prepare the statement");
        }
        store.close().expect("close");
        let _ = std::fs::remove_dir_all(dir);
    }
}
