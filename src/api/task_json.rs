//! The task JSON every surface shows: status, a plain-words message, attempts, artifacts, what
//! the evidence says about money, and whether a retry is possible and what it may cost. Its
//! sentences are in the request's language (`api::lang`), from the one catalogue
//! (`domain::words`); `reason` stays the stored English detail.

use crate::domain::operation::{Operation, Source};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::clock::rfc3339;
use crate::domain::words::{render, t as word, tf};
use crate::domain::{Charge, Lang, TaskStatus, from_micros, money, status_message_in, status_name};
use crate::engine::Engine;
use crate::store::{ArtifactView, TaskView};

/// A task as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct TaskJson {
    pub id: String,
    pub status: TaskStatus,
    /// Plain words for the status (the honest wording for `unknown`).
    pub message: String,
    pub attempts: i64,
    pub provider: String,
    pub prompt: String,
    /// The provider parameters the task was submitted with (`{}` for none).
    #[schema(value_type = Object)]
    pub params: Value,
    pub idempotency_key: Option<String>,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// RFC 3339, UTC.
    pub updated_at: String,
    pub artifacts: Vec<ArtifactJson>,
    pub retry: RetryJson,
    pub retry_of: Option<String>,
    /// What the evidence says about money for this task's requests.
    pub charge: ChargeJson,
    /// The latest retry of this task, if it was retried.
    pub retried_as: Option<RetriedAsJson>,
    /// The owner's to-do list: `unknown` and neither resolved nor retried yet, or held.
    pub needs_attention: bool,
    /// Held, not sent: the database turned out older than what was served (a restored backup,
    /// a copy taken while tally ran, a deleted WAL), and this job may have been sent since by
    /// the daemon the copy came from. Null when not held. Release it with
    /// `POST /v1/held/release`.
    pub held: Option<HeldJson>,
    /// The image set this job is a shot of, and the shot's role (`main`, `selling_point`,
    /// `scene`); null for a job of its own.
    pub set_id: Option<String>,
    pub shot_role: Option<String>,
    /// The shot's index in its set's `shots` (from 0), and which candidate of it this job is;
    /// null for a job of its own.
    pub shot_index: Option<i64>,
    pub candidate: Option<i64>,
    pub cancel_requested: bool,
    pub failure_kind: Option<String>,
    /// The stored detail behind the message (why it failed, what it waits for), in English
    /// whatever the language of the answer.
    pub reason: Option<String>,
    /// The submitter's group: jobs of one group take turns with other groups' jobs.
    pub group: Option<String>,
    /// While the job waits to be sent: why, in plain words ("Queued behind 2 earlier tasks of
    /// this set.", "Waiting for a free slot at openai (all 2 of its slots are in use).",
    /// "Held: today's budget of $0.40 is spent — raise it or wait until tomorrow …"); null
    /// otherwise.
    pub waiting_for: Option<String>,
    /// True while a budget holds the job back (it waits for the period to turn over): raising
    /// the budget (`PUT /v1/budget`) lets it go at once.
    pub held_by_budget: bool,
    /// For `unknown` tasks: how the provider bills, in plain words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub billing_note: Option<String>,
    /// For `unknown` tasks: the provider's page to look for the request on (or that it has
    /// none), and the details to match it by. Null otherwise.
    pub where_to_look: Option<super::task_help::WhereToLookJson>,
    /// For a `failed` task that a check stopped before anything was sent (nothing charged):
    /// what was wrong, the fix, and whether retrying unchanged can help. Null otherwise.
    pub refused_before_sending: Option<super::task_help::RefusedBeforeSendingJson>,
    /// What the call makes: `generate`, `edit` or `cutout`.
    #[schema(value_type = String, example = "generate")]
    pub operation: Operation,
    /// The image an `edit` or `cutout` works on: `{"artifact": ID}` or `{"upload": ID}`;
    /// `null` for a generation.
    #[schema(value_type = Option<Object>)]
    pub image: Option<Source>,
    /// The task that made `image` (when it is an image a task made and still stored).
    pub image_task: Option<String>,
    /// What was made from this task's images (edits and cutouts of them), oldest first: the
    /// image's lineage forward.
    pub derived: Vec<DerivedJson>,
}

/// A task made from another task's image.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct DerivedJson {
    pub id: String,
    #[schema(value_type = String)]
    pub operation: Operation,
    pub status: TaskStatus,
}

