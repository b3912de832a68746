//! The seam as the conformance suite sees it: [`Backend`] lists every store operation with
//! the signature the engine calls, implemented by the SQLite store and the PostgreSQL store,
//! plus the fixtures that open a fresh store of each kind.
//!
//! PostgreSQL comes from `TALLY_TEST_PG_URL` (`scripts/with-postgres.sh` starts a throw-away
//! server and sets it; `scripts/test.sh` runs the suite through it). Every store gets its own
//! schema in that database; the nodes of one multi-node test share one. Without the variable
//! the PostgreSQL tests fail and say how to run them — unless `TALLY_SKIP_PG=1` is set
//! outside CI; under `CI=true` a missing PostgreSQL is always a failure.

#![allow(dead_code)]

use std::future::Future;

use tally::config::Durability;
use tally::domain::{Millis, TaskStatus};
use tally::store::postgres::{PgOptions, PgStore};
use tally::store::spend::{BudgetUse, Group, Limit, PaidRequest, SpendReport};
use tally::store::*;

/// Every store operation the engine, API and web page call, by name.
pub trait Backend: Clone + Send + Sync + 'static {
    fn submit(&self, t: NewTask, now: Millis) -> impl Future<Output = Result<SubmitOutcome, StoreError>> + Send;
    fn submit_and_get(
        &self,
        t: NewTask,
        now: Millis,
    ) -> impl Future<Output = Result<(SubmitOutcome, Option<TaskView>), StoreError>> + Send;
    fn dispatch_due(
        &self,
        now: Millis,
        limit: usize,
        lease_ms: Millis,
        boot: &str,
    ) -> impl Future<Output = Result<DispatchBatch, StoreError>> + Send;
    fn configure_providers(&self, list: Vec<ProviderSlots>) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn pause_provider(&self, provider: String, until: Millis) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn slow_start_feedback(&self, provider: String, ok: bool) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn release_claim(
        &self,
        exec: String,
        lease: String,
        due_at: Millis,
        why: String,
        now: Millis,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn record_calling(
        &self,
        exec: String,
        lease: String,
        now: Millis,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn record_accepted(
        &self,
        exec: String,
        lease: String,
        job: String,
        now: Millis,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn record_accepted_with(
        &self,
        exec: String,
        lease: String,
        job: String,
        handle: Option<String>,
        now: Millis,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn heartbeat(
        &self,
        exec: String,
        lease: String,
        now: Millis,
        lease_ms: Millis,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn finish(
        &self,
        exec: String,
        lease: String,
        f: Finish,
        now: Millis,
    ) -> impl Future<Output = Result<TaskStatus, StoreError>> + Send;
    fn late_result(
        &self,
        exec: String,
        a: NewArtifact,
        now: Millis,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
    fn cancel(&self, task: String, now: Millis) -> impl Future<Output = Result<CancelOutcome, StoreError>> + Send;
    fn retry(
        &self,
        task: String,
        acknowledged: bool,
        key: Option<String>,
        now: Millis,
    ) -> impl Future<Output = Result<RetryOutcome, StoreError>> + Send;
    fn resolve(
        &self,
        task: String,
        r: Resolution,
        note: String,
        now: Millis,
    ) -> impl Future<Output = Result<ResolveOutcome, StoreError>> + Send;
    /// A resolution with the owner's record of the charge.
    fn resolve_with_charge(
        &self,
        task: String,
        r: Resolution,
        owner: OwnerCharge,
        note: String,
        now: Millis,
    ) -> impl Future<Output = Result<ResolveOutcome, StoreError>> + Send;
    fn leftovers(&self, now: Millis, boot: &str) -> impl Future<Output = Result<Vec<LeftoverRow>, StoreError>> + Send;
    fn apply_recovery(
        &self,
        items: Vec<(LeftoverRow, Recovery)>,
        now: Millis,
    ) -> impl Future<Output = Result<Vec<(String, TaskStatus)>, StoreError>> + Send;
    fn save_upload(&self, img: NewImage, now: Millis) -> impl Future<Output = Result<UploadView, StoreError>> + Send;
    fn upload_for_download(
        &self,
        id: String,
    ) -> impl Future<Output = Result<Option<(UploadView, Option<String>)>, StoreError>> + Send;
    fn read_image_bytes(
        &self,
        id: String,
    ) -> impl Future<Output = Result<Option<(BlobMeta, Vec<u8>)>, StoreError>> + Send;
    fn create_set(&self, s: NewSet, now: Millis) -> impl Future<Output = Result<SubmitOutcome, StoreError>> + Send;
    fn cancel_set(&self, id: String, now: Millis) -> impl Future<Output = Result<Option<usize>, StoreError>> + Send;
    fn get_set(&self, id: String) -> impl Future<Output = Result<Option<SetView>, StoreError>> + Send;
    fn add_candidates(
        &self,
        set: String,
        position: i64,
        count: u32,
        now: Millis,
    ) -> impl Future<Output = Result<AddOutcome, StoreError>> + Send;
    fn choose(
        &self,
        set: String,
        position: i64,
        artifact: Option<String>,
        now: Millis,
    ) -> impl Future<Output = Result<ChoiceOutcome, StoreError>> + Send;
    fn list_sets(
        &self,
        before: Option<String>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<SetView>, StoreError>> + Send;
    fn upload(&self, id: String) -> impl Future<Output = Result<Option<UploadView>, StoreError>> + Send;
    fn get_task(&self, id: String) -> impl Future<Output = Result<Option<TaskView>, StoreError>> + Send;
    fn list_tasks(
        &self,
        status: Option<TaskStatus>,
        before: Option<String>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<TaskView>, StoreError>> + Send;
    /// Tasks whose prompt or set product contains `text`, newest first.
    fn search_tasks(&self, text: &str, limit: usize) -> impl Future<Output = Result<Vec<TaskView>, StoreError>> + Send;
    fn events(&self, task: String) -> impl Future<Output = Result<Vec<EventView>, StoreError>> + Send;
    fn artifact(&self, id: String) -> impl Future<Output = Result<Option<ArtifactView>, StoreError>> + Send;
    fn status_counts(&self) -> impl Future<Output = Result<Vec<(TaskStatus, i64)>, StoreError>> + Send;
    /// Held jobs (`store::held`): hold what is unsettled, release, list.
    fn hold_unsettled(
        &self,
        reason: String,
        now: Millis,
    ) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;
    fn release_held(
        &self,
        which: held::Release,
        now: Millis,
    ) -> impl Future<Output = Result<held::ReleaseReport, StoreError>> + Send;
    fn held_tasks(&self, limit: usize) -> impl Future<Output = Result<(i64, Vec<TaskView>), StoreError>> + Send;
    fn next_sent_deadline(&self) -> impl Future<Output = Result<Option<Millis>, StoreError>> + Send;
    /// `record_calling` with its money facts (price, billable, limits).
    fn calling_with(
        &self,
        exec: String,
        lease: String,
        now: Millis,
        facts: CallingFacts,
    ) -> impl Future<Output = Result<CallingOutcome, StoreError>> + Send;
    /// `retry` with the whole acknowledgement.
    fn retry_ack(
        &self,
        task: String,
        ack: RetryAck,
        key: Option<String>,
        now: Millis,
    ) -> impl Future<Output = Result<RetryOutcome, StoreError>> + Send;
    /// `list_tasks` with the whole filter.
    fn list_filtered(
        &self,
        filter: TaskFilter,
        before: Option<String>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<TaskView>, StoreError>> + Send;
    fn spend(
        &self,
        from: Millis,
        to: Millis,
        group: Group,
    ) -> impl Future<Output = Result<SpendReport, StoreError>> + Send;
    fn budget_use(
        &self,
        limits: Vec<Limit>,
        now: Millis,
    ) -> impl Future<Output = Result<Vec<BudgetUse>, StoreError>> + Send;
    fn paid_requests(
        &self,
        from: Millis,
        to: Millis,
    ) -> impl Future<Output = Result<Vec<PaidRequest>, StoreError>> + Send;
    fn charge_totals(&self) -> impl Future<Output = Result<Vec<tally::metrics::ChargeTotal>, StoreError>> + Send;
    fn release_budget_holds(&self, now: Millis) -> impl Future<Output = Result<usize, StoreError>> + Send;
    fn budget_setting(&self) -> impl Future<Output = Result<Option<String>, StoreError>> + Send;
    fn set_budget_setting(
        &self,
        limits: Option<String>,
        now: Millis,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn insert_session(
        &self,
        id_hash: String,
        csrf: String,
        now: Millis,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn session(
        &self,
        id_hash: String,
    ) -> impl Future<Output = Result<Option<tally::store::settings::StoredSession>, StoreError>> + Send;
    fn touch_session(
        &self,
        id_hash: String,
        now: Millis,
        expired_before: Millis,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn delete_sessions(&self, id_hash: Option<String>) -> impl Future<Output = Result<usize, StoreError>> + Send;
    fn prune(&self, cutoff: Millis, dry_run: bool) -> impl Future<Output = Result<PruneReport, StoreError>> + Send;
    fn next_prunable(&self, since: Millis) -> impl Future<Output = Result<Option<Millis>, StoreError>> + Send;
    fn statements(&self) -> u64;
    fn close(&self) -> Result<(), StoreError>;
    /// An integer from one SQL query written so both dialects accept it (test inspection).
    fn int(&self, sql: &'static str) -> impl Future<Output = i64> + Send;
    /// What `tally check` finds in the store's database file (SQLite; a PostgreSQL store has
    /// no file here and answers nothing: its check is tested through `tally check` on a node).
    fn file_problems(&self) -> Vec<String> {
        Vec::new()
    }
}

macro_rules! forward {
    ($ty:ty $(; $($extra:tt)*)?) => {
        impl Backend for $ty {
            $($($extra)*)?
            fn submit(
                &self,
                t: NewTask,
                now: Millis,
            ) -> impl Future<Output = Result<SubmitOutcome, StoreError>> + Send {
                <$ty>::submit(self, t, now)
            }
            fn submit_and_get(
                &self,
                t: NewTask,
                now: Millis,
            ) -> impl Future<Output = Result<(SubmitOutcome, Option<TaskView>), StoreError>> + Send {
                <$ty>::submit_and_get(self, t, now)
            }
            fn dispatch_due(
                &self,
                now: Millis,
                limit: usize,
                lease_ms: Millis,
                boot: &str,
            ) -> impl Future<Output = Result<DispatchBatch, StoreError>> + Send {
                let (s, boot) = (self.clone(), boot.to_string());
                async move { <$ty>::dispatch_due(&s, now, limit, lease_ms, &boot).await }
            }
            fn configure_providers(
                &self,
                list: Vec<ProviderSlots>,
            ) -> impl Future<Output = Result<(), StoreError>> + Send {
                <$ty>::configure_providers(self, list)
            }
            fn pause_provider(
                &self,
                provider: String,
                until: Millis,
            ) -> impl Future<Output = Result<(), StoreError>> + Send {
                <$ty>::pause_provider(self, provider, until)
            }
            fn slow_start_feedback(
                &self,
                provider: String,
                ok: bool,
            ) -> impl Future<Output = Result<(), StoreError>> + Send {
                <$ty>::slow_start_feedback(self, provider, ok)
            }
            fn release_claim(
                &self,
                exec: String,
                lease: String,
                due_at: Millis,
                why: String,
                now: Millis,
            ) -> impl Future<Output = Result<(), StoreError>> + Send {
                <$ty>::release_claim(self, exec, lease, due_at, why, now)
            }
            fn record_calling(
                &self,
                exec: String,
                lease: String,
                now: Millis,
            ) -> impl Future<Output = Result<(), StoreError>> + Send {
                let calling = <$ty>::record_calling(self, exec, lease, now, tally::store::CallingFacts::billed());
                async move { calling.await.map(|_| ()) }
            }
            fn record_accepted(
                &self,
                exec: String,
                lease: String,
                job: String,
                now: Millis,
            ) -> impl Future<Output = Result<(), StoreError>> + Send {
                <$ty>::record_accepted(self, exec, lease, job, now)
            }
            fn record_accepted_with(
                &self,
                exec: String,
                lease: String,
                job: String,
                handle: Option<String>,
                now: Millis,
            ) -> impl Future<Output = Result<(), StoreError>> + Send {
                <$ty>::record_accepted_with(self, exec, lease, job, handle, now)
            }
            fn heartbeat(
                &self,
                exec: String,
                lease: String,
                now: Millis,
                lease_ms: Millis,
            ) -> impl Future<Output = Result<(), StoreError>> + Send {
                <$ty>::heartbeat(self, exec, lease, now, lease_ms)
            }
            fn finish(
                &self,
                exec: String,
                lease: String,
                f: Finish,
                now: Millis,
            ) -> impl Future<Output = Result<TaskStatus, StoreError>> + Send {
                <$ty>::finish(self, exec, lease, f, now)
            }
            fn late_result(
                &self,
                exec: String,
                a: NewArtifact,
                now: Millis,
            ) -> impl Future<Output = Result<bool, StoreError>> + Send {
                <$ty>::late_result(self, exec, a, now)
            }
            fn cancel(
                &self,
                task: String,
                now: Millis,
            ) -> impl Future<Output = Result<CancelOutcome, StoreError>> + Send {
                <$ty>::cancel(self, task, now)
            }
            fn retry(
                &self,
                task: String,
                acknowledged: bool,
                key: Option<String>,
                now: Millis,
            ) -> impl Future<Output = Result<RetryOutcome, StoreError>> + Send {
                let ack = tally::store::RetryAck { possible_charge: acknowledged, retried_as: None };
                <$ty>::retry(self, task, ack, key, now)
            }
            fn resolve(
                &self,
                task: String,
                r: Resolution,
                note: String,
                now: Millis,
            ) -> impl Future<Output = Result<ResolveOutcome, StoreError>> + Send {
                <$ty>::resolve(self, task, r, OwnerCharge::Unknown, note, now)
            }
            fn resolve_with_charge(
                &self,
                task: String,
                r: Resolution,
                owner: OwnerCharge,
                note: String,
                now: Millis,
            ) -> impl Future<Output = Result<ResolveOutcome, StoreError>> + Send {
                <$ty>::resolve(self, task, r, owner, note, now)
            }
            fn leftovers(
                &self,
                now: Millis,
                boot: &str,
            ) -> impl Future<Output = Result<Vec<LeftoverRow>, StoreError>> + Send {
                let (s, boot) = (self.clone(), boot.to_string());
                async move { <$ty>::leftovers(&s, now, &boot).await }
            }
            fn apply_recovery(
                &self,
                items: Vec<(LeftoverRow, Recovery)>,
                now: Millis,
            ) -> impl Future<Output = Result<Vec<(String, TaskStatus)>, StoreError>> + Send {
                <$ty>::apply_recovery(self, items, now)
            }
            fn save_upload(
                &self,
                img: NewImage,
                now: Millis,
            ) -> impl Future<Output = Result<UploadView, StoreError>> + Send {
                <$ty>::save_upload(self, img, now)
            }
            fn upload_for_download(
                &self,
                id: String,
            ) -> impl Future<Output = Result<Option<(UploadView, Option<String>)>, StoreError>> + Send {
                <$ty>::upload_for_download(self, id)
            }
            fn read_image_bytes(
                &self,
                id: String,
            ) -> impl Future<Output = Result<Option<(BlobMeta, Vec<u8>)>, StoreError>> + Send {
                <$ty>::read_image_bytes(self, id)
            }
            fn create_set(
                &self,
                s: NewSet,
                now: Millis,
            ) -> impl Future<Output = Result<SubmitOutcome, StoreError>> + Send {
                <$ty>::create_set(self, s, now)
            }
            fn cancel_set(
                &self,
                id: String,
                now: Millis,
            ) -> impl Future<Output = Result<Option<usize>, StoreError>> + Send {
                <$ty>::cancel_set(self, id, now)
            }
            fn get_set(&self, id: String) -> impl Future<Output = Result<Option<SetView>, StoreError>> + Send {
                <$ty>::get_set(self, id)
            }
            fn add_candidates(
                &self,
                set: String,
                position: i64,
                count: u32,
                now: Millis,
            ) -> impl Future<Output = Result<AddOutcome, StoreError>> + Send {
                <$ty>::add_candidates(self, set, position, count, now)
            }
            fn choose(
                &self,
                set: String,
                position: i64,
                artifact: Option<String>,
                now: Millis,
            ) -> impl Future<Output = Result<ChoiceOutcome, StoreError>> + Send {
                <$ty>::choose(self, set, position, artifact, now)
            }
            fn list_sets(
                &self,
                before: Option<String>,
                limit: usize,
            ) -> impl Future<Output = Result<Vec<SetView>, StoreError>> + Send {
                <$ty>::list_sets(self, before, limit)
            }
            fn upload(&self, id: String) -> impl Future<Output = Result<Option<UploadView>, StoreError>> + Send {
                <$ty>::upload(self, id)
            }
            fn get_task(&self, id: String) -> impl Future<Output = Result<Option<TaskView>, StoreError>> + Send {
                <$ty>::get_task(self, id)
            }
            fn list_tasks(
                &self,
                status: Option<TaskStatus>,
                before: Option<String>,
                limit: usize,
            ) -> impl Future<Output = Result<Vec<TaskView>, StoreError>> + Send {
                let filter = tally::store::TaskFilter { status, ..Default::default() };
                <$ty>::list_tasks(self, filter, before, limit)
            }
            fn search_tasks(
                &self,
                text: &str,
                limit: usize,
            ) -> impl Future<Output = Result<Vec<TaskView>, StoreError>> + Send {
                let filter = tally::store::TaskFilter { search: Some(text.to_string()), ..Default::default() };
                <$ty>::list_tasks(self, filter, None, limit)
            }
            fn events(&self, task: String) -> impl Future<Output = Result<Vec<EventView>, StoreError>> + Send {
                <$ty>::events(self, task)
            }
            fn artifact(&self, id: String) -> impl Future<Output = Result<Option<ArtifactView>, StoreError>> + Send {
                <$ty>::artifact(self, id)
            }
            fn status_counts(&self) -> impl Future<Output = Result<Vec<(TaskStatus, i64)>, StoreError>> + Send {
                <$ty>::status_counts(self)
            }
            fn hold_unsettled(
                &self,
                reason: String,
                now: Millis,
            ) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send {
                <$ty>::hold_unsettled(self, reason, now)
            }
            fn release_held(
                &self,
                which: held::Release,
                now: Millis,
            ) -> impl Future<Output = Result<held::ReleaseReport, StoreError>> + Send {
                <$ty>::release_held(self, which, now)
            }
            fn held_tasks(&self, limit: usize) -> impl Future<Output = Result<(i64, Vec<TaskView>), StoreError>> + Send {
                <$ty>::held_tasks(self, limit)
            }
            fn next_sent_deadline(&self) -> impl Future<Output = Result<Option<Millis>, StoreError>> + Send {
                <$ty>::next_sent_deadline(self)
            }
            fn calling_with(
                &self,
                exec: String,
                lease: String,
                now: Millis,
                facts: CallingFacts,
            ) -> impl Future<Output = Result<CallingOutcome, StoreError>> + Send {
                <$ty>::record_calling(self, exec, lease, now, facts)
            }
            fn retry_ack(
                &self,
                task: String,
                ack: RetryAck,
                key: Option<String>,
                now: Millis,
            ) -> impl Future<Output = Result<RetryOutcome, StoreError>> + Send {
                <$ty>::retry(self, task, ack, key, now)
            }
            fn list_filtered(
                &self,
                filter: TaskFilter,
                before: Option<String>,
                limit: usize,
            ) -> impl Future<Output = Result<Vec<TaskView>, StoreError>> + Send {
                <$ty>::list_tasks(self, filter, before, limit)
            }
            fn spend(
                &self,
                from: Millis,
                to: Millis,
                group: Group,
            ) -> impl Future<Output = Result<SpendReport, StoreError>> + Send {
                <$ty>::spend(self, from, to, group)
            }
            fn budget_use(
                &self,
                limits: Vec<Limit>,
                now: Millis,
            ) -> impl Future<Output = Result<Vec<BudgetUse>, StoreError>> + Send {
                <$ty>::budget_use(self, limits, now)
            }
            fn paid_requests(
                &self,
                from: Millis,
                to: Millis,
            ) -> impl Future<Output = Result<Vec<PaidRequest>, StoreError>> + Send {
                <$ty>::paid_requests(self, from, to)
            }
            fn charge_totals(
                &self,
            ) -> impl Future<Output = Result<Vec<tally::metrics::ChargeTotal>, StoreError>> + Send {
                <$ty>::charge_totals(self)
            }
            fn release_budget_holds(&self, now: Millis) -> impl Future<Output = Result<usize, StoreError>> + Send {
                <$ty>::release_budget_holds(self, now)
            }
            fn budget_setting(&self) -> impl Future<Output = Result<Option<String>, StoreError>> + Send {
                <$ty>::budget_setting(self)
            }
            fn set_budget_setting(
                &self,
                limits: Option<String>,
                now: Millis,
            ) -> impl Future<Output = Result<(), StoreError>> + Send {
                <$ty>::set_budget_setting(self, limits, now)
            }
            fn insert_session(
                &self,
                id_hash: String,
                csrf: String,
                now: Millis,
            ) -> impl Future<Output = Result<(), StoreError>> + Send {
                <$ty>::insert_session(self, id_hash, csrf, now)
            }
            fn session(
                &self,
                id_hash: String,
            ) -> impl Future<Output = Result<Option<tally::store::settings::StoredSession>, StoreError>> + Send {
                <$ty>::session(self, id_hash)
            }
            fn touch_session(
                &self,
                id_hash: String,
                now: Millis,
                expired_before: Millis,
            ) -> impl Future<Output = Result<(), StoreError>> + Send {
                <$ty>::touch_session(self, id_hash, now, expired_before)
            }
            fn delete_sessions(&self, id_hash: Option<String>) -> impl Future<Output = Result<usize, StoreError>> + Send {
                <$ty>::delete_sessions(self, id_hash)
            }
            fn prune(
                &self,
                cutoff: Millis,
                dry_run: bool,
            ) -> impl Future<Output = Result<PruneReport, StoreError>> + Send {
                <$ty>::prune(self, cutoff, dry_run)
            }
            fn next_prunable(&self, since: Millis) -> impl Future<Output = Result<Option<Millis>, StoreError>> + Send {
                <$ty>::next_prunable(self, since)
            }
            fn statements(&self) -> u64 {
                <$ty>::statements(self)
            }
            fn close(&self) -> Result<(), StoreError> {
                <$ty>::close(self)
            }
            fn int(&self, sql: &'static str) -> impl Future<Output = i64> + Send {
                int_of(self.clone(), sql)
            }
        }
    };
}

forward!(Store;
    fn file_problems(&self) -> Vec<String> {
        self.path().map(|p| tally::store::check(p).expect("check runs").problems).unwrap_or_default()
    }
);

async fn int_of<B: Inspect>(b: B, sql: &'static str) -> i64 {
    b.inspect(sql).await
}

/// Raw inspection, per backend.
trait Inspect {
    fn inspect(&self, sql: &'static str) -> impl Future<Output = i64> + Send;
}

impl Inspect for Store {
    fn inspect(&self, sql: &'static str) -> impl Future<Output = i64> + Send {
        let s = self.clone();
        async move {
            match &s {
                Store::Sqlite(_) => {
                    s.read(move |c| Ok(c.query_row(sql, [], |r| r.get::<_, i64>(0))?)).await.expect(sql)
                }
                Store::Postgres(p) => p.inspect(sql).await,
            }
        }
    }
}

impl Inspect for PgStore {
    fn inspect(&self, sql: &'static str) -> impl Future<Output = i64> + Send {
        let s = self.clone();
        async move { s.raw(move |c| Ok(c.query_one(sql, &[])?.get::<_, i64>(0))).await.expect(sql) }
    }
}

/// The provider every conformance test submits to: plenty of slots, no reserve (the tests of
/// slots and lanes configure their own).
pub fn provider_p() -> Vec<ProviderSlots> {
    vec![ProviderSlots { reserve: 0, ..ProviderSlots::new("p", 100) }]
}

/// A fresh SQLite store in its own temp dir.
pub fn sqlite() -> Store {
    let dir = std::env::temp_dir().join(format!("tally-conf-{}", uuid::Uuid::new_v4()));
    Store::open(&dir.join("tally.db"), Durability::Full).expect("open sqlite")
}

/// Close a store made by [`sqlite`] and remove its directory.
pub fn remove_sqlite(s: &Store) {
    let _ = s.close();
    if let Some(dir) = s.path().and_then(|p| p.parent()) {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// The test server's URL, or why there is none (a failure unless skipping is allowed).
pub fn pg_url() -> Option<String> {
    if let Ok(url) = std::env::var("TALLY_TEST_PG_URL") {
        return Some(url);
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let skip = std::env::var("TALLY_SKIP_PG").is_ok_and(|v| v == "1");
    if skip && !ci {
        eprintln!("SKIPPED: TALLY_TEST_PG_URL is not set and TALLY_SKIP_PG=1: this PostgreSQL test did not run");
        return None;
    }
    panic!(
        "TALLY_TEST_PG_URL is not set: run the PostgreSQL tests through `scripts/with-postgres.sh cargo test …` \
         (scripts/test.sh does), or set TALLY_SKIP_PG=1 to skip them outside CI"
    );
}

/// A fresh schema name.
pub fn schema() -> String {
    format!("t_{}", uuid::Uuid::new_v4().simple())
}

/// Options for a node of a test schema: the caller's clock, two operation connections.
pub fn pg_options(url: &str, schema: &str, node: &str) -> PgOptions {
    PgOptions {
        url: url.to_string(),
        node: node.to_string(),
        connections: 2,
        durability: Durability::Full,
        schema: Some(schema.to_string()),
        db_clock: false,
        listen: true,
        poll: None,
        watch_peers: true,
        lease: std::time::Duration::from_secs(30),
    }
}

/// A fresh PostgreSQL store (node `node-a`) in its own schema, behind the seam (`Store`) as the
/// engine holds it; `None` only when skipping.
pub fn postgres() -> Option<Store> {
    let url = pg_url()?;
    Some(Store::open_postgres(pg_options(&url, &schema(), "node-a")).expect("open postgres"))
}
