//! Drafts in the engine (issue #36): the checks on a new draft before anything is recorded or
//! sent (photos, marketplace, language, facts, a provider that drafts), the drafting call as a
//! task of operation `draft` (its price estimated with `max_output_tokens` as the ceiling),
//! what a stored draft says now ([`DraftState`]: its status and its current content, read from
//! its revisions through `domain::draft`'s validator), the owner's edits, redrafts, and the
//! set a confirmed revision makes. Nothing a draft says is acted on: only
//! [`Engine::confirm_draft`], called for the owner, creates anything.

use serde_json::json;

use super::{Engine, EngineError};
use crate::domain::TaskStatus;
use crate::domain::draft::{
    self, DraftBody, DraftInput, LANGUAGES, MARKETPLACES, MAX_OWNER_FACTS, MAX_PHOTOS, instructions,
};
use crate::domain::operation::Operation;
use crate::store::{
    AnswerView, ConfirmOutcome, DraftChange, DraftView, NewDraft, NewSet, NewShot, NewTask, SubmitOutcome, TaskView,
};

/// The longest product name a draft takes, in characters.
pub const MAX_PRODUCT_CHARS: usize = 200;

/// A new draft as the owner asks for it.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct DraftRequest {
    pub product: String,
    pub photos: Vec<String>,
    pub facts: Vec<(String, String)>,
    pub marketplace: Option<String>,
    pub language: String,
    /// `None`: the first configured provider that drafts.
    pub provider: Option<String>,
    pub idempotency_key: Option<String>,
}

/// What a drafting call would cost ([`Engine::draft_estimate`]).
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct DraftEstimate {
    pub provider: String,
    pub bills: bool,
    /// At the output ceiling, in millionths, and the currency; `None` without prices.
    pub price: Option<(crate::domain::Micros, String)>,
    pub input_tokens: u64,
    pub max_output_tokens: u64,
}

/// A draft's status, from its latest revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DraftStatus {
    /// The drafting call is queued, waiting or running.
    Drafting,
    /// The latest revision holds a plan the owner can edit and confirm.
    Ready,
    /// The drafting call failed (an invalid answer included: charged, and kept).
    Failed,
    /// Nothing can prove whether the drafting call ran: it is never resent on its own.
    Unknown,
    /// The drafting call was canceled before it was sent.
    Canceled,
    /// A revision was confirmed and its set created.
    Confirmed,
}

/// What a stored draft says now.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct DraftState<'a> {
    pub status: DraftStatus,
    /// The latest revision's number.
    pub revision: i64,
    /// The current plan: the latest revision's, or while a redraft runs or after it failed,
    /// the newest earlier one's.
    pub body: Option<DraftBody>,
    /// The latest drafting task, if any revision has one.
    pub task: Option<&'a TaskView>,
    /// The latest drafting task's stored answer.
    pub answer: Option<&'a AnswerView>,
    /// Why the latest revision holds no plan, in plain words.
    pub problem: Option<String>,
}

/// The plan revision `r` of `d` holds, or why it holds none.
fn content(d: &DraftView, r: &crate::store::RevisionView) -> Result<DraftBody, String> {
    if let Some(body) = &r.body {
        return serde_json::from_str(body).map_err(|e| format!("revision {} cannot be read: {e}", r.revision));
    }
    match &r.answer {
        Some(a) if a.valid => draft::parse_answer(&a.body, &d.language)
            .map(|b| draft::with_owner_facts(b, &d.facts))
            .map_err(|e| format!("the answer of revision {} cannot be read: {e}", r.revision)),
        Some(_) => Err("the provider's answer does not match tally's draft schema (it is kept)".into()),
        None => Err("no answer yet".into()),
    }
}

/// What `d` says now (see [`DraftState`]).
pub fn state(d: &DraftView) -> DraftState<'_> {
    let latest = d.revisions.last();
    let with_task = d.revisions.iter().rev().find(|r| r.task.is_some());
    let task = with_task.and_then(|r| r.task.as_ref());
    let answer = with_task.and_then(|r| r.answer.as_ref());
    let body = d.revisions.iter().rev().find_map(|r| content(d, r).ok());
    let (status, problem) = match latest {
        None => (DraftStatus::Failed, Some("the draft has no revision".to_string())),
        Some(r) => match (content(d, r), &r.task) {
            (Ok(_), _) => (DraftStatus::Ready, None),
            (Err(e), Some(t)) => match t.status {
                TaskStatus::Queued | TaskStatus::Waiting | TaskStatus::Running => (DraftStatus::Drafting, None),
                TaskStatus::Unknown => (DraftStatus::Unknown, t.reason.clone()),
                TaskStatus::Canceled => (DraftStatus::Canceled, t.reason.clone()),
                TaskStatus::Failed => (DraftStatus::Failed, t.reason.clone().or(Some(e))),
                TaskStatus::Succeeded => (DraftStatus::Failed, Some(e)),
            },
            (Err(e), None) => (DraftStatus::Failed, Some(e)),
        },
    };
    let status = if d.set_id.is_some() { DraftStatus::Confirmed } else { status };
    DraftState { status, revision: latest.map_or(0, |r| r.revision), body, task, answer, problem }
}

