//! The HTTP API (axum): the router, its shared state, the JSON body extractors and the two
//! unauthenticated routes (`/healthz`, `/metrics`). The API changes state only through the
//! engine; it never starts a provider call inside a request handler.
//!
//! Every route passes the Host check and the declared-length check; every `/v1` route also
//! needs the bearer token or a web session cookie (with its CSRF token on state-changing
//! requests). The web page's own routes (`/`, `/login`, `/assets/…`, `/v1/session`,
//! `/v1/stream`) live in [`crate::web`]. [`app`] builds the router without a socket, so tests
//! can drive it with `tower::ServiceExt::oneshot`. The `/v1` routes are listed once, in
//! [`v1_routes`], which also yields their OpenAPI document ([`openapi`]).

pub mod auth;
pub mod budget;
pub mod choice;
pub mod delivered;
pub mod deliveries;
pub mod devices;
pub mod download;
pub mod download_profile;
pub mod drafts;
pub mod error;
pub mod held;
pub mod images;
pub mod lang;
pub mod listing;
pub mod openapi;
pub mod provider_settings;
pub mod prune;
pub mod session;
pub mod sessions;
pub mod set_edit;
pub mod sets;
pub mod source;
pub mod spend;
pub mod stream;
pub mod task_help;
pub mod task_json;
pub mod tasks;
pub mod thumbnail;
pub mod time_zone;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::config::ServerConfig;
use crate::engine::{Engine, ProviderInfo};
use error::{ApiError, unsupported_media_type};
use sessions::Sessions;

/// What every handler shares. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Arc<Engine>,
    token: String,
    allowed_hosts: Vec<String>,
    max_body_bytes: u64,
    /// The first configured provider: used when a submit names none.
    default_provider: String,
    /// The web page's sign-in codes (in memory) and sessions (in the database).
    sessions: Arc<Sessions>,
    /// Set to true when the server stops, so that open event streams end.
    closing: watch::Sender<bool>,
    /// `ui.language`: the page's language unless the browser's switch chose one.
    ui_language: std::sync::OnceLock<crate::domain::Lang>,
    /// `http://<LAN address>:<port>` when `tally serve --lan` (`server.lan`) found one: where
    /// pairing links send a phone (once, at start-up).
    lan_base: std::sync::OnceLock<String>,
    /// The delivery profiles (`[delivery]`, built-ins included; once, at start-up).
    delivery_profiles: std::sync::OnceLock<Vec<crate::delivery::profile::Profile>>,
    /// The OpenAPI document as this daemon serves it (made at its first request).
    openapi: std::sync::OnceLock<String>,
}