/// Why a job is held, and what sending it again may cost.
#[derive(Debug, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct HeldJson {
    /// Plain words: why it is held and what the owner is asked.
    pub reason: String,
    /// Held since (RFC 3339, UTC).
    pub since: String,
    /// What sending it again is estimated to cost (`null`: no price, or free).
    pub estimated_cost: Option<f64>,
    pub currency: Option<String>,
    /// What releasing it does, with the possible cost, in plain words.
    pub note: String,
}

/// The held object of a task, if it is held.
fn held_json(engine: &Engine, t: &TaskView, lang: Lang) -> Option<HeldJson> {
    let h = t.held.as_ref()?;
    let price = engine.price_of(&t.provider, &t.params);
    let note = if !engine.provider_bills(&t.provider) {
        word(lang, "note.held_free")
    } else {
        let about = about(lang, "money.about_paren", price.as_ref());
        tf(lang, "note.held_billed", &[("about", &about)])
    };
    Some(HeldJson {
        reason: render(lang, &h.reason),
        since: rfc3339(h.since),
        estimated_cost: price.as_ref().map(|(m, _)| from_micros(*m)),
        currency: price.map(|(_, c)| c),
        note,
    })
}

/// An artifact as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct ArtifactJson {
    pub id: String,
    pub sha256: String,
    pub bytes: i64,
    pub media_type: String,
    /// Where to download it: `/v1/artifacts/{id}`.
    pub url: String,
}

/// What the evidence says about money for a task (see `domain::Charge`).
#[derive(Debug, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct ChargeJson {
    /// `none`, `refused`, `possible` or `charged`: the heaviest of its requests.
    pub state: Charge,
    /// Requests that reached (or may have reached) the provider.
    pub requests: i64,
    /// The configured prices of its possibly charged and charged requests (`null`: no price).
    pub estimated_cost: Option<f64>,
    pub currency: Option<String>,
    /// The owner recorded the charge by hand (resolving an unknown with what the provider's
    /// dashboard showed): `state` is their record, not tally's evidence.
    pub recorded_by_hand: bool,
}

/// A task's latest retry.
#[derive(Debug, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct RetriedAsJson {
    pub id: String,
    pub status: TaskStatus,
}

/// Whether a task can be retried and what that may cost.
#[derive(Debug, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct RetryJson {
    /// True for `failed`, `unknown` and `canceled` tasks.
    pub allowed: bool,
    /// True exactly when a request of this task was possibly charged or charged: a retry
    /// must then acknowledge that generating again may be charged again.
    pub requires_cost_acknowledgement: bool,
    /// What one more request is estimated to cost (`null`: no price, or free).
    pub estimated_cost: Option<f64>,
    pub currency: Option<String>,
    pub note: String,
}

/// " (about $0.04)" (`key`: `money.about` or `money.about_paren`) in `lang`, or nothing
/// without a price.
fn about(lang: Lang, key: &str, price: Option<&(crate::domain::Micros, String)>) -> String {
    price.map(|(m, c)| tf(lang, key, &[("amount", &money(*m, c))])).unwrap_or_default()
}

fn retry_json(engine: &Engine, t: &TaskView, lang: Lang) -> RetryJson {
    let allowed = matches!(t.status, TaskStatus::Failed | TaskStatus::Unknown | TaskStatus::Canceled);
    let price = engine.price_of(&t.provider, &t.params);
    let about_plain = about(lang, "money.about", price.as_ref());
    let paren = about(lang, "money.about_paren", price.as_ref());
    let billed = engine.provider_bills(&t.provider);
    let state = t.charge.state;
    let note = if !allowed && t.status == TaskStatus::Succeeded {
        if billed {
            tf(lang, "note.succeeded_billed", &[("about", &about_plain)])
        } else {
            word(lang, "note.succeeded_free")
        }
    } else if !allowed {
        word(lang, "note.not_finished")
    } else if let Some((id, status)) = &t.retried_as {
        let name = match lang {
            Lang::En => status.as_str().to_string(),
            Lang::ZhCn => status_name(lang, *status),
        };
        let key = if status.is_settled() { "note.retried_settled" } else { "note.retried_live" };
        tf(lang, key, &[("id", id), ("status", &name)])
    } else if let Some(r) = super::task_help::refused_before_sending_in(t, lang).filter(|r| !r.retry_helps) {
        tf(lang, "note.refused", &[("problem", r.problem.trim_end_matches('.')), ("fix", &r.fix)])
    } else {
        match state {
            Charge::None => word(lang, "note.none"),
            Charge::Refused => tf(lang, "note.refused_charge", &[("about", &about_plain)]),
            Charge::Possible => tf(lang, "note.possible", &[("about", &paren)]),
            Charge::Charged => tf(lang, "note.charged", &[("about", &paren)]),
        }
    };
    RetryJson {
        allowed,
        requires_cost_acknowledgement: state.may_cost(),
        estimated_cost: price.as_ref().map(|(m, _)| from_micros(*m)),
        currency: price.map(|(_, c)| c),
        note,
    }
}

