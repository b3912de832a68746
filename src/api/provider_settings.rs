//! Providers set up without a terminal (issue #40): `POST /v1/providers` adds one,
//! `PATCH /v1/providers/{name}` changes it, `DELETE /v1/providers/{name}` removes it and
//! `POST /v1/providers/{name}/test` checks its key with a free call. Changes apply without a
//! restart (`Engine::put_provider`); the settings are kept in the data directory's
//! `providers.json` and the key in its `secrets` file (`config::page`), never in the database,
//! an answer, an event or a log line. A provider of the config file is shown read-only here.
//!
//! Invariant: a change is checked by the config's own rules and by the engine (its adapter
//! builds, its currency fits) before anything is written; one change at a time
//! ([`EDITS`]).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody};
use super::openapi::{JsonRejected, StoreFailure};
use super::{AppState, JsonBody, json_response};
use crate::config::page::PageProviders;
use crate::providers::settings::DefinedIn;

/// One change of the page's providers at a time (the files and the engine move together).
static EDITS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A provider's settings as the page sends them: the keys of a `[[providers]]` block, and
/// the key itself (`api_key`) instead of `api_key_env`.
#[derive(Debug, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct ProviderBody {
    /// Its name (letters, digits, `-`, `_`); not one already used. Only when adding.
    #[serde(skip_serializing)]
    pub name: Option<String>,
    /// One of the provider kinds (`GET /v1/providers` shows the configured ones).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `http://` or `https://`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0)]
    pub price_per_image: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub price_per_size: Option<std::collections::BTreeMap<String, f64>>,
    /// A three-letter code (USD, CNY, EUR).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1024)]
    #[serde(default, deserialize_with = "super::whole_number")]
    pub max_concurrency: Option<i64>,
    /// Where you look for a request whose outcome tally cannot prove (your gateway's console).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dashboard_url: Option<String>,
    /// `generate`, `edit`, `cutout`: a subset of what its kind does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operations: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub billing_note: Option<String>,
    /// The whole request's limit, in milliseconds (the kind's default when absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 86400000)]
    #[serde(default, deserialize_with = "super::whole_number")]
    pub request_timeout_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 86400000)]
    #[serde(default, deserialize_with = "super::whole_number")]
    pub connect_timeout_ms: Option<i64>,
    /// The API key. Kept in the data directory's `secrets` file (mode 0600); shown only as its
    /// last four characters (`api_key_hint`). Replacing it needs the new key, not the old one.
    #[serde(skip_serializing)]
    pub api_key: Option<String>,
}

/// `POST /v1/providers/{name}/test` answer.
#[derive(Debug, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct TestJson {
    pub ok: bool,
    /// What the free check found, in plain words.
    pub message: String,
}

/// A provider's name in a path.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ProviderPath {
    /// The provider's name.
    pub name: String,
}

/// Settings change only from this computer: a request over the network (a LAN address, once
/// `allow_non_loopback` lets one in) is refused, whatever its credential. Without a peer (a
/// request made in-process) it is this computer.
fn from_this_computer(peer: &Option<axum::Extension<crate::server::Peer>>) -> Result<(), ApiError> {
    match peer {
        Some(axum::Extension(crate::server::Peer(addr))) if !addr.ip().is_loopback() => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "settings_local_only",
            "providers and keys are changed only on the computer that runs tally (open the page there)",
        )),
        _ => Ok(()),
    }
}

fn settings_of(body: &ProviderBody) -> Map<String, Value> {
    match serde_json::to_value(body) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

fn config_error(e: crate::config::ConfigError) -> ApiError {
    // "the page: key `providers[0].base_url`: …" → the field and the reason.
    let text = e.to_string();
    let text = text.strip_prefix("the page: ").unwrap_or(&text).to_string();
    ApiError::invalid(text.replace("providers[0].", "").replace("key `providers.", "key `"))
}

/// `POST /v1/providers`: add a provider; 201 with the providers as `GET /v1/providers` shows them.
#[utoipa::path(
    post,
    path = "/providers",
    operation_id = "add_provider",
    tag = "providers",
    request_body = ProviderBody,
    responses(
        (status = 201, description = "Added, and in use at once.", body = super::ProvidersJson),
        (status = 403, description = "Not from this computer (`settings_local_only`).", body = ErrorBody),
        (status = 409, description = "The name is already used (`name_taken`).", body = ErrorBody),
        (status = 422, description = "A field is wrong: which, and why (`invalid_request`); nothing saved.", body = ErrorBody),
        JsonRejected,
        StoreFailure,
    )
)]
pub async fn add(
    State(state): State<AppState>,
    peer: Option<axum::Extension<crate::server::Peer>>,
    JsonBody(body): JsonBody<ProviderBody>,
) -> Result<Response, ApiError> {
    from_this_computer(&peer)?;
    let _one = EDITS.lock().await;
    let engine = state.engine();
    let name = body.name.clone().filter(|n| !n.is_empty()).ok_or_else(|| ApiError::invalid("`name` is required"))?;
    if engine.provider_names().contains(&name) {
        return Err(ApiError::conflict(
            "name_taken",
            format!("a provider is already named `{name}`; choose another name"),
        ));
    }
    let page = PageProviders::new(engine.data_dir());
    let cfg = page.check(&name, settings_of(&body), body.api_key.as_deref()).map_err(config_error)?;
    engine.put_provider(cfg).await?;
    if let Err(e) = page.put(&name, settings_of(&body), body.api_key.as_deref()) {
        // Not kept: take it back out, so what runs is what a restart would run.
        let _ = engine.remove_provider(&name).await;
        return Err(config_error(e));
    }
    tracing::info!(provider = %name, "a provider was added in the page");
    Ok(json_response(StatusCode::CREATED, &super::providers(State(state.clone())).await.0))
}

