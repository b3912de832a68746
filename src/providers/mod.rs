//! Image providers: one trait, several adapters, each declaring what it can prove.
//!
//! A provider adapter turns one generation request into calls to an outside service and
//! classifies every answer into the outcomes of DESIGN §4. Adapters never touch the store:
//! the engine records phases before and after each call, and decides retries from the
//! [`Capabilities`] an adapter declares.

pub mod dashboard;
pub mod demo;
pub mod demo_draft;
pub mod fake;
pub mod http;
pub mod kinds;
pub mod settings;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

pub use kinds::ProviderKind;
pub use settings::{Pricing, ProviderConfig, parse_size};

/// A boxed, sendable future; the trait is used as `dyn Provider`, so its methods return these.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub use crate::domain::Capabilities;

/// An image as bytes plus its media type (`image/png`, `image/jpeg` or `image/webp`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Image {
    pub bytes: Vec<u8>,
    pub media_type: String,
}

/// A drafting call's answer (`domain::draft::Answer`: the model's text and its usage) as an
/// adapter hands it to the worker: the result's bytes, typed `application/json`, where an
/// image's would be.
pub fn answer_image(answer: &crate::domain::draft::Answer) -> Image {
    Image {
        bytes: serde_json::to_vec(answer).unwrap_or_default(),
        media_type: crate::domain::draft::ANSWER_MEDIA_TYPE.into(),
    }
}

/// One paid generation as the adapter sees it.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct CallRequest {
    /// The tally task this call belongs to.
    pub task_id: String,
    pub prompt: String,
    /// Free-form provider parameters from the task (size, model overrides, …).
    pub params: serde_json::Value,
    /// Stable for the logical operation (one execution): sent as the idempotency key where
    /// the provider honours one, and as the marker used to find a job whose create answer
    /// was lost.
    pub idempotency_key: String,
    /// Reference images sent with the request (product photos of an image set).
    pub references: Vec<Image>,
    /// When the execution first recorded `calling` (ms since the epoch): a job found by
    /// listing must have been created after this moment.
    pub calling_at_ms: i64,
    /// Which candidate of its shot the task is (0 for the first, and for a task of its own):
    /// the demo provider draws a different placeholder for each.
    pub candidate: i64,
    /// When the engine stops waiting for this call (ms since the epoch: `calling_at_ms` plus
    /// the recovery deadline). An adapter that downloads a paid result inside `submit` (a
    /// synchronous answer with a URL) may retry it until then, within the provider's
    /// retention; polled jobs are retried by the engine's poll loop instead.
    pub deadline_ms: i64,
    /// What the call makes. For `edit` and `cutout` the image it works on is
    /// `references[0]` (the only reference), where every adapter already sends the image a
    /// model works from.
    pub operation: crate::domain::operation::Operation,
}

/// A job an asynchronous provider accepted: its id and, where the provider returned them,
/// the adapter's own data for polling it (fal's `status_url`/`response_url`). Persisted
/// (`executions.provider_job_id` and `provider_handle`) the moment it arrives, so a restart
/// polls exactly what the provider said to poll.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct JobHandle {
    pub id: String,
    /// Adapter-specific JSON; `None` when only the id is known.
    pub data: Option<serde_json::Value>,
}

impl JobHandle {
    /// A handle that knows only the job id.
    pub fn id(id: impl Into<String>) -> Self {
        JobHandle { id: id.into(), data: None }
    }
}

/// The answer to a submit that reached the provider and came back.
#[derive(Debug, Clone)]
pub enum Submitted {
    /// A synchronous provider returned the image.
    Done(Image),
    /// An asynchronous provider accepted the job; poll it.
    Accepted(JobHandle),
}

