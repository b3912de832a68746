//! Prometheus metrics: one registry per engine (no global), encoded as text by `GET /metrics`.
//!
//! The money counters are read from the database at each scrape (the executions are the
//! evidence): requests that reached a provider and settled, by charge state, and their
//! estimated cost. Each counter adds the growth of its database count since the last scrape,
//! so it only goes up; a request settled as `possible` and later proven `charged` (a late
//! answer, an operator's image) is counted under both, once each.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;

/// The engine's metrics.
pub struct Metrics {
    registry: Registry,
    provider_calls: Family<Labels, Counter>,
    recoveries: Family<Labels, Counter>,
    tasks: Family<Labels, Gauge>,
    dispatch_seconds: Histogram,
    pickup_seconds: Histogram,
    requests: Family<Labels, Counter>,
    spend: Family<Labels, Counter<f64, AtomicU64>>,
    sidecar: Family<Labels, Gauge>,
    /// The database counts seen at the last scrape, per label set: (requests, micros).
    seen: Mutex<HashMap<Labels, (i64, i64)>>,
}

/// One group of settled requests from the database: provider, charge state, currency,
/// how many, and their estimated cost in millionths.
pub type ChargeTotal = (String, crate::domain::Charge, Option<String>, i64, i64);

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A fresh registry with every tally metric registered.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let provider_calls = Family::<Labels, Counter>::default();
        let recoveries = Family::<Labels, Counter>::default();
        let tasks = Family::<Labels, Gauge>::default();
        let dispatch_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 18));
        let pickup_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 18));
        registry.register("tally_provider_calls", "Provider calls by provider and outcome", provider_calls.clone());
        registry.register("tally_recoveries", "Reconciler decisions by kind", recoveries.clone());
        registry.register("tally_tasks", "Tasks by status", tasks.clone());
        registry.register(
            "tally_dispatch_seconds",
            "Time from an envelope falling due to its hand-off to a worker",
            dispatch_seconds.clone(),
        );
        registry.register(
            "tally_pickup_seconds",
            "Time from a task's creation to the start of its first provider call",
            pickup_seconds.clone(),
        );
        let requests = Family::<Labels, Counter>::default();
        let spend = Family::<Labels, Counter<f64, AtomicU64>>::default();
        registry.register(
            "tally_provider_requests",
            "Requests that reached a provider and settled, by provider and charge state (refused, possible, charged)",
            requests.clone(),
        );
        registry.register(
            "tally_estimated_spend",
            "Estimated cost of settled requests from the configured prices, by provider, currency and charge state",
            spend.clone(),
        );
        let sidecar = Family::<Labels, Gauge>::default();
        registry.register(
            "tally_sidecar_seq",
            "SQLite: the commit sequence the data directory's sidecar last noted (state=noted) and, with durability = normal, made durable (state=durable)",
            sidecar.clone(),
        );
        Metrics {
            registry,
            sidecar,
            provider_calls,
            recoveries,
            tasks,
            dispatch_seconds,
            pickup_seconds,
            requests,
            spend,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Count a provider call's outcome.
    pub fn provider_call(&self, provider: &str, outcome: &str) {
        self.provider_calls.get_or_create(&vec![("provider", provider.into()), ("outcome", outcome.into())]).inc();
    }

    /// Count a reconciler decision.
    pub fn recovery(&self, kind: &str) {
        self.recoveries.get_or_create(&vec![("kind", kind.into())]).inc();
    }

    /// Record a dispatch delay.
    pub fn dispatched(&self, secs: f64) {
        self.dispatch_seconds.observe(secs);
    }

    /// Record a pickup latency.
    pub fn picked_up(&self, secs: f64) {
        self.pickup_seconds.observe(secs);
    }

    /// Set the task-count gauges.
    pub fn set_task_counts(&self, counts: &[(crate::domain::TaskStatus, i64)]) {
        for s in crate::domain::TaskStatus::ALL {
            let n = counts.iter().find(|(c, _)| c == s).map(|(_, n)| *n).unwrap_or(0);
            self.tasks.get_or_create(&vec![("status", s.as_str().into())]).set(n);
        }
    }

    /// Bring the money counters up to the database's totals (see the module docs).
    pub fn observe_charges(&self, totals: &[ChargeTotal]) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        for (provider, charge, currency, n, micros) in totals {
            let labels: Labels = vec![("provider", provider.clone()), ("charge", charge.as_str().into())];
            let last = seen.entry(labels.clone()).or_insert((0, 0));
            let counter = self.requests.get_or_create(&labels);
            if *n > last.0 {
                counter.inc_by((n - last.0) as u64);
            }
            if charge.may_cost() {
                let mut with_cur = labels.clone();
                with_cur.push(("currency", currency.clone().unwrap_or_default()));
                let spent = self.spend.get_or_create(&with_cur);
                if *micros > last.1 {
                    spent.inc_by(crate::domain::from_micros(micros - last.1));
                }
            }
            *last = (*n, *micros);
        }
    }

    /// The Prometheus text exposition.
    /// The sidecar's sequence numbers (`store::sqlite::lineage::Tracker::seqs`), at a scrape.
    pub fn set_sidecar(&self, seqs: Option<(i64, Option<i64>)>) {
        let Some((noted, durable)) = seqs else { return };
        self.sidecar.get_or_create(&vec![("state", "noted".to_string())]).set(noted);
        if let Some(d) = durable {
            self.sidecar.get_or_create(&vec![("state", "durable".to_string())]).set(d);
        }
    }

    /// Every metric in the OpenMetrics text format (`GET /metrics`).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}
