//! The store's shared vocabulary: what callers hand to the store operations and what they get
//! back (tasks to create, claims, finishes, outcomes of user actions, recovery decisions).
//! Backend-neutral: the operations in `store::ops` take and return these on either backend, and
//! `store::seam` passes them through unchanged.

use crate::domain::operation::{Operation, Source};
use crate::domain::{Charge, FailureKind, Micros, Millis, Phase, TaskStatus, request_hash};
use crate::store::blobs::NewArtifact;
use serde_json::Value;

/// Why a provider's dispatch is paused: two causes, told apart in what a waiting task says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseReason {
    /// Its calls failed several times in a row: the circuit breaker opened.
    Circuit,
    /// It said "not now" (a 429, a used-up quota): a rate-limit hold.
    RateLimit,
}

impl PauseReason {
    /// Its name in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            PauseReason::Circuit => "circuit",
            PauseReason::RateLimit => "rate_limit",
        }
    }
}

/// A provider's pause: until when, why, since when, and (an opened circuit) what failed last.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Pause {
    pub until: Millis,
    pub reason: PauseReason,
    /// When the pause began (a rate-limit hold's length is `until - at`).
    pub at: Millis,
    /// For an opened circuit, the last failure in plain words; `None` for a rate-limit hold.
    pub why: Option<String>,
}

/// A task to create.
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct NewTask {
    pub provider: String,
    pub prompt: String,
    pub params: Value,
    pub idempotency_key: Option<String>,
    pub retry_of: Option<String>,
    /// A retry's idempotency key, unique per original task (`retry_of`): the same key on
    /// another task's retry names a different operation.
    pub retry_key: Option<String>,
    /// Set when the task is a shot of an image set.
    pub shot: Option<ShotRef>,
    /// The submitter's group: tasks of one group share a fairness key (a set's shots use
    /// the set instead).
    pub group: Option<String>,
    /// What the call makes (`generate` by default).
    pub operation: Operation,
    /// The stored image an `edit` or `cutout` works on (checked to exist before the submit).
    pub source: Option<Source>,
}

/// Where a task sits in an image set.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct ShotRef {
    pub set_id: String,
    pub position: i64,
    pub role: String,
    /// Which candidate of the shot this task is (0 for the first).
    pub candidate: i64,
}

impl NewTask {
    pub(in crate::store) fn hash(&self) -> String {
        let group = self.group.as_deref().unwrap_or("");
        // A generation hashes as it always did (keys sent before operations existed replay);
        // another operation adds its name and source, so the same key for another image or
        // operation is a conflict.
        let extra = match (&self.operation, &self.source) {
            (Operation::Generate, None) => group.to_string(),
            (op, src) => format!(
                "{group}\u{0}{}\u{0}{}",
                op.as_str(),
                src.as_ref().map(|s| format!("{}:{}", s.kind.as_str(), s.id)).unwrap_or_default()
            ),
        };
        request_hash(&self.provider, &self.prompt, &self.params, &extra)
    }
}

/// The result of a submit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitOutcome {
    /// A new task (and its envelope) was committed.
    Created(String),
    /// The idempotency key names an existing task with the same request.
    Existing(String),
    /// The idempotency key names an existing task with a different request.
    Conflict(String),
}

impl SubmitOutcome {
    /// The task id in every case.
    pub fn task_id(&self) -> &str {
        match self {
            SubmitOutcome::Created(id) | SubmitOutcome::Existing(id) | SubmitOutcome::Conflict(id) => id,
        }
    }
}

/// Which lane an envelope is dispatched from (see `store::ops::dispatch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// A task's first dispatch: what a person (or a client) just asked for.
    Fresh,
    /// What the system put back: recovery decisions, retries after errors, resumes, releases
    /// because a circuit was open, budget holds.
    Recovery,
}

impl Lane {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Fresh => "fresh",
            Lane::Recovery => "recovery",
        }
    }

    /// Parse a stored name (anything unknown is the recovery lane).
    pub fn parse(s: &str) -> Lane {
        if s == "fresh" { Lane::Fresh } else { Lane::Recovery }
    }
}