/// The owner's change to the current plan (`PATCH /v1/drafts/{id}`): whole sections replace
/// the current ones; `answers` answer questions by id.
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct DraftEdit {
    pub facts: Option<Vec<draft::Fact>>,
    pub shots: Option<Vec<draft::Shot>>,
    pub copy: Option<draft::Copy>,
    pub answers: Vec<(String, String)>,
}

/// The outcome of an edit, a redraft or a confirmation that did not make a revision or a set.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Refused {
    NotFound,
    /// The revision named is not the latest.
    Stale {
        latest: i64,
    },
    /// The draft was confirmed: its set.
    Confirmed(String),
    /// The latest revision holds no plan (still drafting, failed, unknown).
    NoPlan(String),
}

impl Engine {
    /// The provider `name` offers drafting, or (with `None`) the first configured one that
    /// does.
    fn drafting_provider(&self, name: Option<&str>) -> Result<String, EngineError> {
        if let Some(n) = name {
            return Ok(n.to_string());
        }
        let mut names = self.provider_names();
        names.retain(|n| self.shared.providers.get(n).is_some_and(|p| p.operations.contains(&Operation::Draft)));
        names.into_iter().next().ok_or_else(|| {
            EngineError::Invalid(
                "no configured provider drafts (GET /v1/providers lists each one's operations; the \
                 demo provider drafts for free); nothing was recorded or sent"
                    .into(),
            )
        })
    }

    /// The drafting call for `input` with `photos` photos, on `provider`.
    fn drafting_task(&self, provider: &str, input: &DraftInput, photos: usize) -> NewTask {
        let prompt = instructions(input);
        let max_output = self
            .shared
            .providers
            .get(provider)
            .and_then(|p| p.config.as_ref().map(|c| c.max_output_tokens))
            .unwrap_or(crate::providers::settings::DEFAULT_MAX_OUTPUT_TOKENS);
        let params = json!({
            "draft": input,
            "max_output_tokens": max_output,
            "input_tokens": draft::estimate_input_tokens(&prompt, photos),
        });
        NewTask { provider: provider.to_string(), prompt, params, operation: Operation::Draft, ..NewTask::default() }
    }

    /// What a new drafting call would cost before anything is uploaded or sent: its provider
    /// (`provider`, else the first that drafts), whether that provider bills, the price at the
    /// output ceiling (`None` when its prices are not configured) and the tokens counted. The
    /// same estimate a created draft's call is priced with (one formula, here).
    pub fn draft_estimate(
        &self,
        provider: Option<&str>,
        input: &DraftInput,
        photos: usize,
    ) -> Result<DraftEstimate, EngineError> {
        let provider = self.drafting_provider(provider)?;
        let Some(p) = self.shared.providers.get(&provider) else {
            return Err(EngineError::Invalid(format!("provider `{provider}` is not configured")));
        };
        if !p.operations.contains(&Operation::Draft) {
            return Err(EngineError::Invalid(format!("provider `{provider}` does not draft")));
        }
        let task = self.drafting_task(&provider, input, photos);
        let n = |k: &str| task.params[k].as_u64().unwrap_or(0);
        Ok(DraftEstimate {
            bills: self.provider_bills(&provider),
            price: self.price_of(&provider, &task.params),
            input_tokens: n("input_tokens"),
            max_output_tokens: n("max_output_tokens"),
            provider,
        })
    }

    /// The estimated price of a drafting call for `d` (its provider's tokens at the ceiling).
    pub fn redraft_price(&self, d: &DraftView) -> Option<(crate::domain::Micros, String)> {
        let t = self.drafting_task(&d.provider, &redraft_input(d), d.photos.len());
        self.price_of(&d.provider, &t.params)
    }

