//! A scriptable in-process provider for tests and benchmarks.
//!
//! It counts what a real provider would count — requests received, paid generations
//! started, polls, listings — and plays a script of behaviours, one per submit: succeed,
//! reject, rate-limit, hang, fail before sending, or accept the work and lose the answer.
//! Tests assert these counters, not only the task status (DESIGN §9).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{Notify, watch};

use super::{BoxFuture, CallError, CallRequest, Capabilities, Image, JobHandle, JobState, Provider, Submitted};

/// What the fake does with one submit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Charge and answer with an image (synchronous) or a job id (when `async_jobs`).
    Succeed,
    /// Refuse with a definite answer, not charged.
    Reject,
    /// Answer 429 with this Retry-After, not charged.
    RateLimit(Duration),
    /// Charge, then never answer until [`Fake::release`] is called; then answer normally.
    Hang,
    /// Fail before anything leaves (connect refused), not received, not charged.
    FailBeforeSending,
    /// Charge and do the work, then lose the answer (ambiguous outcome).
    AcceptAndLose,
}

/// Counters of what reached the fake "provider".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Counts {
    /// Submits that reached the provider (including replays with a known key).
    pub received: u32,
    /// Submits that started a new paid generation.
    pub charged: u32,
    pub polls: u32,
    pub finds: u32,
}

#[derive(Debug, Default)]
struct State {
    script: VecDeque<Step>,
    counts: Counts,
    /// Results by idempotency key (what an idempotent provider remembers).
    by_key: HashMap<String, String>,
    /// Async jobs: id → polls left before done.
    jobs: HashMap<String, u32>,
}

/// The scriptable fake provider. Steps are taken from the script in order; when it runs out,
/// every submit succeeds.
#[derive(Debug)]
pub struct Fake {
    caps: Capabilities,
    async_jobs: bool,
    polls_before_done: u32,
    state: Mutex<State>,
    release: Notify,
    received_tx: watch::Sender<u32>,
}

impl Fake {
    /// A synchronous fake with the given capabilities.
    pub fn new(caps: Capabilities) -> Self {
        Fake {
            caps,
            async_jobs: false,
            polls_before_done: 0,
            state: Mutex::new(State::default()),
            release: Notify::new(),
            received_tx: watch::channel(0).0,
        }
    }

    /// An asynchronous fake (submit returns a job id; `polls` polls report running first).
    /// It can look jobs up by id and find them by marker.
    pub fn asynchronous(polls: u32) -> Self {
        let mut f = Fake::new(Capabilities { idempotent_create: false, lookup: true });
        f.async_jobs = true;
        f.polls_before_done = polls;
        f
    }

    /// Append steps to the script.
    pub fn script(&self, steps: impl IntoIterator<Item = Step>) {
        self.lock().script.extend(steps);
    }

    /// Let every hanging call answer.
    pub fn release(&self) {
        self.release.notify_waiters();
    }

    /// A snapshot of the counters.
    pub fn counts(&self) -> Counts {
        self.lock().counts
    }

    /// Wait until at least `n` submits have reached the provider.
    pub async fn wait_received(&self, n: u32) {
        let mut rx = self.received_tx.subscribe();
        // The sender lives as long as self, so wait_for only errs if it is dropped.
        let _ = rx.wait_for(|v| *v >= n).await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock only happens in a failing test; keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn image(prompt: &str) -> Image {
        Image { bytes: crate::render::placeholder_png(prompt, 8), media_type: "image/png".into() }
    }

    /// Record a received submit; returns (step, already known job/result for the key).
    fn receive(&self, req: &CallRequest) -> (Step, Option<String>) {
        let mut s = self.lock();
        let step = s.script.pop_front().unwrap_or(Step::Succeed);
        if step == Step::FailBeforeSending {
            return (step, None);
        }
        s.counts.received += 1;
        let n = s.counts.received;
        self.received_tx.send_replace(n);
        if self.caps.idempotent_create
            && let Some(job) = s.by_key.get(&req.idempotency_key)
        {
            return (Step::Succeed, Some(job.clone()));
        }
        if matches!(step, Step::Succeed | Step::Hang | Step::AcceptAndLose) {
            s.counts.charged += 1;
            let job = format!("job-{}", s.counts.charged);
            s.by_key.insert(req.idempotency_key.clone(), job.clone());
            s.jobs.insert(job, self.polls_before_done);
        }
        (step, None)
    }
}

impl Provider for Fake {
    fn capabilities(&self) -> Capabilities {
        self.caps
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_millis(5)
    }

    fn submit<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Submitted, CallError>> {
        Box::pin(async move {
            let (step, known) = self.receive(req);
            if let Some(job) = known {
                return Ok(if self.async_jobs {
                    Submitted::Accepted(JobHandle::id(job))
                } else {
                    Submitted::Done(Fake::image(&req.prompt))
                });
            }
            let answer = || {
                let job = self.lock().by_key.get(&req.idempotency_key).cloned().unwrap_or_default();
                if self.async_jobs {
                    Submitted::Accepted(JobHandle::id(job))
                } else {
                    Submitted::Done(Fake::image(&req.prompt))
                }
            };
            match step {
                Step::Succeed => Ok(answer()),
                Step::Reject => Err(CallError::Rejected { message: "invalid prompt".into(), config: false }),
                Step::RateLimit(after) => Err(CallError::RetryAfter { after, message: "rate limited".into() }),
                Step::FailBeforeSending => Err(CallError::NotSent("connection refused".into())),
                Step::AcceptAndLose => Err(CallError::Ambiguous("connection reset after sending".into())),
                Step::Hang => {
                    self.release.notified().await;
                    Ok(answer())
                }
            }
        })
    }

    fn poll<'a>(&'a self, job: &'a JobHandle) -> BoxFuture<'a, Result<JobState, CallError>> {
        let job_id = job.id.as_str();
        Box::pin(async move {
            let mut s = self.lock();
            s.counts.polls += 1;
            match s.jobs.get_mut(job_id) {
                None => Err(CallError::Rejected { message: format!("no job {job_id}"), config: false }),
                Some(0) => Ok(JobState::Done(Fake::image(job_id))),
                Some(left) => {
                    *left -= 1;
                    Ok(JobState::Running)
                }
            }
        })
    }

    fn find<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Option<JobHandle>, CallError>> {
        Box::pin(async move {
            let mut s = self.lock();
            s.counts.finds += 1;
            Ok(if self.caps.lookup { s.by_key.get(&req.idempotency_key).cloned().map(JobHandle::id) } else { None })
        })
    }
}