pub use crate::domain::DispatchOrder;

/// A provider as the dispatcher sees it (`providers` table): its slots and its lanes' weights.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct ProviderSlots {
    pub name: String,
    /// Calls to this provider at the same time, across both lanes.
    pub max_concurrency: usize,
    /// Slots the recovery lane leaves free for fresh work (it always may use at least one).
    pub reserve: usize,
    pub fresh_weight: u32,
    pub recovery_weight: u32,
    pub order: DispatchOrder,
}

impl ProviderSlots {
    /// A provider with the default reserve (1) and weights (fresh 4 : recovery 1).
    pub fn new(name: impl Into<String>, max_concurrency: usize) -> Self {
        ProviderSlots {
            name: name.into(),
            max_concurrency: max_concurrency.max(1),
            reserve: 1,
            fresh_weight: 4,
            recovery_weight: 1,
            order: DispatchOrder::Fair,
        }
    }
}

/// What the dispatcher claimed, and when it should look again on its own.
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct DispatchBatch {
    pub claims: Vec<Claim>,
    /// The earliest time something not dispatchable now becomes dispatchable: a waiting
    /// envelope's due time, or the end of a provider's pause while ready work waits for it.
    /// `None`: nothing until something else happens (a submit, a finished call).
    pub next_due: Option<Millis>,
}

/// A claimed execution: everything a worker needs to run it. Made by the dispatcher's
/// statement ([`Store::dispatch_due`]), which takes the envelope's lease and opens (or, for
/// a resumed call, adopts) the execution in the same transaction.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct Claim {
    pub execution_token: String,
    pub lease_token: String,
    pub envelope_id: String,
    /// Which dispatch of the envelope this is.
    pub send_count: i64,
    pub lane: Lane,
    pub task_id: String,
    pub provider: String,
    pub prompt: String,
    pub params: Value,
    /// Which candidate of its shot the task is (0 for a task of its own).
    pub candidate: i64,
    pub attempt: i64,
    pub phase: Phase,
    pub job_id: Option<String>,
    /// The adapter's handle for polling the accepted job (JSON), if it persisted one.
    pub job_handle: Option<String>,
    pub idempotency_key: String,
    pub calling_at: Option<Millis>,
    /// True when this claim adopted an execution an earlier worker left in `calling` or
    /// `accepted` (after a crash or an expired lease).
    pub resumed: bool,
    pub cancel_requested: bool,
    /// When the task was submitted.
    pub created_at: Millis,
    /// When the envelope fell due (for the dispatch-delay metric).
    pub due_at: Millis,
    /// The provider's recovery lane was in its slow start when this was dispatched: the
    /// worker reports the call's outcome ([`Store::slow_start_feedback`]).
    pub slow_start: bool,
    /// Reference images to send (an image set's product photos).
    pub references: Vec<crate::store::UploadView>,
    /// What the call makes.
    pub operation: Operation,
    /// The stored image an `edit` or `cutout` works on.
    pub source: Option<Source>,
}

/// How an execution ends (or pauses). Each outcome carries what it proves about money; the
/// store records it on the execution, except that an execution that never recorded
/// `calling`, or whose provider never bills, is always [`Charge::None`] (enforced in
/// `finish`, not trusted from the caller).
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub enum Finish {
    /// The provider answered with this verified image: its bytes commit with the finish;
    /// charged.
    Succeeded(NewArtifact),
    /// The provider answered a call whose result is JSON (a `draft`): the answer commits with
    /// the finish, charged; the task succeeds if it matched tally's schema, and otherwise
    /// fails (`invalid_result`) with the answer kept.
    Answered(NewAnswer),
    /// A definite failure: not retried.
    Failed { kind: FailureKind, reason: String, charge: Charge },
    /// Nothing can prove what happened: automatic retries stop; possibly charged.
    Unknown { reason: String },
    /// Try again at `due_at`; when the attempts are used up, the task fails with `kind`
    /// instead. With `counted: false` (the provider said "not now": it refused the request)
    /// the attempt is not counted — the task's `attempts` and the envelope's `send_count` go
    /// back by one, so the next execution has the same attempt number and idempotency key —
    /// and `max_attempts` does not apply.
    RetryLater { due_at: Millis, kind: FailureKind, reason: String, max_attempts: i64, charge: Charge, counted: bool },
    /// A cancel arrived before anything was sent.
    CanceledBeforeCall,
}