fn charge_json(engine: &Engine, t: &TaskView) -> ChargeJson {
    let c = &t.charge;
    ChargeJson {
        state: c.state,
        requests: c.requests,
        estimated_cost: c.cost_micros.map(from_micros),
        currency: c.currency.clone().or_else(|| engine.price_of(&t.provider, &t.params).map(|(_, cur)| cur)),
        recorded_by_hand: c.recorded_by_hand,
    }
}

fn artifact_json(a: &ArtifactView) -> ArtifactJson {
    ArtifactJson {
        id: a.id.clone(),
        sha256: a.sha256.clone(),
        bytes: a.bytes,
        media_type: a.media_type.clone(),
        url: format!("/v1/artifacts/{}", a.id),
    }
}

/// The API's view of a task, in the language of the request being answered (`api::lang`;
/// English outside a request).
pub fn task_json(engine: &Engine, t: &TaskView) -> TaskJson {
    task_json_in(engine, t, super::lang::request_lang())
}

/// The API's view of a task, its sentences in `lang`.
pub fn task_json_in(engine: &Engine, t: &TaskView, lang: Lang) -> TaskJson {
    TaskJson {
        id: t.id.clone(),
        status: t.status,
        message: status_message_in(lang, t.status, t.reason.as_deref(), t.cancel_requested, t.charge.state),
        attempts: t.attempts,
        provider: t.provider.clone(),
        prompt: t.prompt.clone(),
        params: t.params.clone(),
        idempotency_key: t.idempotency_key.clone(),
        created_at: rfc3339(t.created_at),
        updated_at: rfc3339(t.updated_at),
        artifacts: t.artifacts.iter().map(artifact_json).collect(),
        retry: retry_json(engine, t, lang),
        retry_of: t.retry_of.clone(),
        charge: charge_json(engine, t),
        retried_as: t.retried_as.as_ref().map(|(id, status)| RetriedAsJson { id: id.clone(), status: *status }),
        needs_attention: (t.status == TaskStatus::Unknown && t.retried_as.is_none()) || t.held.is_some(),
        held: held_json(engine, t, lang),
        set_id: t.set_id.clone(),
        shot_role: t.shot_role.clone(),
        shot_index: t.set_id.as_ref().and(t.set_position),
        candidate: t.set_id.as_ref().map(|_| t.candidate),
        cancel_requested: t.cancel_requested,
        failure_kind: t.failure_kind.clone(),
        reason: crate::domain::words::render_opt(Lang::En, t.reason.as_deref()),
        group: t.group.clone(),
        // What it waits for: where it stands in the dispatch order, else the stored reason
        // (a budget hold, a retry's backoff), so no surface has to guess.
        waiting_for: match t.status {
            TaskStatus::Queued | TaskStatus::Waiting => {
                let why = t.waiting_for.as_deref().or(t.reason.as_deref()).filter(|r| !r.trim().is_empty());
                why.map(|r| render(lang, r))
            }
            _ => None,
        },
        held_by_budget: t.budget_hold && matches!(t.status, TaskStatus::Queued | TaskStatus::Waiting),
        billing_note: if t.status == TaskStatus::Unknown {
            engine.billing_note(&t.provider).map(|n| render(lang, &n))
        } else {
            None
        },
        where_to_look: super::task_help::where_to_look(engine, t, lang),
        refused_before_sending: super::task_help::refused_before_sending_in(t, lang),
        operation: t.operation,
        image: t.source.clone(),
        image_task: t.source_task.clone(),
        derived: t
            .derived
            .iter()
            .map(|(id, operation, status)| DerivedJson { id: id.clone(), operation: *operation, status: *status })
            .collect(),
    }
}
