//! Draft routes (issue #36): `/v1/drafts` — a plan drafted from the product's photos by a
//! provider that drafts, its revisions (a stale one refused with 409), a redraft (a new paid
//! call, its price first), and the confirmation of one revision, the only step that creates
//! anything: the image set, in one transaction (its estimated cost in a 409 until
//! `acknowledge_possible_charge`; confirming twice answers the same set).

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ErrorBody};
use super::openapi::{JsonRejected, NotFound, StoreFailure};
use super::sets::{SetJson, load, set_json};
use super::tasks::{ChargeJson, IdempotencyKey, idempotency_key, next_cursor, page_limit, task_json};
use super::{AppState, JsonBody, json_response};
use crate::clock::rfc3339;
use crate::domain::draft::{Copy, Fact, Question, Shot};
use crate::domain::{from_micros, money};
use crate::engine::drafts::{DraftEdit, DraftRequest, DraftStatus, Refused, state};
use crate::store::{ConfirmOutcome, DraftView, SubmitOutcome};

/// A draft's usage and price as the provider reported them.
#[derive(Debug, Serialize, ToSchema)]
pub struct DraftChargeJson {
    /// The latest drafting call's charge evidence (`state`: none, possible, charged).
    #[serde(flatten)]
    pub charge: ChargeJson,
    /// The tokens the latest answer used, as the provider reported them (null before one).
    #[schema(value_type = Option<Object>)]
    pub usage: Option<Value>,
}

/// One revision in a draft's history.
#[derive(Debug, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct RevisionJson {
    pub revision: i64,
    /// `model` (a drafting call's answer) or `owner` (an edit).
    pub by: &'static str,
    /// The drafting call of a model's revision.
    pub task_id: Option<String>,
    pub created_at: String,
}

/// A draft as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct DraftJson {
    pub id: String,
    pub status: DraftStatus,
    /// The latest revision: what an edit, redraft or confirm names.
    pub revision: i64,
    pub product: String,
    /// Upload ids, in order.
    pub photos: Vec<String>,
    pub marketplace: Option<String>,
    pub language: String,
    pub provider: String,
    pub facts: Vec<Fact>,
    pub shots: Vec<Shot>,
    pub copy: Option<Copy>,
    pub questions: Vec<Question>,
    pub charge: Option<DraftChargeJson>,
    /// The set its confirmation made.
    pub set_id: Option<String>,
    pub confirmed_revision: Option<i64>,
    /// Why the latest revision holds no plan, in plain words.
    pub message: Option<String>,
    /// The provider's answer exactly as it came, when it did not match tally's schema
    /// (Technical details): kept, never fixed, never sent again.
    pub raw_answer: Option<String>,
    /// The latest drafting call (a task of operation `draft`).
    pub task_id: Option<String>,
    /// What drafting again would cost at most (the provider's prices at its output ceiling):
    /// `{"amount", "currency"}`; null when the provider does not bill or has no prices.
    #[schema(value_type = Option<Object>)]
    pub redraft_estimated_cost: Option<Value>,
    pub revisions: Vec<RevisionJson>,
    pub created_at: String,
    pub updated_at: String,
}

/// An estimated amount as the API says it: `{"amount", "currency"}`.
fn cost_json(micros: crate::domain::Micros, currency: &str) -> Value {
    json!({"amount": from_micros(micros), "currency": currency})
}

/// The API's view of a draft.
pub fn draft_json(state_: &AppState, d: &DraftView) -> DraftJson {
    let st = state(d);
    let body = st.body.clone();
    let charge = st.task.map(|t| DraftChargeJson {
        charge: task_json(state_.engine(), t).charge,
        usage: st.answer.and_then(|a| serde_json::from_str(&a.usage).ok()),
    });
    DraftJson {
        id: d.id.clone(),
        status: st.status,
        revision: st.revision,
        product: d.product.clone(),
        photos: d.photos.iter().map(|p| p.id.clone()).collect(),
        marketplace: d.marketplace.clone(),
        language: d.language.clone(),
        provider: d.provider.clone(),
        facts: body.as_ref().map(|b| b.facts.clone()).unwrap_or_default(),
        shots: body.as_ref().map(|b| b.shots.clone()).unwrap_or_default(),
        copy: body.as_ref().map(|b| b.copy.clone()),
        questions: body.map(|b| b.questions).unwrap_or_default(),
        charge,
        set_id: d.set_id.clone(),
        confirmed_revision: d.confirmed_revision,
        message: crate::domain::words::render_opt(super::lang::request_lang(), st.problem.as_deref()),
        raw_answer: st.answer.filter(|a| !a.valid).map(|a| a.body.clone()),
        task_id: st.task.map(|t| t.id.clone()),
        redraft_estimated_cost: state_
            .engine()
            .provider_bills(&d.provider)
            .then(|| state_.engine().redraft_price(d))
            .flatten()
            .map(|(m, c)| cost_json(m, &c)),
        revisions: d
            .revisions
            .iter()
            .map(|r| RevisionJson {
                revision: r.revision,
                by: if r.body.is_some() { "owner" } else { "model" },
                task_id: r.task.as_ref().map(|t| t.id.clone()),
                created_at: rfc3339(r.created_at),
            })
            .collect(),
        created_at: rfc3339(d.created_at),
        updated_at: rfc3339(d.updated_at),
    }
}

