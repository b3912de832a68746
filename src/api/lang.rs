//! The owner's language of one API answer: the task JSON's sentences, the history lines and
//! the error messages in English or Simplified Chinese. It is chosen once per request, by
//! the same rule as the page ([`choose`]: the page's switch cookie `tally_lang`, then
//! `ui.language` in the configuration, then `Accept-Language`, then English), by the
//! [`middleware`] around every `/v1` route, and read where words are made with
//! [`request_lang`], so that no handler has to pass it along. Outside a request (the engine,
//! tools, tests that build JSON directly) the language is English, the words the tests and
//! acceptance scripts read. The CLI asks for its `ui.language` with `Accept-Language`.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;

use super::AppState;
use crate::domain::Lang;

/// The cookie the page's language switch sets.
pub const LANG_COOKIE: &str = "tally_lang";

tokio::task_local! {
    /// The language of the request being answered (set by [`middleware`]).
    static LANG: Lang;
}

/// The language of the answer being made: the request's, or English outside a request.
pub fn request_lang() -> Lang {
    LANG.try_with(|l| *l).unwrap_or(Lang::En)
}

/// Run `f` as if answering a request in `lang` (for tests of the words).
pub async fn with_lang<F: std::future::Future>(lang: Lang, f: F) -> F::Output {
    LANG.scope(lang, f).await
}

/// The first language of `Accept-Language` (by weight) that tally has.
fn from_accept_language(value: &str) -> Option<Lang> {
    let mut tags: Vec<(f32, usize, Lang)> = value
        .split(',')
        .enumerate()
        .filter_map(|(i, part)| {
            let mut bits = part.split(';');
            let lang = Lang::parse(bits.next()?)?;
            let q = bits
                .find_map(|b| b.trim().strip_prefix("q=").and_then(|q| q.trim().parse::<f32>().ok()))
                .unwrap_or(1.0);
            (q > 0.0).then_some((q, i, lang))
        })
        .collect();
    tags.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    tags.first().map(|t| t.2)
}

/// The language for a request: the switch's cookie, the configured one, `Accept-Language`.
pub fn choose(headers: &HeaderMap, configured: Option<Lang>) -> Lang {
    let cookie = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| kv.trim().strip_prefix(LANG_COOKIE).and_then(|r| r.strip_prefix('=')).and_then(Lang::parse));
    cookie
        .or(configured)
        .or_else(|| headers.get(header::ACCEPT_LANGUAGE).and_then(|v| v.to_str().ok()).and_then(from_accept_language))
        .unwrap_or(Lang::En)
}

/// The `/v1` layer: choose the request's language, answer in it, and say that the answer
/// depends on it (`Vary`), so that no cache serves one language for another.
pub async fn middleware(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let lang = choose(req.headers(), state.ui_language());
    let mut res = LANG.scope(lang, next.run(req)).await;
    res.headers_mut().append(header::VARY, HeaderValue::from_static("Accept-Language, Cookie"));
    res
}
