//! `[[providers]]`: provider kinds, prices, timeouts and the checks on each entry.

use std::time::Duration;

use super::{ConfigError, DEFAULT_CURRENCY, RawProvider};

/// A provider's prices (millionths of `currency`): `per_size` first, then `per_image`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pricing {
    pub per_image: Option<crate::domain::Micros>,
    pub per_size: std::collections::BTreeMap<String, crate::domain::Micros>,
    pub currency: String,
}

impl Pricing {
    /// The price of one image of `size`, if one is configured.
    pub fn price(&self, size: &str) -> Option<crate::domain::Micros> {
        self.per_size.get(size).copied().or(self.per_image)
    }

    /// Whether any price is configured.
    pub fn is_priced(&self) -> bool {
        self.per_image.is_some() || !self.per_size.is_empty()
    }
}

/// The kinds of provider adapters tally ships.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    Demo,
    OpenaiImages,
    Replicate,
    FalQueue,
    /// Alibaba Cloud Model Studio (DashScope): Wan and Qwen-Image asynchronous tasks.
    Dashscope,
    Gemini,
    Bfl,
}

impl ProviderKind {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "demo" => ProviderKind::Demo,
            "openai_images" => ProviderKind::OpenaiImages,
            "replicate" => ProviderKind::Replicate,
            "fal_queue" => ProviderKind::FalQueue,
            "dashscope" => ProviderKind::Dashscope,
            "gemini" => ProviderKind::Gemini,
            "bfl" => ProviderKind::Bfl,
            _ => return None,
        })
    }

    /// The name used in config files.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Demo => "demo",
            ProviderKind::OpenaiImages => "openai_images",
            ProviderKind::Replicate => "replicate",
            ProviderKind::FalQueue => "fal_queue",
            ProviderKind::Dashscope => "dashscope",
            ProviderKind::Gemini => "gemini",
            ProviderKind::Bfl => "bfl",
        }
    }
}

/// One `[[providers]]` entry. The API key itself is never stored here, only the name of the
/// environment variable that holds it.
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    pub name: String,
    pub kind: ProviderKind,
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
    /// The model input that takes the reference images (Replicate: found in the model's
    /// schema when not set; fal: required for shots with reference images).
    pub reference_input: Option<String>,
    /// Gemini only: send each image through the Batch API (half price, not urgent).
    pub batch: bool,
    pub max_response_bytes: usize,
    pub billing_note: Option<String>,
    /// Demo only: how long a render takes.
    pub delay: Duration,
    pub pricing: Pricing,
    /// This provider's own limits (millionths of its currency).
    pub budget_daily: Option<crate::domain::Micros>,
    pub budget_monthly: Option<crate::domain::Micros>,
}

impl ProviderConfig {
    /// The built-in demo provider used when no provider is configured.
    pub fn demo() -> Self {
        ProviderConfig {
            name: "demo".into(),
            kind: ProviderKind::Demo,
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
            billing_note: None,
            delay: Duration::from_millis(300),
            pricing: Pricing { currency: DEFAULT_CURRENCY.into(), ..Pricing::default() },
            budget_daily: None,
            budget_monthly: None,
        }
    }
}

/// Hosts of image APIs that document no idempotency header (OpenAI, Replicate, fal and fal's
/// backup domains, DashScope's international and mainland endpoints, the Gemini API, Black
/// Forest Labs' global and regional endpoints): `idempotency_header` is refused for them,
/// because a blind resend there is a second charge.
pub const HOSTS_WITHOUT_IDEMPOTENCY: &[&str] = &[
    "api.openai.com",
    "api.replicate.com",
    "queue.fal.run",
    "fal.run",
    "queue.falrun.com",
    "falrun.com",
    "api.fal.ai",
    "dashscope.aliyuncs.com",
    "dashscope-intl.aliyuncs.com",
    "generativelanguage.googleapis.com",
    "api.bfl.ai",
    "api.bfl.ml",
    "api.eu.bfl.ai",
    "api.us.bfl.ai",
    "api.us1.bfl.ai",
];