impl AppState {
    /// State for an engine, the API token, the `[server]` settings and the default provider.
    pub fn new(engine: Arc<Engine>, token: String, server: &ServerConfig, default_provider: String) -> Self {
        let sessions = Arc::new(Sessions::stored(engine.store().clone()));
        AppState {
            inner: Arc::new(Inner {
                engine,
                token,
                allowed_hosts: server.allowed_hosts.clone(),
                max_body_bytes: server.max_body_bytes,
                default_provider,
                sessions,
                closing: watch::channel(false).0,
                ui_language: std::sync::OnceLock::new(),
                lan_base: std::sync::OnceLock::new(),
                delivery_profiles: std::sync::OnceLock::new(),
                openapi: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Set the page's configured language (`ui.language`; once, at start-up).
    pub fn set_ui_language(&self, lang: crate::domain::Lang) {
        let _ = self.inner.ui_language.set(lang);
    }

    /// The page's configured language, if one is configured.
    pub fn ui_language(&self) -> Option<crate::domain::Lang> {
        self.inner.ui_language.get().copied()
    }

    /// Set the address the shop's network reaches this daemon at (`--lan`; once, at start-up).
    pub fn set_lan_base(&self, base: String) {
        let _ = self.inner.lan_base.set(base);
    }

    /// `http://<LAN address>:<port>` if the daemon listens on the shop's network too.
    pub fn lan_base(&self) -> Option<&str> {
        self.inner.lan_base.get().map(String::as_str)
    }

    /// Set the delivery profiles a request may name (`Config::delivery.profiles`, built-ins
    /// included; once, at start-up).
    pub fn set_delivery_profiles(&self, profiles: Vec<crate::delivery::profile::Profile>) {
        let _ = self.inner.delivery_profiles.set(profiles);
    }

    /// The delivery profiles a request may name: those set at start-up, else the built-ins.
    pub fn delivery_profiles(&self) -> Vec<crate::delivery::profile::Profile> {
        self.inner.delivery_profiles.get().cloned().unwrap_or_else(crate::delivery::profile::builtins)
    }

    /// The served OpenAPI document, made by `make` at the first call.
    pub fn openapi_text(&self, make: impl FnOnce() -> String) -> &str {
        self.inner.openapi.get_or_init(make)
    }

    /// The provider used when a request names none.
    pub fn default_provider(&self) -> &str {
        &self.inner.default_provider
    }

    /// The engine behind the API.
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// The web page's sign-in codes and sessions.
    pub fn sessions(&self) -> &Sessions {
        &self.inner.sessions
    }

    /// End every open event stream (`GET /v1/stream`), so a clean stop need not wait for
    /// browsers to disconnect.
    pub fn close_streams(&self) {
        self.inner.closing.send_replace(true);
    }

    /// Whether the server is stopping, as a watch a stream can wait on.
    pub fn closing(&self) -> watch::Receiver<bool> {
        self.inner.closing.subscribe()
    }
}

/// Every `/v1` route, each registered with `routes!` so that the handler and its
/// `#[utoipa::path]` annotation go into the router and into the OpenAPI document in one call
/// ([`openapi`]). Register nothing here any other way: `tests/it/openapi.rs` fails if a route
/// is added with `.route(…)`, `.nest(…)` or `.merge(…)`. Handlers that share a path go into one
/// `routes!` (one axum `MethodRouter` per path).
pub fn v1_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(tasks::submit, tasks::list))
        .routes(routes!(tasks::get_one))
        .routes(routes!(tasks::events))
        .routes(routes!(tasks::cancel))
        .routes(routes!(tasks::retry))
        .routes(routes!(tasks::resolve))
        .routes(routes!(images::artifact))
        .routes(routes!(thumbnail::artifact))
        .routes(routes!(sets::upload))
        .routes(routes!(images::upload))
        .routes(routes!(thumbnail::upload))
        .routes(routes!(sets::create, sets::list))
        .routes(routes!(sets::get_one, set_edit::edit, set_edit::delete))
        .routes(routes!(set_edit::duplicate))
        .routes(routes!(set_edit::start))
        .routes(routes!(sets::cancel))
        .routes(routes!(drafts::create, drafts::list))
        .routes(routes!(drafts::estimate))
        .routes(routes!(drafts::get_one, drafts::edit))
        .routes(routes!(drafts::redraft))
        .routes(routes!(drafts::confirm))
        .routes(routes!(choice::add))
        .routes(routes!(choice::choose, choice::clear))
        .routes(routes!(download::set_zip))
        .routes(routes!(deliveries::create, deliveries::list))
        .routes(routes!(deliveries::get_one))
        .routes(routes!(deliveries::retry))
        .routes(routes!(delivered::file))
        .routes(routes!(delivered::zip))
        .routes(routes!(deliveries::profiles))
        .routes(routes!(listing::overlays))
        .routes(routes!(listing::preview))
        .routes(routes!(deliveries::targets))
        .routes(routes!(prune::prune))
        .routes(routes!(held::list))
        .routes(routes!(held::release))
        .routes(routes!(held::check))
        .routes(routes!(held::dismiss))
        .routes(routes!(providers, provider_settings::add))
        .routes(routes!(provider_settings::edit, provider_settings::remove))
        .routes(routes!(provider_settings::test))
        .routes(routes!(spend::spend))
        .routes(routes!(spend::requests))
        .routes(routes!(budget::get_budget, budget::set_budget, budget::reset_budget))
        .routes(routes!(time_zone::get_time_zone, time_zone::set_time_zone, time_zone::reset_time_zone))
        .routes(routes!(session::session))
        .routes(routes!(session::sign_in_url))
        .routes(routes!(session::pair))
        .routes(routes!(devices::list))
        .routes(routes!(devices::end))
        .routes(routes!(session::sign_out))
        .routes(routes!(stream::stream))
        .routes(routes!(openapi::openapi_json))
}

/// The whole API as a router (no socket), with `pages` (the web page's routes outside `/v1`,
/// `web::routes`) behind the same Host and body checks. The API does not know the page: the
/// caller (`app::serve`) hands its routes in.
pub fn app(state: AppState, pages: Router<AppState>) -> Router {
    let limit = usize::try_from(state.inner.max_body_bytes).unwrap_or(usize::MAX);
    let (v1, _) = v1_routes().split_for_parts();
    let v1 = v1
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(from_fn_with_state(state.clone(), auth::require_token))
        .layer(from_fn_with_state(state.clone(), lang::middleware));
    Router::new()
        .nest("/v1", v1)
        .merge(pages)
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(from_fn_with_state(state.clone(), auth::check_body))
        .layer(from_fn_with_state(state.clone(), auth::check_host))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::not_found("route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "this route does not accept that method")
}

/// `GET /v1/providers` answer.
#[derive(Debug, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct ProvidersJson {
    pub providers: Vec<ProviderInfo>,
    /// The provider a submit that names none uses.
    pub default: String,
    /// The kinds a provider can be added as (`POST /v1/providers`), from their descriptors.
    pub kinds: Vec<KindJson>,
}

/// A provider kind as the Settings page offers it.
#[derive(Debug, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct KindJson {
    pub name: String,
    /// The operations it can offer.
    #[schema(value_type = Vec<String>)]
    pub operations: Vec<crate::domain::operation::Operation>,
    pub needs_model: bool,
    /// Its documented endpoint when `base_url` may be left out.
    pub default_base_url: Option<String>,
    pub bills: bool,
}

/// `GET /v1/providers`: the configured providers, what each can prove after a lost answer,
/// and how each bills.
#[utoipa::path(
    get,
    path = "/providers",
    operation_id = "list_providers",
    tag = "providers",
    responses((status = 200, description = "The configured providers.", body = ProvidersJson))
)]
pub async fn providers(State(state): State<AppState>) -> Json<ProvidersJson> {
    // The billing notes in the answer's language (`lang`); an owner's own note stays as written.
    let lang = lang::request_lang();
    let mut providers = state.engine().provider_list();
    for p in &mut providers {
        p.billing_note = crate::domain::words::render(lang, &p.billing_note);
    }
    let kinds = crate::providers::kinds::KINDS
        .iter()
        .map(|k| KindJson {
            name: k.name.to_string(),
            operations: k.operations.to_vec(),
            needs_model: k.needs_model,
            default_base_url: k.default_base_url.map(str::to_string),
            bills: k.bills,
        })
        .collect();
    Json(ProvidersJson { providers, default: state.default_provider().to_string(), kinds })
}