async fn load_draft(state: &AppState, id: &str) -> Result<DraftView, ApiError> {
    state.engine().store().get_draft(id.to_string()).await?.ok_or_else(|| ApiError::not_found("draft"))
}

/// `POST /v1/drafts` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DraftBodyJson {
    /// The product's name (1 to 200 characters).
    #[schema(min_length = 1)]
    pub product: String,
    /// 1 to 6 upload ids (`POST /v1/uploads`).
    #[serde(default)]
    pub photos: Vec<String>,
    /// The owner's facts (material, size, colour, price, selling points, audience): kept as
    /// the owner's, confirmed.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub facts: serde_json::Map<String, Value>,
    /// `taobao`, `tmall`, `jd`, `pinduoduo`, `amazon`, `shopify`, `etsy`, or none.
    pub marketplace: Option<String>,
    /// The copy's language: `zh-CN` or `en` (default `en`).
    pub language: Option<String>,
    /// A configured provider that drafts; the first one when absent.
    pub provider: Option<String>,
    /// Makes resending this request safe (or the `Idempotency-Key` header).
    #[schema(min_length = 1)]
    pub idempotency_key: Option<String>,
}

/// `POST /v1/drafts`: 202 with the draft (its drafting call queued), 200 for a replay of the
/// same key; 422 before anything is recorded or sent for no photo, more than six, an
/// unreadable one, or a marketplace or language tally does not know.
#[utoipa::path(
    post,
    path = "/drafts",
    operation_id = "create_draft",
    tag = "drafts",
    params(IdempotencyKey),
    request_body = DraftBodyJson,
    responses(
        (status = 202, description = "A new draft; its drafting call is queued.", body = DraftJson),
        (status = 200, description = "The draft this idempotency key made, for the same request.", body = DraftJson),
        (status = 409, description = "The idempotency key was used for a different draft (`idempotency_conflict`).",
            body = ErrorBody),
        JsonRejected,
        StoreFailure,
    )
)]
pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<DraftBodyJson>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers, body.idempotency_key)?;
    let facts = owner_facts(body.facts);
    let req = DraftRequest {
        product: body.product,
        photos: body.photos,
        facts,
        marketplace: body.marketplace.filter(|m| !m.is_empty()),
        language: body.language.unwrap_or_else(|| "en".into()),
        provider: body.provider,
        idempotency_key: key,
    };
    let (status, id) = match state.engine().create_draft(req).await? {
        SubmitOutcome::Created(id) => (StatusCode::ACCEPTED, id),
        SubmitOutcome::Existing(id) => (StatusCode::OK, id),
        SubmitOutcome::Conflict(id) => {
            return Err(ApiError::conflict(
                "idempotency_conflict",
                crate::domain::words::say_with("say.error_idem_draft", &[("id", &id)]),
            ));
        }
    };
    let d = load_draft(&state, &id).await?;
    Ok(json_response(status, &draft_json(&state, &d)))
}

/// The owner's facts as text, in the order given (a number or a list is written as JSON).
fn owner_facts(facts: serde_json::Map<String, Value>) -> Vec<(String, String)> {
    facts
        .into_iter()
        .map(|(k, v)| {
            let v = match v {
                Value::String(s) => s,
                other => other.to_string(),
            };
            (k, v)
        })
        .collect()
}