    /// Check a new draft and store it with its drafting call (one transaction), then wake
    /// the dispatcher. Every refusal is made before anything is recorded or sent.
    pub async fn create_draft(&self, r: DraftRequest) -> Result<SubmitOutcome, EngineError> {
        super::intake::validate_key(r.idempotency_key.as_deref())?;
        let invalid = |m: String| Err(EngineError::Invalid(format!("{m}; nothing was recorded or sent")));
        let product = r.product.trim().to_string();
        if product.is_empty() || product.chars().count() > MAX_PRODUCT_CHARS {
            return invalid(format!("the product name must be 1 to {MAX_PRODUCT_CHARS} characters"));
        }
        if r.photos.is_empty() || r.photos.len() > MAX_PHOTOS {
            return invalid(format!("a draft takes 1 to {MAX_PHOTOS} photos, not {}", r.photos.len()));
        }
        if let Some(m) = r.marketplace.as_deref().filter(|m| !MARKETPLACES.contains(m)) {
            return invalid(format!("marketplace `{m}` is not one of {}", MARKETPLACES.join(", ")));
        }
        if !LANGUAGES.contains(&r.language.as_str()) {
            return invalid(format!("language `{}` is not one of {}", r.language, LANGUAGES.join(", ")));
        }
        if r.facts.len() > MAX_OWNER_FACTS {
            return invalid(format!("at most {MAX_OWNER_FACTS} facts"));
        }
        for (k, v) in &r.facts {
            let ok = |s: &str, max: usize| {
                !s.trim().is_empty() && s.chars().count() <= max && !s.chars().any(char::is_control)
            };
            if !ok(k, 60) || !ok(v, draft::SHORT) {
                return invalid(format!(
                    "the fact `{k}` must have a key of 1 to 60 characters and a value of 1 to 300"
                ));
            }
        }
        for (i, id) in r.photos.iter().enumerate() {
            self.check_photo(i, id).await?;
        }
        let provider = self.drafting_provider(r.provider.as_deref())?;
        let input = DraftInput {
            product: product.clone(),
            facts: r.facts.clone(),
            marketplace: r.marketplace.clone(),
            language: r.language.clone(),
            answers: Vec::new(),
        };
        let task = self.drafting_task(&provider, &input, r.photos.len());
        self.validate(&task)?;
        let new = NewDraft {
            product,
            photos: r.photos,
            facts: r.facts,
            marketplace: r.marketplace,
            language: r.language,
            provider,
            idempotency_key: r.idempotency_key,
            task,
        };
        let out = self.shared.store.create_draft(new, self.shared.now()).await?;
        if matches!(out, SubmitOutcome::Created(_)) {
            // Committed, the owner not answered yet: the same crash point as a task's submit.
            crate::failpoint::crash("after-submit");
            self.shared.wake_dispatcher.notify_one();
        }
        Ok(out)
    }

    /// Photo `i` exists and its header can be read as an image (an unreadable photo is refused
    /// before anything is sent).
    async fn check_photo(&self, i: usize, id: &str) -> Result<(), EngineError> {
        let bytes = self.shared.store.read_image_bytes(id.to_string()).await?;
        let Some((_, bytes)) = bytes else {
            return Err(EngineError::Invalid(format!(
                "photo {}: there is no upload with the id {id}; upload it first (POST /v1/uploads); nothing was \
                 recorded or sent",
                i + 1
            )));
        };
        let readable = image::ImageReader::new(std::io::Cursor::new(&bytes))
            .with_guessed_format()
            .ok()
            .and_then(|r| r.into_dimensions().ok())
            .is_some_and(|(w, h)| w > 0 && h > 0);
        if !readable {
            return Err(EngineError::Invalid(format!(
                "photo {} ({id}) cannot be read as an image; nothing was recorded or sent",
                i + 1
            )));
        }
        Ok(())
    }

    /// The owner's edit of revision `base` (the latest): a new revision holding the current
    /// plan with the edit applied, checked by the same validator as a model's answer.
    pub async fn edit_draft(&self, id: &str, base: i64, edit: DraftEdit) -> Result<Result<i64, Refused>, EngineError> {
        let Some(d) = self.shared.store.get_draft(id.to_string()).await? else { return Ok(Err(Refused::NotFound)) };
        let st = state(&d);
        if let Some(set) = &d.set_id {
            return Ok(Err(Refused::Confirmed(set.clone())));
        }
        if base != st.revision {
            return Ok(Err(Refused::Stale { latest: st.revision }));
        }
        let Some(mut body) = st.body else {
            return Ok(Err(Refused::NoPlan(st.problem.unwrap_or_else(|| "the draft holds no plan yet".into()))));
        };
        if let Some(f) = edit.facts {
            body.facts = f;
        }
        if let Some(s) = edit.shots {
            body.shots = s;
        }
        if let Some(c) = edit.copy {
            body.copy = c;
        }
        for (q, a) in edit.answers {
            let Some(question) = body.questions.iter_mut().find(|x| x.id == q) else {
                return Err(EngineError::Invalid(format!("the draft asks no question `{q}`")));
            };
            question.answer = Some(a);
        }
        draft::validate(&body, &d.language).map_err(EngineError::Invalid)?;
        let json = serde_json::to_string(&body).map_err(|e| EngineError::Invalid(e.to_string()))?;
        Ok(change(self.shared.store.revise_draft(id.into(), base, Some(json), None, self.shared.now()).await?))
    }