/// The state of an asynchronous job, as a poll reports it.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub enum JobState {
    /// Queued or rendering at the provider.
    Running,
    Done(Image),
    /// The provider says the job failed (a definite answer). Whether it billed the job is its
    /// rule, which tally cannot see (possibly charged).
    Failed(String),
    /// The provider says the job failed, and documents that such a failure is not billed
    /// (the adapter cites where). Not charged.
    FailedNotCharged(String),
    /// The job was canceled at the provider (not by tally) before it finished. Providers that
    /// bill by run time bill the time it ran: possibly charged.
    Canceled(String),
    /// The job finished (and was probably charged) but its result could not be fetched yet
    /// (its file host answered 404 or 5xx, the connection failed), while the provider's
    /// documented retention has not passed: poll again later. Never "expired".
    ResultUnavailable(String),
    /// The job finished but its output is no longer kept: the provider's documented retention
    /// passed, or the provider says it removed the data.
    Expired,
    /// The provider refused the job (its moderation flagged the prompt or the output) and
    /// documents that it does not bill such a job: a definite refusal, not charged.
    Refused(String),
}

/// A held job (`store::held`: an older copy of the database holds what it would send again)
/// as a look at the provider needs it ([`Provider::find_held`]): what the daemon that made the
/// copy would have sent for it, and since when.
#[derive(Debug, Clone)]
pub struct HeldQuery {
    /// The request as the job's next attempt sends it (its key is that attempt's; no
    /// reference images: a look compares no files).
    pub request: CallRequest,
    /// Every idempotency key a request of this job sent after the copy can carry: the keys
    /// of its next attempts (`provider_key(task, k)`), derived from the task alone,
    /// so the copy knows them without knowing what the other daemon did.
    pub keys: Vec<String>,
    /// No request of this job is older than this (the task's creation, ms since the epoch).
    pub since_ms: i64,
}

/// What a look at the provider found for a held job ([`Provider::find_held`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum HeldLookup {
    /// Exactly one request of this job, in a listing read to its end, with the key it
    /// carried (which names its attempt).
    Found { job: JobHandle, key: String },
    /// The listing from `since_ms` until now, read to its end, shows no request that could be
    /// this job's: why that is proof, in plain words. (Proof of the past only: a daemon that
    /// still runs elsewhere may send it later.)
    Absent(String),
    /// Nothing proven either way: why, in plain words (the provider cannot be searched,
    /// several requests match, the listing no longer shows inputs, …).
    Unsure(String),
}

/// What a search for a lost create found ([`Provider::find_lost`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum LostLookup {
    /// Exactly one job is the lost create.
    Found(JobHandle),
    /// The listing proves nothing, and looking again would not change that (no match, several
    /// that match, too many to read): why, in plain words.
    Unproven(String),
    /// Several candidates only because some have not shown yet what tells them apart (a
    /// prompt shown once the job finishes): look again later, but not after `until_ms`, when
    /// the provider no longer keeps the jobs. Why, in plain words.
    LookAgain { why: String, until_ms: i64 },
}

/// Why a call did not produce an answer, classified by what it proves (DESIGN §4).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[allow(missing_docs)]
pub enum CallError {
    /// The request provably never reached the provider (connect refused, DNS, refused
    /// locally before sending). Safe to retry; counts as an attempt.
    #[error("not sent: {0}")]
    NotSent(String),
    /// A definite refusal (400/422, content policy, bad credentials). Not retried.
    /// `config` marks refusals caused by tally's own configuration (401/403).
    #[error("rejected: {message}")]
    Rejected { message: String, config: bool },
    /// The provider said "not now" (429 rate limit, 503 with Retry-After, 408, 409): it did not
    /// take the request, so the engine waits `after` (the whole wait the answer's headers ask
    /// for, see `http::client::not_now_wait`) and sends again with the same idempotency key,
    /// without counting an attempt. An account out of credit is never this (it is
    /// `Rejected { config: true }`).
    #[error("provider asked to retry after {after:?}: {message}")]
    RetryAfter { after: Duration, message: String },
    /// Sent, but the outcome cannot be proven (timeout after connecting, reset mid-answer,
    /// 500/502/504). Whether it ran, and was charged, is unknown.
    #[error("outcome unknown: {0}")]
    Ambiguous(String),
    /// The provider accepted the request (a 2xx, or a job it finished) and probably charged
    /// for it, but tally cannot use what it answered: too large, endless, not an image, or an
    /// image URL that could not be downloaded. Never a refusal, never "not sent".
    #[error("answered, but unusable: {0}")]
    Unusable(String),
    /// The provider answered (2xx) but declined to make the image: its safety filter blocked
    /// the prompt or the output. A definite answer, never retried; the provider may still bill
    /// the request (some bill the prompt's tokens of an answered request).
    #[error("blocked by the provider: {0}")]
    Blocked(String),
}