/// `POST /v1/drafts/estimate` body: what a draft would be made from (nothing is uploaded,
/// recorded or sent).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct EstimateBody {
    /// The product's name as typed so far.
    #[serde(default)]
    pub product: String,
    /// How many photos will be sent: 1 to 6 (1 when absent).
    #[schema(minimum = 1, maximum = 6)]
    #[serde(default, deserialize_with = "super::whole_number")]
    pub photo_count: Option<i64>,
    /// The owner's facts, as for `POST /v1/drafts`.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub facts: serde_json::Map<String, Value>,
    pub marketplace: Option<String>,
    /// `zh-CN` or `en` (default `en`).
    pub language: Option<String>,
    /// A configured provider that drafts; the first one when absent.
    pub provider: Option<String>,
}

/// What a drafting call would cost.
#[derive(Debug, Serialize, ToSchema)]
pub struct EstimateJson {
    /// The provider that would draft.
    pub provider: String,
    /// Whether it bills (false for `demo`).
    pub billable: bool,
    /// At most this (the provider's prices at its output ceiling): `{"amount", "currency"}`;
    /// null when it does not bill or its prices are not configured.
    #[schema(value_type = Option<Object>)]
    pub estimated_cost: Option<Value>,
    /// Input tokens counted for the request (its words, and a ceiling per photo).
    pub input_tokens: u64,
    /// The output ceiling the price assumes (`max_output_tokens`).
    pub max_output_tokens: u64,
}

/// `POST /v1/drafts/estimate`: the most a new draft's call would cost, before anything is
/// uploaded, recorded or sent — the same estimate the created draft's call is priced with.
#[utoipa::path(
    post,
    path = "/drafts/estimate",
    operation_id = "estimate_draft",
    tag = "drafts",
    request_body = EstimateBody,
    responses(
        (status = 200, description = "The estimate.", body = EstimateJson),
        (status = 422, description = "No provider drafts, or the one named does not (`invalid_request`).",
            body = ErrorBody),
        JsonRejected,
    )
)]
pub async fn estimate(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<EstimateBody>,
) -> Result<Response, ApiError> {
    let photos = body.photo_count.unwrap_or(1);
    let max = crate::domain::draft::MAX_PHOTOS as i64;
    if !(1..=max).contains(&photos) {
        return Err(ApiError::invalid(format!("photo_count must be 1 to {max}, not {photos}")));
    }
    let input = crate::domain::draft::DraftInput {
        product: body.product.trim().to_string(),
        facts: owner_facts(body.facts),
        marketplace: body.marketplace.filter(|m| !m.is_empty()),
        language: body.language.unwrap_or_else(|| "en".into()),
        answers: Vec::new(),
    };
    let e =
        state.engine().draft_estimate(body.provider.as_deref().filter(|p| !p.is_empty()), &input, photos as usize)?;
    let cost = e.price.filter(|_| e.bills).map(|(m, c)| cost_json(m, &c));
    let out = EstimateJson {
        provider: e.provider,
        billable: e.bills,
        estimated_cost: cost,
        input_tokens: e.input_tokens,
        max_output_tokens: e.max_output_tokens,
    };
    Ok(json_response(StatusCode::OK, &out))
}

/// The `{id}` of a draft in a path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct DraftId {
    /// A draft's id (from `POST /v1/drafts`).
    #[allow(dead_code)]
    id: String,
}

/// `GET /v1/drafts/{id}`.
#[utoipa::path(
    get,
    path = "/drafts/{id}",
    operation_id = "get_draft",
    tag = "drafts",
    params(DraftId),
    responses((status = 200, description = "The draft.", body = DraftJson), NotFound, StoreFailure)
)]
pub async fn get_one(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let d = load_draft(&state, &id).await?;
    Ok(json_response(StatusCode::OK, &draft_json(&state, &d)))
}

/// `GET /v1/drafts` query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// A draft id (a page's `next`): list drafts created before it.
    pub before: Option<String>,
    /// The page size: 1 to 500 (larger values give 500); 20 when absent.
    #[param(minimum = 1, value_type = Option<u64>)]
    #[serde(default, deserialize_with = "crate::api::any_count")]
    pub limit: Option<usize>,
}

/// One page of `GET /v1/drafts`.
#[derive(Debug, Serialize, ToSchema)]
pub struct DraftList {
    /// Newest first.
    pub drafts: Vec<DraftJson>,
    /// The `before` of the next page; null on the last page.
    pub next: Option<String>,
}