/// `GET /healthz`: 200 `{"status": "ok", "check"}`; 503 `{"status": "failing", "reason",
/// "check"}` once the database cannot be used any more (a failed fsync, a read-only or corrupt
/// file, a failed background check) and the daemon is stopping because of it. `check` is the
/// background database check (`engine::db_check`): `{state: not_run|running|passed|failed,
/// started_at, finished_at, problems}`.
async fn healthz(State(state): State<AppState>) -> Response {
    let check = state.engine().db_check();
    match state.engine().failure_now() {
        None => axum::Json(serde_json::json!({ "status": "ok", "check": check })).into_response(),
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({ "status": "failing", "reason": why, "check": check })),
        )
            .into_response(),
    }
}

async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let engine = state.engine();
    let counts = engine.status_counts().await?;
    engine.metrics().set_task_counts(&counts);
    let charges = engine.store().charge_totals().await?;
    engine.metrics().observe_charges(&charges);
    engine.metrics().set_sidecar(engine.store().sidecar_seqs());
    let text = engine.metrics().encode();
    Ok(([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response())
}

/// Whether the request declares a JSON body (`application/json` or `application/*+json`).
fn is_json(headers: &HeaderMap) -> bool {
    let Some(ct) = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else { return false };
    let essence = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// A required JSON body: 415 unless declared JSON, 400 for bad syntax, 422 for the wrong
/// shape, 413 when too large.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !is_json(req.headers()) {
            return Err(unsupported_media_type());
        }
        let bytes = Bytes::from_request(req, state).await?;
        Ok(JsonBody(axum::Json::<T>::from_bytes(&bytes)?.0))
    }
}

/// An optional JSON body: an empty body (or a JSON `null`) means `T::default()`; any other
/// is checked like [`JsonBody`].
pub struct OptionalJsonBody<T>(pub T);

impl<T: DeserializeOwned + Default, S: Send + Sync> FromRequest<S> for OptionalJsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let declared_json = is_json(req.headers());
        let bytes = Bytes::from_request(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJsonBody(T::default()));
        }
        if !declared_json {
            return Err(unsupported_media_type());
        }
        match axum::Json::<Option<T>>::from_bytes(&bytes)?.0 {
            Some(body) => Ok(OptionalJsonBody(body)),
            None => Ok(OptionalJsonBody(T::default())),
        }
    }
}

/// A JSON response with a status.
pub fn json_response<T: serde::Serialize>(status: StatusCode, body: &T) -> Response {
    (status, axum::Json(body)).into_response()
}

/// An optional count from a query string: digits only, at most `i64::MAX` (the document's
/// `int64`); anything else is refused. The callers clamp it (a page size above 500 is 500).
pub(crate) fn any_count<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    use serde::Deserialize;
    use serde::de::Error;
    let Some(s) = Option::<String>::deserialize(d)? else { return Ok(None) };
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(D::Error::custom(format!("`{s}` is not a whole number")));
    }
    match s.parse::<i64>() {
        // What JSON Schema's `int64` allows: a page size past `usize` cannot be asked for.
        Ok(n) => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
        Err(_) => Err(D::Error::custom(format!("`{s}` is past the largest count (int64)"))),
    }
}

pub(crate) use crate::domain::{whole, whole_number};