/// An image provider adapter.
pub trait Provider: Send + Sync + 'static {
    /// What this adapter can prove after an ambiguous outcome.
    fn capabilities(&self) -> Capabilities;

    /// Plain words on how this provider bills, shown next to an `unknown` result.
    fn billing_note(&self) -> String {
        crate::domain::words::say("say.bills_default")
    }

    /// Where the owner looks for a request whose outcome tally cannot prove: the provider's
    /// page for this kind, or plain words saying there is none.
    fn dashboard(&self) -> dashboard::Dashboard {
        dashboard::Dashboard::none(
            "tally knows no dashboard page for this provider: look wherever its account shows requests and charges.",
        )
    }

    /// How long to wait between polls of an accepted job.
    fn poll_interval(&self) -> Duration {
        Duration::from_millis(1000)
    }

    /// The longest an accepted job may take before tally stops polling it and says `unknown`,
    /// when that is longer than the engine's recovery deadline (a batch API that targets a
    /// 24-hour turnaround). `None`: the recovery deadline applies.
    fn job_deadline(&self) -> Option<Duration> {
        None
    }

    /// How long the provider's rate-limit headers on its latest answers asked that nothing new
    /// be sent (a used-up quota until its reset); `None` when a quota remains or the adapter
    /// does not read them. HTTP adapters return `HttpClient::rate_limit_hold`. The engine
    /// reads it after each call and holds the provider's dispatch until then.
    fn rate_limit_hold(&self) -> Option<Duration> {
        None
    }

    /// Whether a create whose answer was lost can be searched for (a listing of recent jobs).
    /// By default the same as `lookup`; an adapter whose jobs can be polled by id but not
    /// listed (fal) says `false`, and the engine then says so instead of searching.
    fn finds_lost_creates(&self) -> bool {
        self.capabilities().lookup
    }

    /// Check, before anything paid is sent, that this request can be made and its result
    /// stored: inputs the model takes (reference images, size, output format), read from
    /// the provider's published schema where it has one. Runs before `calling` is recorded;
    /// `Rejected` fails the task with nothing sent and nothing charged. May read free
    /// metadata from the provider (never a paid call).
    fn preflight<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<(), CallError>> {
        let _ = req;
        Box::pin(async { Ok(()) })
    }

    /// Check, with a free call only (a listing of models, the provider's documented key
    /// check) and never a paid request, that the key works: `Ok` with what was found, in
    /// plain words. By default only that the key is there and can be sent.
    fn check_access(&self) -> BoxFuture<'_, Result<String, CallError>> {
        Box::pin(async {
            Ok("tally knows no free check for this kind of provider; the key is saved and will be sent with the next \
                job"
            .to_string())
        })
    }

    /// Start one paid generation. Never retries on its own.
    fn submit<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Submitted, CallError>>;

    /// Ask for the state of an accepted job. Polling starts no new paid work.
    fn poll<'a>(&'a self, job: &'a JobHandle) -> BoxFuture<'a, Result<JobState, CallError>> {
        let _ = job;
        Box::pin(async {
            Err(CallError::Rejected { message: "this provider cannot look up jobs".into(), config: true })
        })
    }

    /// Find a job whose create answer was lost, from what `req` sent and when. `Ok(None)`
    /// means the listing proved nothing (the job may or may not exist, or several match).
    fn find<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Option<JobHandle>, CallError>> {
        let _ = req;
        Box::pin(async { Ok(None) })
    }

    /// [`Provider::find`] with the third answer, "look again later": what the engine asks. By
    /// default `find`'s answer (a job, or nothing proven).
    fn find_lost<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<LostLookup, CallError>> {
        Box::pin(async move {
            Ok(match self.find(req).await? {
                Some(job) => LostLookup::Found(job),
                None => LostLookup::Unproven(crate::domain::words::say("say.no_single_match")),
            })
        })
    }

    /// Look for a request an older copy's original daemon may have sent for a held job (see
    /// [`HeldQuery`]). Only what the provider documents is used: an adapter that cannot tie a
    /// request to the job answers [`HeldLookup::Unsure`] saying why (the default).
    fn find_held<'a>(&'a self, q: &'a HeldQuery) -> BoxFuture<'a, Result<HeldLookup, CallError>> {
        let _ = q;
        Box::pin(async {
            Ok(HeldLookup::Unsure(
                "this kind of provider offers no listing of requests in which tally could find this job".into(),
            ))
        })
    }
}

