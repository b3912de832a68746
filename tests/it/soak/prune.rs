//! The soak's prunes (issue #43): `POST /v1/prune` racing the deliveries, so a set whose
//! delivery is not yet ended must be kept, and whatever a prune takes must have settled.
//!
//! A prune deletes settled work, so a task this client tracks may be gone (404) at the end. It
//! is not lost if this client saw it settled before: each prune's cutoff is chosen so that
//! every task not yet seen settled was seen *unsettled* at or after the cutoff (a task settles
//! by changing its `updated_at`, and a prune only takes what last changed before the cutoff).
//! A task's first sighting is the moment its submit was sent; a `GET` showing it unsettled
//! moves it later. A prune runs only when no submit is waiting for its answer (its task's id is
//! unknown, so it could not be watched) and no shipment has deliveries still to make.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use serde_json::json;

use super::shipment::{Shipment, try_call};
use crate::common::Daemon;

/// At most this many prunes per soak.
pub const MAX_PRUNES: usize = 12;

/// Which tasks this client saw settled (with their status), and when it last saw each of the
/// others unsettled.
#[derive(Debug, Default)]
pub struct Watch {
    pub settled: HashMap<String, String>,
    unsettled: HashMap<String, SystemTime>,
    /// Prunes answered, prunes that met a delivery not yet ended, sets and tasks they took.
    pub prunes: usize,
    pub prunes_mid_delivery: usize,
    pub sets_pruned: u64,
    pub tasks_pruned: u64,
}

/// Whether `status` is one a task ends in (`unknown` too: a prune keeps those anyway).
pub fn settled(status: &str) -> bool {
    ["succeeded", "failed", "unknown", "canceled"].contains(&status)
}

impl Watch {
    /// A task accepted by a submit sent at `sent`.
    pub fn accepted(&mut self, id: &str, sent: SystemTime) {
        if !self.settled.contains_key(id) {
            self.unsettled.entry(id.to_string()).or_insert(sent);
        }
    }

    /// A task a resent submit answered: it may be older than the resend, so it counts as seen
    /// unsettled at the epoch until the next look.
    pub fn answered_again(&mut self, id: &str) {
        if !self.settled.contains_key(id) {
            self.unsettled.insert(id.to_string(), SystemTime::UNIX_EPOCH);
        }
    }

    /// Look at every task not yet seen settled; false if the daemon did not answer.
    fn look(&mut self, d: &Daemon) -> bool {
        let ids: Vec<String> = self.unsettled.keys().cloned().collect();
        for id in ids {
            let at = SystemTime::now();
            let Some((200, t)) = try_call(d, "GET", &format!("/v1/tasks/{id}"), None) else { return false };
            let status = t["status"].as_str().unwrap_or("").to_string();
            if settled(&status) {
                self.unsettled.remove(&id);
                self.settled.insert(id, status);
            } else {
                self.unsettled.insert(id, at);
            }
        }
        true
    }

    /// Prune everything that settled before every task still unsettled was last seen so, if
    /// the soak is in a state to (see the module docs). Whether a prune was answered.
    pub fn prune(&mut self, d: &Daemon, unanswered: usize, shipments: &[Shipment]) -> bool {
        if unanswered > 0 || !shipments.iter().all(Shipment::prunable) || !self.look(d) {
            return false;
        }
        let earliest = self.unsettled.values().min().copied().unwrap_or_else(SystemTime::now);
        // Whole seconds, rounded up: the cutoff (the daemon's now minus this) is then no later
        // than `earliest`.
        let age = SystemTime::now().duration_since(earliest).unwrap_or(Duration::ZERO);
        let secs = age.as_secs() + u64::from(age.subsec_nanos() > 0);
        let mid = shipments.iter().any(|s| s.open(d));
        let Some((status, r)) = try_call(d, "POST", "/v1/prune", Some(&json!({"older_than": format!("{secs}s")})))
        else {
            return false;
        };
        if status == 503 {
            return false;
        }
        assert_eq!(status, 200, "prune answered {status}: {r}");
        self.prunes += 1;
        self.prunes_mid_delivery += usize::from(mid);
        self.sets_pruned += r["sets"].as_u64().unwrap_or(0);
        self.tasks_pruned += r["tasks"].as_u64().unwrap_or(0);
        true
    }
}