    /// Ask the model again from revision `base` (the latest): the owner's facts, the facts
    /// they confirmed and their answers, as a new drafting call (a new revision). Whether the
    /// owner accepted its price is the API's to check first.
    pub async fn redraft(&self, id: &str, base: i64) -> Result<Result<i64, Refused>, EngineError> {
        let Some(d) = self.shared.store.get_draft(id.to_string()).await? else { return Ok(Err(Refused::NotFound)) };
        let task = self.drafting_task(&d.provider, &redraft_input(&d), d.photos.len());
        self.validate(&task)?;
        let out = change(self.shared.store.revise_draft(id.into(), base, None, Some(task), self.shared.now()).await?);
        if out.is_ok() {
            self.shared.wake_dispatcher.notify_one();
        }
        Ok(out)
    }

    /// The set revision `revision` of `d` would make, on `provider` (the draft's own when it
    /// generates images, else the default), checked as a new set is.
    pub fn draft_set(
        &self,
        d: &DraftView,
        revision: i64,
        provider: Option<&str>,
        default: &str,
    ) -> Result<Result<NewSet, Refused>, EngineError> {
        let st = state(d);
        if let Some(set) = &d.set_id {
            return Ok(Err(Refused::Confirmed(set.clone())));
        }
        if revision != st.revision {
            return Ok(Err(Refused::Stale { latest: st.revision }));
        }
        let body = match (st.status, st.body) {
            (DraftStatus::Ready, Some(b)) => b,
            _ => {
                return Ok(Err(Refused::NoPlan(
                    st.problem.unwrap_or_else(|| "the latest revision holds no plan yet".into()),
                )));
            }
        };
        let own = self.shared.providers.get(&d.provider).is_some_and(|p| p.operations.contains(&Operation::Generate));
        let provider =
            provider.map(str::to_string).unwrap_or_else(|| if own { d.provider.clone() } else { default.into() });
        let set = NewSet {
            product: d.product.clone(),
            style: None,
            provider,
            references: d.photos.iter().map(|p| p.id.clone()).collect(),
            shots: body
                .shots
                .iter()
                .map(|s| NewShot {
                    role: s.role.clone(),
                    prompt: s.prompt.clone(),
                    params: json!({}),
                    candidates: u32::try_from(s.candidates).unwrap_or(1),
                    source: s.source.as_ref().and_then(|src| src.to_source().ok()),
                    provider: None,
                    overlay: s.overlay.clone(),
                })
                .collect(),
            idempotency_key: None,
        };
        let mut set = set;
        self.place_cutouts(&mut set)?;
        self.check_set(&set)?;
        Ok(Ok(set))
    }

    /// Confirm revision `revision` of draft `id` with `set` ([`Engine::draft_set`]): the set is
    /// created and linked in one transaction, then its first shot is dispatched. A draft
    /// confirmed before answers its set.
    pub async fn confirm_draft(&self, id: &str, revision: i64, set: NewSet) -> Result<ConfirmOutcome, EngineError> {
        let out = self.shared.store.confirm_draft(id.into(), revision, set, self.shared.now()).await?;
        crate::failpoint::crash("after-confirm");
        if matches!(out, ConfirmOutcome::Set { created: true, .. }) {
            self.shared.wake_dispatcher.notify_one();
        }
        Ok(out)
    }
}

/// A redraft's input: the owner's facts, the facts they confirmed in the current plan, and
/// their answers to its questions.
fn redraft_input(d: &DraftView) -> DraftInput {
    let body = state(d).body;
    let mut facts = d.facts.clone();
    let mut answers = Vec::new();
    if let Some(b) = &body {
        for f in b.facts.iter().filter(|f| f.confirmed || f.source == "owner") {
            if !facts.iter().any(|(k, _)| *k == f.key) && facts.len() < MAX_OWNER_FACTS {
                facts.push((f.key.clone(), f.value.clone()));
            }
        }
        answers = b.questions.iter().filter_map(|q| q.answer.clone().map(|a| (q.id.clone(), a))).collect();
    }
    DraftInput {
        product: d.product.clone(),
        facts,
        marketplace: d.marketplace.clone(),
        language: d.language.clone(),
        answers,
    }
}

fn change(c: DraftChange) -> Result<i64, Refused> {
    match c {
        DraftChange::Revised(n) => Ok(n),
        DraftChange::NotFound => Err(Refused::NotFound),
        DraftChange::Stale { latest } => Err(Refused::Stale { latest }),
        DraftChange::Confirmed(s) => Err(Refused::Confirmed(s)),
    }
}