/// Build the adapter for one configured provider, from its kind's descriptor
/// (`kinds::KINDS`). Errors name the provider and the problem (a missing `base_url`, a
/// malformed `model`); a missing API key is reported per call, as a configuration rejection,
/// so it can be fixed without restarting. The billing note and the dashboard come from the
/// configuration and the descriptor, around whatever the adapter says.
pub fn build(cfg: &ProviderConfig) -> Result<Arc<dyn Provider>, String> {
    let spec = cfg.kind.spec();
    let inner = (spec.build)(cfg)?;
    // The owner's own console (`dashboard_url`) wins over the kind's page.
    let dashboard = match &cfg.dashboard_url {
        Some(url) => dashboard::Dashboard::configured(url).with_model(cfg.model.as_deref()),
        None => (spec.dashboard)(cfg),
    };
    Ok(Arc::new(Configured { inner, note: cfg.billing_note.clone(), dashboard }))
}

/// An adapter with its configured billing note (if any) and its kind's dashboard.
struct Configured {
    inner: Arc<dyn Provider>,
    note: Option<String>,
    dashboard: dashboard::Dashboard,
}

impl Provider for Configured {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn billing_note(&self) -> String {
        self.note.clone().unwrap_or_else(|| self.inner.billing_note())
    }

    fn dashboard(&self) -> dashboard::Dashboard {
        self.dashboard.clone()
    }

    fn poll_interval(&self) -> Duration {
        self.inner.poll_interval()
    }

    fn finds_lost_creates(&self) -> bool {
        self.inner.finds_lost_creates()
    }

    fn job_deadline(&self) -> Option<Duration> {
        self.inner.job_deadline()
    }

    fn rate_limit_hold(&self) -> Option<Duration> {
        self.inner.rate_limit_hold()
    }

    fn preflight<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<(), CallError>> {
        self.inner.preflight(req)
    }

    fn check_access(&self) -> BoxFuture<'_, Result<String, CallError>> {
        self.inner.check_access()
    }

    fn submit<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Submitted, CallError>> {
        self.inner.submit(req)
    }

    fn poll<'a>(&'a self, job: &'a JobHandle) -> BoxFuture<'a, Result<JobState, CallError>> {
        self.inner.poll(job)
    }

    fn find<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Option<JobHandle>, CallError>> {
        self.inner.find(req)
    }

    fn find_lost<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<LostLookup, CallError>> {
        self.inner.find_lost(req)
    }

    fn find_held<'a>(&'a self, q: &'a HeldQuery) -> BoxFuture<'a, Result<HeldLookup, CallError>> {
        self.inner.find_held(q)
    }
}

/// The idempotency key sent to the provider for `attempt` of `task`: derived from the task
/// and the attempt, never from the execution row's random token. `attempts` counts the
/// executions that recorded `calling`, in the same transaction as that record; so if a power
/// loss erases a `calling` record (possible with `durability = "normal"`), the task's attempt
/// count goes back with it, the next execution gets the same attempt number, and its request
/// carries the same key as the one that may have left: a provider that honours the key
/// answers it without a second charge. An execution abandoned before calling sent nothing,
/// so its successor reusing the key is harmless.
///
/// The store's claim writes the same key in SQL (`store/ops/claim.rs`): change both together.
pub fn provider_key(task: &str, attempt: i64) -> String {
    format!("tally-{task}-{attempt}")
}

pub use crate::domain::{extension, sniff_image};
