//! A configured provider as its adapter and the engine read it (`[[providers]]` after the
//! config's checks, `config::provider`), and its prices. Kind-neutral: what differs per kind is
//! in its descriptor (`providers::kinds`).

use std::time::Duration;

use super::kinds::ProviderKind;
use crate::domain::operation::Operation;

/// A provider's prices (millionths of `currency`): `per_size` first, then `per_image`; for a
/// drafting call (priced by tokens), `per_million_input` and `per_million_output`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Pricing {
    pub per_image: Option<crate::domain::Micros>,
    pub per_size: std::collections::BTreeMap<String, crate::domain::Micros>,
    /// `price_per_million_input_tokens`.
    pub per_million_input: Option<crate::domain::Micros>,
    /// `price_per_million_output_tokens`.
    pub per_million_output: Option<crate::domain::Micros>,
    pub currency: String,
}

impl Pricing {
    /// The price of one image of `size`, if one is configured.
    pub fn price(&self, size: &str) -> Option<crate::domain::Micros> {
        self.per_size.get(size).copied().or(self.per_image)
    }

    /// Whether any price is configured.
    pub fn is_priced(&self) -> bool {
        self.per_image.is_some() || !self.per_size.is_empty() || self.tokens_priced()
    }

    /// Whether both token prices are configured.
    pub fn tokens_priced(&self) -> bool {
        self.per_million_input.is_some() && self.per_million_output.is_some()
    }

    /// The price of a call of `input` and `output` tokens, if token prices are configured
    /// (rounded up to the next millionth).
    pub fn price_tokens(&self, input: u64, output: u64) -> Option<crate::domain::Micros> {
        let (i, o) = (self.per_million_input?, self.per_million_output?);
        let total = i128::from(i) * i128::from(input) + i128::from(o) * i128::from(output);
        Some(i64::try_from((total + 999_999) / 1_000_000).unwrap_or(i64::MAX))
    }
}

/// An API key held in memory (a provider added in the page keeps its key in the data
/// directory's `secrets` file, never in the database). Its `Debug` never shows it; only
/// [`Secret::hint`], its last four characters, is ever shown.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wrap a key (trimmed).
    pub fn new(key: &str) -> Secret {
        Secret(key.trim().to_string())
    }

    /// The key itself: for the request header and for redaction only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Its last four characters, for the owner to recognise it by.
    pub fn hint(&self) -> String {
        let chars: Vec<char> = self.0.chars().collect();
        chars[chars.len().saturating_sub(4)..].iter().collect()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Where a provider was defined: the config file (read-only in the page), or the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum DefinedIn {
    #[default]
    Config,
    Page,
}

/// One `[[providers]]` entry. The API key itself is never stored here, only the name of the
/// environment variable that holds it.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct ProviderConfig {
    pub name: String,
    pub kind: ProviderKind,
    /// The operations it offers: its kind's defaults, or the `operations` key (a subset of
    /// what the kind can do).
    pub operations: Vec<Operation>,
    pub max_concurrency: usize,
    /// Slots the recovery lane leaves free for fresh work (default 1; it may always use one).
    pub reserve: usize,
    pub base_url: Option<String>,
    pub api_key_env: Option<String>,
    pub model: Option<String>,
    pub size: String,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub poll_interval: Duration,
    pub idempotency_header: Option<String>,
    /// The model input that takes the reference images (where the adapter cannot find it in the model's
    /// schema when not set; fal: required for shots with reference images).
    pub reference_input: Option<String>,
    /// Send each image through the kind's batch API (half price, not urgent): only kinds
    /// whose descriptor lists the `batch` key.
    pub batch: bool,
    pub max_response_bytes: usize,
    /// The most tokens a drafting call's answer may use (`max_output_tokens`): sent to the
    /// provider, and the ceiling the price shown before the call is estimated with.
    pub max_output_tokens: u32,
    pub billing_note: Option<String>,
    /// Demo only: how long a render takes.
    pub delay: Duration,
    pub pricing: Pricing,
    /// This provider's own limits (millionths of its currency).
    pub budget_daily: Option<crate::domain::Micros>,
    pub budget_monthly: Option<crate::domain::Micros>,
    /// The key itself, for a provider added in the page (from the `secrets` file); a provider
    /// of the config file reads its key from `api_key_env` at each call.
    pub api_key: Option<Secret>,
    /// Where the owner looks for a request whose outcome tally cannot prove; `None`: the
    /// kind's own page (none for an OpenAI-compatible gateway).
    pub dashboard_url: Option<String>,
    pub defined_in: DefinedIn,
}

impl ProviderConfig {
    /// The built-in demo provider used when no provider is configured.
    pub fn demo() -> Self {
        ProviderConfig {
            name: "demo".into(),
            kind: ProviderKind::Demo,
            operations: ProviderKind::Demo.spec().default_operations.to_vec(),
            max_concurrency: 4,
            reserve: 1,
            base_url: None,
            api_key_env: None,
            model: None,
            size: "1024x1024".into(),
            connect_timeout: Duration::from_millis(5_000),
            request_timeout: Duration::from_millis(120_000),
            poll_interval: Duration::from_millis(1_000),
            idempotency_header: None,
            reference_input: None,
            batch: false,
            max_response_bytes: 64 << 20,
            max_output_tokens: DEFAULT_MAX_OUTPUT_TOKENS,
            billing_note: None,
            delay: Duration::from_millis(300),
            pricing: Pricing { currency: crate::domain::DEFAULT_CURRENCY.into(), ..Pricing::default() },
            budget_daily: None,
            budget_monthly: None,
            api_key: None,
            dashboard_url: None,
            defined_in: DefinedIn::Config,
        }
    }
}

/// `max_output_tokens` when the config gives none.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u32 = 4096;

/// Parse a `WIDTHxHEIGHT` size such as `1024x1024` (a provider's `size`, checked by the config
/// and sent by the adapters).
pub fn parse_size(size: &str) -> Option<(u32, u32)> {
    let (w, h) = size.split_once(['x', 'X'])?;
    Some((w.trim().parse().ok()?, h.trim().parse().ok()?))
}