impl Finish {
    /// What this outcome proves about money, before the store's own rule (see [`Finish`]).
    pub fn charge(&self) -> Charge {
        match self {
            Finish::Succeeded(_) | Finish::Answered(_) => Charge::Charged,
            Finish::Failed { charge, .. } | Finish::RetryLater { charge, .. } => *charge,
            Finish::Unknown { .. } => Charge::Possible,
            Finish::CanceledBeforeCall => Charge::None,
        }
    }
}

/// A JSON answer to store with its finish (`answers`).
#[derive(Debug, Clone)]
pub struct NewAnswer {
    /// The model's text exactly as received.
    pub body: String,
    /// The usage the provider reported (JSON).
    pub usage: Value,
    /// Why it does not match tally's schema; `None` when it does.
    pub invalid: Option<String>,
    /// The call's price from its usage, replacing the estimate recorded at `calling`.
    pub cost_micros: Option<Micros>,
}

/// What `record_calling` needs besides the tokens: the money facts recorded with the call,
/// and the limits the call must fit in.
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct CallingFacts {
    /// False for a provider that never bills (`demo`): its requests are always
    /// [`Charge::None`].
    pub billable: bool,
    /// The configured price of this request, if the provider has one.
    pub cost_micros: Option<Micros>,
    pub currency: Option<String>,
    /// The model the request names (for the spend report).
    pub model: Option<String>,
    /// Budgets this call must fit in; checked in the same transaction that records
    /// `calling`, so concurrent workers cannot together overshoot one.
    pub limits: Vec<crate::store::spend::Limit>,
}

impl CallingFacts {
    /// A billed request with no price and no limits (tests, scriptable providers).
    pub fn billed() -> Self {
        CallingFacts { billable: true, ..CallingFacts::default() }
    }
}

/// The result of `record_calling`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum CallingOutcome {
    /// `calling` is recorded: the request may leave now.
    Calling,
    /// A budget would be exceeded: nothing was recorded as sent, the execution is
    /// abandoned, and the task waits (no attempt counted) until `due_at`, the start of the
    /// next period, or until the limit is raised.
    Held { due_at: Millis, reason: String },
}

/// What a submit's fast path needs to claim its task and record `calling` in the submit's own
/// transaction (`store::ops::pickup`): the lease it takes, and the request's money facts for
/// `calling` (with the limits its budget check applies).
#[derive(Debug, Clone)]
pub struct Pickup {
    /// How long the lease lasts.
    pub lease_ms: Millis,
    /// The process run taking it.
    pub boot: String,
    /// The PostgreSQL node taking it (`None` on SQLite).
    pub node: Option<String>,
    /// What `calling` records, and the budgets it must fit in.
    pub facts: CallingFacts,
}

/// What a submit's fast path did (`store::ops::pickup`).
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub enum PickedUp {
    /// Not taken (a replayed key, a shot of a set, no free slot, or the fair order would not
    /// pick this task now): the task waits for the dispatcher exactly as on the normal path.
    No,
    /// Claimed and `calling` recorded in the submit's commit: the request may leave at once.
    /// The claim's phase is `calling`.
    Calling(Box<Claim>),
    /// Claimed, but a budget held the call back (`record_calling`'s hold: the execution is
    /// abandoned, the task waits until `due_at`; nothing was sent).
    Held { due_at: Millis, reason: String },
}

/// What the reconciler does with one leftover, as applied to the database.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub enum Recovery {
    Requeue,
    GiveUp,
    Abandon,
    Resume,
    Unknown,
}

