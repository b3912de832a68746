//! Prometheus metrics: one registry per engine (no global), encoded as text by `GET /metrics`.

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
}

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
        Metrics { registry, provider_calls, recoveries, tasks, dispatch_seconds, pickup_seconds }
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

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}