/// The documented host `base_url` points at, if it is one of [`HOSTS_WITHOUT_IDEMPOTENCY`].
pub(super) fn documented_without_idempotency(base_url: &str) -> Option<&'static str> {
    let rest = base_url.split_once("://").map_or(base_url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    let host = authority.rsplit('@').next().unwrap_or(authority);
    let host = host.split(':').next().unwrap_or(host).trim_end_matches('.').to_ascii_lowercase();
    HOSTS_WITHOUT_IDEMPOTENCY.iter().copied().find(|h| host == *h)
}

/// The default total request timeout per kind. An `openai_images` generation is answered
/// only when the image is done, which can take minutes; a timeout after sending is an
/// `unknown` (the request may still be generated and charged), so the default matches the
/// official SDK's 600 s instead of manufacturing unknowns. The asynchronous kinds' requests
/// (submit, poll, list) answer quickly.
pub fn default_request_timeout(kind: ProviderKind) -> Duration {
    match kind {
        ProviderKind::OpenaiImages | ProviderKind::Gemini => Duration::from_secs(600),
        _ => Duration::from_secs(120),
    }
}

pub(super) fn resolve_provider(p: RawProvider, i: usize, origin: &str) -> Result<ProviderConfig, ConfigError> {
    let key = |k: &str| format!("providers[{i}].{k}");
    let bad = |k: &str, reason: String| ConfigError::Invalid { path: origin.into(), key: key(k), reason };
    let name = p.name.ok_or_else(|| bad("name", "is required".into()))?;
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return Err(bad("name", format!("`{name}` must be letters, digits, '-' or '_'")));
    }
    let kind_text = p.kind.ok_or_else(|| bad("kind", "is required".into()))?;
    let kind = ProviderKind::parse(&kind_text).ok_or_else(|| {
        bad(
            "kind",
            format!("`{kind_text}` is not one of demo, openai_images, replicate, fal_queue, dashscope, gemini, bfl"),
        )
    })?;
    let demo = ProviderConfig::demo();
    let ms = |k: &str, v: Option<i64>, default: Duration| -> Result<Duration, ConfigError> {
        match v {
            None => Ok(default),
            Some(n) if (1..=86_400_000).contains(&n) => Ok(Duration::from_millis(n as u64)),
            Some(n) => Err(bad(k, format!("{n} must be between 1 and 86400000"))),
        }
    };
    let max_concurrency = match p.max_concurrency {
        None => 4,
        Some(n) if (1..=1024).contains(&n) => n as usize,
        Some(n) => return Err(bad("max_concurrency", format!("{n} must be between 1 and 1024"))),
    };
    let reserve = match p.reserve {
        None => 1,
        Some(n) if (0..=1024).contains(&n) => n as usize,
        Some(n) => return Err(bad("reserve", format!("{n} must be between 0 and 1024"))),
    };
    // DashScope's endpoint is known: the international one unless base_url says otherwise.
    let base_url = match (kind, p.base_url) {
        (ProviderKind::Dashscope, None) => Some(DASHSCOPE_BASE_URL.to_string()),
        (_, url) => url,
    };
    if kind != ProviderKind::Demo {
        let url = base_url.as_deref().ok_or_else(|| bad("base_url", format!("is required for kind {kind_text}")))?;
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(bad("base_url", format!("`{url}` must start with http:// or https://")));
        }
        if kind != ProviderKind::OpenaiImages && p.model.is_none() {
            return Err(bad("model", format!("is required for kind {kind_text}")));
        }
    }
    if let Some(env) = &p.api_key_env
        && (env.is_empty() || env.contains('='))
    {
        return Err(bad("api_key_env", "must name an environment variable".into()));
    }
    if let Some(h) = &p.idempotency_header
        && (h.is_empty() || !h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    {
        return Err(bad("idempotency_header", format!("`{h}` is not a valid header name")));
    }
    if p.idempotency_header.is_some()
        && let Some(host) = base_url.as_deref().and_then(documented_without_idempotency)
    {
        return Err(bad(
            "idempotency_header",
            format!(
                "{host} documents no idempotency header, so it would not deduplicate anything: tally would \
                 treat a resend as free and could be charged twice. Remove idempotency_header for this provider \
                 (it is only for gateways that honour one)"
            ),
        ));
    }
    if let Some(r) = &p.reference_input
        && (r.is_empty() || !r.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
    {
        return Err(bad("reference_input", format!("`{r}` is not an input name (letters, digits, '_')")));
    }
    if p.batch == Some(true) && kind != ProviderKind::Gemini {
        return Err(bad("batch", format!("kind {kind_text} has no batch API tally uses (only gemini)")));
    }
    let max_response_bytes = match p.max_response_bytes {
        None => demo.max_response_bytes,
        Some(n) if (1024..=1 << 30).contains(&n) => n as usize,
        Some(n) => return Err(bad("max_response_bytes", format!("{n} must be between 1024 and 1073741824"))),
    };
    let money = |k: &str, v: f64| -> Result<crate::domain::Micros, ConfigError> {
        if v.is_finite() && (0.0..1e9).contains(&v) {
            Ok(crate::domain::to_micros(v))
        } else {
            Err(bad(k, format!("{v} must be an amount of money, 0 or more")))
        }
    };
    let per_image = p.price_per_image.map(|v| money("price_per_image", v)).transpose()?;
    let mut per_size = std::collections::BTreeMap::new();
    for (size, v) in p.price_per_size.unwrap_or_default() {
        if parse_size(&size).is_none() {
            return Err(bad("price_per_size", format!("`{size}` is not a size like 1024x1024")));
        }
        per_size.insert(size, money("price_per_size", v)?);
    }
    let currency = p.currency.unwrap_or_else(|| DEFAULT_CURRENCY.into());
    if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(bad("currency", format!("`{currency}` must be a three-letter code such as USD or EUR")));
    }
    let pricing = Pricing { per_image, per_size, currency };
    if kind == ProviderKind::Demo && pricing.is_priced() {
        return Err(bad("price_per_image", "the demo provider never charges, so it takes no price".into()));
    }
    let budget_daily = p.budget_daily.map(|v| money("budget_daily", v)).transpose()?;
    let budget_monthly = p.budget_monthly.map(|v| money("budget_monthly", v)).transpose()?;
    if (budget_daily.is_some() || budget_monthly.is_some()) && !pricing.is_priced() {
        return Err(bad(
            if budget_daily.is_some() { "budget_daily" } else { "budget_monthly" },
            "a budget needs a price to count: set price_per_image (or price_per_size)".into(),
        ));
    }
    Ok(ProviderConfig {
        pricing,
        budget_daily,
        budget_monthly,
        name,
        kind,
        max_concurrency,
        reserve,
        base_url: base_url.map(|u| u.trim_end_matches('/').to_string()),
        // DashScope's key has a documented variable (the official SDK reads it too).
        api_key_env: p.api_key_env.or_else(|| (kind == ProviderKind::Dashscope).then(|| "DASHSCOPE_API_KEY".into())),
        model: p.model,
        size: p.size.unwrap_or(demo.size),
        connect_timeout: ms("connect_timeout_ms", p.connect_timeout_ms, demo.connect_timeout)?,
        request_timeout: ms("request_timeout_ms", p.request_timeout_ms, default_request_timeout(kind))?,
        poll_interval: ms("poll_interval_ms", p.poll_interval_ms, demo.poll_interval)?,
        idempotency_header: p.idempotency_header,
        reference_input: p.reference_input,
        batch: p.batch.unwrap_or(false),
        max_response_bytes,
        billing_note: p.billing_note,
        delay: match p.delay_ms {
            None => demo.delay,
            Some(n) if (0..=600_000).contains(&n) => Duration::from_millis(n as u64),
            Some(n) => return Err(bad("delay_ms", format!("{n} must be between 0 and 600000"))),
        },
    })
}

/// Parse a `WIDTHxHEIGHT` size such as `1024x1024` (a provider's `size`, checked here and
/// sent by the adapters).
pub fn parse_size(size: &str) -> Option<(u32, u32)> {
    let (w, h) = size.split_once(['x', 'X'])?;
    Some((w.trim().parse().ok()?, h.trim().parse().ok()?))
}

/// DashScope's international (Singapore) endpoint, the default `base_url` of `kind =
/// "dashscope"`; the mainland one is `https://dashscope.aliyuncs.com`.
pub const DASHSCOPE_BASE_URL: &str = "https://dashscope-intl.aliyuncs.com";