/// A sent envelope whose deadline passed, with the execution it leaves behind (if any).
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct LeftoverRow {
    pub envelope_id: String,
    pub task_id: String,
    pub provider: String,
    pub send_count: i64,
    pub lease_token: Option<String>,
    /// The deadline as read: part of the evidence (a heartbeat moves it).
    pub lease_expires_at: Option<Millis>,
    /// (token, phase) of the task's running execution.
    pub execution: Option<(String, Phase)>,
    /// Filled in by the engine, not read from the store: how long a call of this provider may
    /// still be at the provider (its request timeout). A call that may be out (`calling`) and
    /// is taken over keeps its provider slot that long (`ops::slot_rows::hold`; PostgreSQL).
    pub call_window: Option<Millis>,
}

/// The result of a cancel request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum CancelOutcome {
    /// Nothing had been sent: canceled at once.
    Canceled,
    /// Running: marked cancel-requested; a result that arrives is kept.
    Requested,
    /// Already settled with this status.
    Settled(TaskStatus),
    NotFound,
}

/// The result of a user retry.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum RetryOutcome {
    Created(String),
    /// The idempotency key names a retry of this same task already made.
    Existing(String),
    /// The original may have been charged: the caller must acknowledge possible extra cost.
    NeedsAcknowledgement,
    /// A retry of this task (or another task for the same shot of its set) is still live:
    /// a task and a shot have at most one live retry.
    RetryInProgress {
        id: String,
        status: TaskStatus,
    },
    /// This task was already retried as `id` (settled): another retry needs its own
    /// acknowledgement naming `id`.
    AlreadyRetried {
        id: String,
        status: TaskStatus,
    },
    /// The task is not in a state that can be retried.
    NotRetryable(TaskStatus),
    NotFound,
}

/// What a user retry acknowledges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetryAck {
    /// That generating again may be charged again (needed when a request of the original
    /// may have been, or was, charged).
    pub possible_charge: bool,
    /// The id of the task's latest retry, when retrying it again (needed once it has one).
    pub retried_as: Option<String>,
}

/// An operator's resolution of an `unknown` task.
#[derive(Debug, Clone)]
pub enum Resolution {
    /// Found the image (e.g. in the provider's dashboard) and attached it.
    Succeeded(NewArtifact),
    /// Confirmed that it failed.
    Failed,
}

/// What the owner found about the charge when resolving an `unknown` task by hand (in the
/// provider's dashboard or invoice): it replaces the `possible` the evidence left, and the
/// request is marked as recorded by hand (`executions.charge_recorded_at`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OwnerCharge {
    /// Not known (the default): the evidence's charge stays.
    #[default]
    Unknown,
    /// The dashboard shows a charge.
    Charged,
    /// The dashboard shows no charge.
    NotCharged,
}

impl OwnerCharge {
    /// `charged`, `not_charged` or `unknown`.
    pub fn parse(s: &str) -> Option<OwnerCharge> {
        match s {
            "charged" => Some(OwnerCharge::Charged),
            "not_charged" => Some(OwnerCharge::NotCharged),
            "unknown" => Some(OwnerCharge::Unknown),
            _ => None,
        }
    }

    /// The charge the owner's record gives the task's unproven requests, if any.
    pub fn recorded(self) -> Option<Charge> {
        match self {
            OwnerCharge::Unknown => None,
            OwnerCharge::Charged => Some(Charge::Charged),
            OwnerCharge::NotCharged => Some(Charge::None),
        }
    }

    /// The history's `line` of a resolution with its words about money (`succeeded`: an image
    /// was found), a said line.
    pub fn words(self, succeeded: bool, line: &str) -> String {
        let key = match (self, succeeded) {
            (OwnerCharge::Charged, _) => "say.owner_charged",
            (OwnerCharge::NotCharged, _) => "say.owner_not_charged",
            (OwnerCharge::Unknown, true) => return line.to_string(),
            (OwnerCharge::Unknown, false) => "say.owner_unknown",
        };
        crate::domain::words::say_with(key, &[("line", line)])
    }
}

/// The result of an operator resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum ResolveOutcome {
    Resolved,
    NotUnknown(TaskStatus),
    NotFound,
}