/// `PATCH /v1/providers/{name}`: change a provider added in the page (only the fields sent).
#[utoipa::path(
    patch,
    path = "/providers/{name}",
    operation_id = "edit_provider",
    tag = "providers",
    params(ProviderPath),
    request_body = ProviderBody,
    responses(
        (status = 200, description = "Changed; the next job uses the new settings.", body = super::ProvidersJson),
        (status = 403, description = "Not from this computer (`settings_local_only`).", body = ErrorBody),
        (status = 404, description = "No such provider (`not_found`).", body = ErrorBody),
        (status = 409, description = "It is defined in tally.toml (`defined_in_config`).", body = ErrorBody),
        (status = 422, description = "A field is wrong (`invalid_request`); nothing saved.", body = ErrorBody),
        JsonRejected,
        StoreFailure,
    )
)]
pub async fn edit(
    State(state): State<AppState>,
    Path(name): Path<String>,
    peer: Option<axum::Extension<crate::server::Peer>>,
    JsonBody(body): JsonBody<ProviderBody>,
) -> Result<Response, ApiError> {
    from_this_computer(&peer)?;
    let _one = EDITS.lock().await;
    let engine = state.engine();
    let Some(current) = engine.provider_config(&name) else { return Err(ApiError::not_found("provider")) };
    if current.defined_in != DefinedIn::Page {
        return Err(defined_in_config(&name));
    }
    if body.name.as_ref().is_some_and(|n| n != &name) {
        return Err(ApiError::invalid("a provider's name cannot change; add a new one instead"));
    }
    let page = PageProviders::new(engine.data_dir());
    let mut settings = page.settings().map_err(config_error)?.remove(&name).unwrap_or_default();
    settings.extend(settings_of(&body));
    let cfg = page.check(&name, settings.clone(), body.api_key.as_deref()).map_err(config_error)?;
    engine.put_provider(cfg).await?;
    page.put(&name, settings, body.api_key.as_deref()).map_err(config_error)?;
    Ok(json_response(StatusCode::OK, &super::providers(State(state.clone())).await.0))
}

/// `DELETE /v1/providers/{name}`: remove a provider added in the page; refused while it has
/// jobs queued, waiting or running.
#[utoipa::path(
    delete,
    path = "/providers/{name}",
    operation_id = "remove_provider",
    tag = "providers",
    params(ProviderPath),
    responses(
        (status = 200, description = "Removed, with its key.", body = super::ProvidersJson),
        (status = 403, description = "Not from this computer (`settings_local_only`).", body = ErrorBody),
        (status = 404, description = "No such provider (`not_found`).", body = ErrorBody),
        (status = 409, description = "Defined in tally.toml (`defined_in_config`), or it has jobs in flight \
            (`in_use`).", body = ErrorBody),
        StoreFailure,
    )
)]
pub async fn remove(
    State(state): State<AppState>,
    Path(name): Path<String>,
    peer: Option<axum::Extension<crate::server::Peer>>,
) -> Result<Response, ApiError> {
    from_this_computer(&peer)?;
    let _one = EDITS.lock().await;
    let engine = state.engine();
    let Some(current) = engine.provider_config(&name) else { return Err(ApiError::not_found("provider")) };
    if current.defined_in != DefinedIn::Page {
        return Err(defined_in_config(&name));
    }
    match engine.remove_provider(&name).await {
        Ok(_) => {}
        Err(crate::engine::EngineError::Invalid(m)) => return Err(ApiError::conflict("in_use", m)),
        Err(e) => return Err(e.into()),
    }
    PageProviders::new(engine.data_dir()).remove(&name).map_err(config_error)?;
    tracing::info!(provider = %name, "a provider was removed in the page");
    Ok(json_response(StatusCode::OK, &super::providers(State(state.clone())).await.0))
}

/// `POST /v1/providers/{name}/test`: check the key with a free call (a listing of models, or
/// the provider's documented key check); never a paid request.
#[utoipa::path(
    post,
    path = "/providers/{name}/test",
    operation_id = "test_provider",
    tag = "providers",
    params(ProviderPath),
    responses(
        (status = 200, description = "The key works (or the kind has no free check: said so).", body = TestJson),
        (status = 404, description = "No such provider (`not_found`).", body = ErrorBody),
        (status = 422, description = "The provider refused the key, or could not be reached: why \
            (`test_failed`).", body = ErrorBody),
    )
)]
pub async fn test(State(state): State<AppState>, Path(name): Path<String>) -> Result<Response, ApiError> {
    match state.engine().test_provider(&name).await {
        None => Err(ApiError::not_found("provider")),
        Some(Ok(message)) => Ok(json_response(StatusCode::OK, &TestJson { ok: true, message })),
        Some(Err(why)) => Err(ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "test_failed", why)),
    }
}

fn defined_in_config(name: &str) -> ApiError {
    ApiError::conflict(
        "defined_in_config",
        format!("provider `{name}` is defined in tally.toml; change it there (the file wins over the page)"),
    )
}