/// `GET /v1/drafts?before=&limit=`: newest first.
#[utoipa::path(
    get,
    path = "/drafts",
    operation_id = "list_drafts",
    tag = "drafts",
    params(ListQuery),
    responses(
        (status = 200, description = "One page of drafts, newest first.", body = DraftList),
        (status = 400, description = "A bad query string (`bad_request`).", body = ErrorBody),
        StoreFailure,
    )
)]
pub async fn list(
    State(state): State<AppState>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query?;
    let limit = page_limit(q.limit, 20)?;
    let mut rows = state.engine().store().list_drafts(q.before.filter(|b| !b.is_empty()), limit + 1).await?;
    let next = next_cursor(&mut rows, limit, |d| &d.id);
    let drafts = rows.iter().map(|d| draft_json(&state, d)).collect();
    Ok(json_response(StatusCode::OK, &DraftList { drafts, next }))
}

/// A refusal of an edit, redraft or confirmation, as an API error.
fn refused(r: Refused) -> ApiError {
    match r {
        Refused::NotFound => ApiError::not_found("draft"),
        Refused::Stale { latest } => ApiError::conflict(
            "stale_revision",
            format!(
                "this is not the draft's latest revision ({latest}); read the draft again and make the change on it"
            ),
        ),
        Refused::Confirmed(set) => {
            ApiError::conflict("draft_confirmed", format!("the draft was confirmed; its set is {set}"))
        }
        Refused::NoPlan(why) => ApiError::conflict("draft_not_ready", format!("the draft holds no plan to use: {why}")),
    }
}

/// `PATCH /v1/drafts/{id}` body: whole sections replace the current ones.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct EditBody {
    /// The revision the edit was made on: the latest, or 409.
    pub revision: i64,
    pub facts: Option<Vec<Fact>>,
    pub shots: Option<Vec<Shot>>,
    pub copy: Option<Copy>,
    /// Answers to the draft's questions, by question id, each as text.
    #[serde(default)]
    #[schema(value_type = std::collections::HashMap<String, String>)]
    pub answers: serde_json::Map<String, Value>,
}

/// `PATCH /v1/drafts/{id}`: a new revision (validated like a model's answer). Besides the
/// document's shape, a 422 names a rule that needs the draft itself or spans fields: the copy
/// in the draft's language, every fact the copy names held by the draft, each text without
/// control characters and not blank, the shots' count and each shot's candidates in range.
#[utoipa::path(
    patch,
    path = "/drafts/{id}",
    operation_id = "edit_draft",
    tag = "drafts",
    params(DraftId),
    request_body = EditBody,
    responses(
        (status = 200, description = "The draft at its new revision.", body = DraftJson),
        NotFound,
        (status = 409, description = "A stale revision (`stale_revision`), a confirmed draft (`draft_confirmed`), \
            or no plan yet (`draft_not_ready`).", body = ErrorBody),
        JsonRejected,
        StoreFailure,
    )
)]
pub async fn edit(
    State(state): State<AppState>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<EditBody>,
) -> Result<Response, ApiError> {
    let answers = body
        .answers
        .into_iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k, s)),
            _ => Err(ApiError::invalid(format!("the answer to `{k}` must be text"))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let edit = DraftEdit { facts: body.facts, shots: body.shots, copy: body.copy, answers };
    state.engine().edit_draft(&id, body.revision, edit).await?.map_err(refused)?;
    let d = load_draft(&state, &id).await?;
    Ok(json_response(StatusCode::OK, &draft_json(&state, &d)))
}

/// `POST /v1/drafts/{id}/redraft` and `…/confirm` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RevisionBody {
    /// The latest revision, or 409.
    pub revision: i64,
    /// Required (true) when the call or the set is charged (the 409 says about how much).
    #[serde(default)]
    pub acknowledge_possible_charge: bool,
    /// Confirm only: the provider that generates the set's images (the draft's own when it
    /// generates, else the default provider).
    pub provider: Option<String>,
}

fn ack_required(what: String, total: Option<(i64, String)>, extra: Value) -> ApiError {
    let about = match &total {
        Some((m, c)) => format!(" (about {})", money(*m, c)),
        None => String::new(),
    };
    let mut e = ApiError::conflict(
        "cost_acknowledgement_required",
        format!("{what}{about}; send {{\"acknowledge_possible_charge\": true}} to go ahead."),
    );
    let mut cost = json!({
        "amount": total.as_ref().map(|(m, _)| from_micros(*m)),
        "currency": total.map(|(_, c)| c),
    });
    if let (Some(c), Value::Object(x)) = (cost.as_object_mut(), extra) {
        c.extend(x);
    }
    e.estimated_cost = Some(cost);
    e
}

/// `POST /v1/drafts/{id}/redraft`: ask the model again with the owner's facts and answers —
/// a new paid call, whose estimated price is the 409 until it is acknowledged.
#[utoipa::path(
    post,
    path = "/drafts/{id}/redraft",
    operation_id = "redraft",
    tag = "drafts",
    params(DraftId),
    request_body = RevisionBody,
    responses(
        (status = 202, description = "The draft at its new revision; the drafting call is queued.", body = DraftJson),
        NotFound,
        (status = 409, description = "The provider bills and the body does not acknowledge it \
            (`cost_acknowledgement_required`, with `estimated_cost`), or a stale revision.", body = ErrorBody),
        JsonRejected,
        StoreFailure,
    )
)]
pub async fn redraft(
    State(state): State<AppState>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<RevisionBody>,
) -> Result<Response, ApiError> {
    let engine = state.engine();
    let d = load_draft(&state, &id).await?;
    if engine.provider_bills(&d.provider) && !body.acknowledge_possible_charge {
        let what =
            format!("provider `{}` charges for each drafting call by its tokens: this is a new call", d.provider);
        return Err(ack_required(what, engine.redraft_price(&d), json!({})));
    }
    engine.redraft(&id, body.revision).await?.map_err(refused)?;
    let d = load_draft(&state, &id).await?;
    Ok(json_response(StatusCode::ACCEPTED, &draft_json(&state, &d)))
}

/// What a confirmation answers: the set and the draft.
#[derive(Debug, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct ConfirmedJson {
    pub set_id: String,
    pub set: SetJson,
    pub draft: DraftJson,
}

/// `POST /v1/drafts/{id}/confirm`: the owner's decision. Creates the image set of the named
/// (latest) revision in one transaction — its shots, candidates and photos as drafted — and
/// only then is anything generated. Confirming again answers the same set.
#[utoipa::path(
    post,
    path = "/drafts/{id}/confirm",
    operation_id = "confirm_draft",
    tag = "drafts",
    params(DraftId),
    request_body = RevisionBody,
    responses(
        (status = 201, description = "The set, created; its first shot is queued.", body = ConfirmedJson),
        (status = 200, description = "The set an earlier confirmation made.", body = ConfirmedJson),
        NotFound,
        (status = 409, description = "The set's provider bills and the body does not acknowledge it \
            (`cost_acknowledgement_required`, with `estimated_cost`), a stale revision, or no plan yet.",
            body = ErrorBody),
        JsonRejected,
        StoreFailure,
    )
)]
pub async fn confirm(
    State(state): State<AppState>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<RevisionBody>,
) -> Result<Response, ApiError> {
    let engine = state.engine();
    let d = load_draft(&state, &id).await?;
    let set = match engine.draft_set(&d, body.revision, body.provider.as_deref(), state.default_provider())? {
        Ok(set) => set,
        Err(Refused::Confirmed(set)) => return confirmed(&state, &id, &set, StatusCode::OK).await,
        Err(r) => return Err(refused(r)),
    };
    if engine.provider_bills(&set.provider) && !body.acknowledge_possible_charge {
        let images: u32 = set.shots.iter().map(|s| s.candidates.max(1)).sum();
        let mut total: Option<(i64, String)> = Some((0, String::new()));
        for s in &set.shots {
            total = match (total, engine.price_of(&set.provider, &s.params)) {
                (Some((sum, _)), Some((m, c))) => Some((sum + m * i64::from(s.candidates.max(1)), c)),
                _ => None,
            };
        }
        let what = format!(
            "provider `{}` charges for each image: this set is {images} generation(s) that will be charged",
            set.provider
        );
        return Err(ack_required(what, total.filter(|(_, c)| !c.is_empty()), json!({"images": images})));
    }
    match engine.confirm_draft(&id, body.revision, set).await? {
        ConfirmOutcome::NotFound => Err(ApiError::not_found("draft")),
        ConfirmOutcome::Stale { latest } => Err(refused(Refused::Stale { latest })),
        ConfirmOutcome::Set { id: set, created } => {
            let status = if created { StatusCode::CREATED } else { StatusCode::OK };
            confirmed(&state, &id, &set, status).await
        }
    }
}

async fn confirmed(state: &AppState, draft: &str, set: &str, status: StatusCode) -> Result<Response, ApiError> {
    let s = load(state, set).await?;
    let d = load_draft(state, draft).await?;
    let body = ConfirmedJson { set_id: set.to_string(), set: set_json(state, &s), draft: draft_json(state, &d) };
    Ok(json_response(status, &body))
}
