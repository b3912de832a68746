//! Each provider kind described once: one [`KindSpec`] per kind in [`KINDS`], and one file
//! per kind beside this one (its adapter). What used to be spread over the config, the
//! engine and the surfaces is read from here:
//!
//! - the config's checks and defaults (`config::provider`): which keys a kind needs or takes,
//!   its default `base_url`, API key variable and request timeout, and the hosts that ignore
//!   an idempotency header (a forgotten host there could pay twice, so each kind lists its own
//!   and [`hosts_without_idempotency`] is their union);
//! - how its adapter is built, and where the owner looks for a lost request ([`KindSpec::dashboard`]);
//! - which operations it can offer and offers by default (`domain::operation`);
//! - the test matrices: the mock's base path and a model it serves for the kind
//!   ([`KindSpec::mock_path`], [`KindSpec::mock_model`]), so a test that walks [`KINDS`]
//!   fails for a kind added without its mock routes.
//!
//! Adding a provider kind: its adapter file here, a row of [`KINDS`] (and a constant of
//! [`ProviderKind`]), its mock module (`mock/`), its words in the catalogue, docs and tests.
//! No other file of `src/` names it.

pub mod bfl;
pub mod dashscope;
pub mod fal_queue;
pub mod gemini;
pub mod openai_images;
pub mod openai_responses;
pub mod photoroom;
pub mod replicate;

use std::sync::Arc;
use std::time::Duration;

use super::dashboard::Dashboard;
use super::settings::ProviderConfig;
use super::{Provider, demo};
use crate::domain::operation::Operation;

use Operation::{Cutout, Draft, Edit, Generate};

/// A provider kind's declaration.
#[derive(Debug)]
pub struct KindSpec {
    /// Its name in `kind = "…"`, `GET /v1/providers` and the database.
    pub name: &'static str,
    /// Build its adapter from a checked configuration.
    pub build: fn(&ProviderConfig) -> Result<Arc<dyn Provider>, String>,
    /// What the owner looks at when tally cannot prove what happened to a request.
    pub dashboard: fn(&ProviderConfig) -> Dashboard,
    /// The operations its API offers (a provider's `operations` key may name a subset).
    pub operations: &'static [Operation],
    /// The operations a provider of this kind offers when its `operations` key is absent.
    pub default_operations: &'static [Operation],
    /// Whether it bills at all (the demo does not: it takes no price).
    pub bills: bool,
    /// `base_url` when the config gives none; `None` with [`KindSpec::needs_base_url`] makes
    /// it required.
    pub default_base_url: Option<&'static str>,
    /// Whether it talks to a server at all (every kind but the demo).
    pub needs_base_url: bool,
    /// Whether `model` is required.
    pub needs_model: bool,
    /// The environment variable its key is read from when `api_key_env` is absent (the one
    /// its official SDK reads).
    pub default_key_env: Option<&'static str>,
    /// The default total request timeout. A synchronous kind answers only when the image is
    /// done, which can take minutes, and a timeout after sending is an `unknown`: its default
    /// matches its official SDK's rather than manufacturing unknowns.
    pub request_timeout: Duration,
    /// Whether its create answers with the result (no job to poll).
    pub synchronous: bool,
    /// Its documented hosts that take no idempotency header: `idempotency_header` is refused
    /// for them, because a blind resend there is a second charge.
    pub hosts_without_idempotency: &'static [&'static str],
    /// Config keys only some kinds take (`batch`): such a key set for a kind that does not
    /// list it is refused.
    pub own_keys: &'static [&'static str],
    /// The largest source image (edit, cutout) it takes, in bytes.
    pub max_image_bytes: usize,
    /// Where the mock provider serves this kind, below its address (tests and docs/guide/providers/mock.md).
    pub mock_path: &'static str,
    /// A model the mock serves for this kind (tests; `None` where the kind needs none).
    pub mock_model: Option<&'static str>,
}

const MB: usize = 1 << 20;

/// Every provider kind tally ships, once.
pub const KINDS: &[KindSpec] = &[
    KindSpec {
        name: "demo",
        build: |cfg| Ok(Arc::new(demo::Demo::new(cfg.delay, demo::side(&cfg.size)))),
        dashboard: |_| Dashboard::demo(),
        operations: &[Generate, Edit, Cutout, Draft],
        default_operations: &[Generate, Edit, Cutout, Draft],
        bills: false,
        default_base_url: None,
        needs_base_url: false,
        needs_model: false,
        default_key_env: None,
        request_timeout: Duration::from_secs(120),
        synchronous: true,
        hosts_without_idempotency: &[],
        own_keys: &[],
        max_image_bytes: 10 * MB,
        mock_path: "",
        mock_model: None,
    },
    KindSpec {
        name: "openai_images",
        build: |cfg| Ok(Arc::new(openai_images::OpenaiImages::new(cfg)?)),
        dashboard: openai_images::dashboard,
        operations: &[Generate, Edit],
        default_operations: &[Generate, Edit],
        bills: true,
        default_base_url: None,
        needs_base_url: true,
        needs_model: false,
        default_key_env: None,
        request_timeout: Duration::from_secs(600),
        synchronous: true,
        hosts_without_idempotency: &["api.openai.com"],
        own_keys: &[],
        // gpt-image-1 takes images under 50 MB.
        max_image_bytes: 50 * MB,
        mock_path: "",
        mock_model: Some("gpt-image-2.5-flare"),
    },
    KindSpec {
        name: "replicate",
        build: |cfg| Ok(Arc::new(replicate::Replicate::new(cfg)?)),
        dashboard: replicate::dashboard,
        // Edit: the source goes to the model's image input (FLUX Kontext's `input_image`);
        // cutout: a background-removal model (BiRefNet) named in `model`.
        operations: &[Generate, Edit, Cutout],
        default_operations: &[Generate, Edit],
        bills: true,
        default_base_url: None,
        needs_base_url: true,
        needs_model: true,
        default_key_env: None,
        request_timeout: Duration::from_secs(120),
        synchronous: false,
        hosts_without_idempotency: &["api.replicate.com"],
        own_keys: &[],
        max_image_bytes: 10 * MB,
        mock_path: "",
        mock_model: Some("black-forest-labs/flux-schnell"),
    },
    KindSpec {
        name: "fal_queue",
        build: |cfg| Ok(Arc::new(fal_queue::FalQueue::new(cfg)?)),
        dashboard: fal_queue::dashboard,
        operations: &[Generate, Edit, Cutout],
        default_operations: &[Generate, Edit],
        bills: true,
        default_base_url: None,
        needs_base_url: true,
        needs_model: true,
        default_key_env: None,
        request_timeout: Duration::from_secs(120),
        synchronous: false,
        hosts_without_idempotency: &["queue.fal.run", "fal.run", "queue.falrun.com", "falrun.com", "api.fal.ai"],
        own_keys: &[],
        max_image_bytes: 10 * MB,
        mock_path: "/fal",
        mock_model: Some("fal-ai/flux/dev"),
    },
    KindSpec {
        name: "dashscope",
        build: |cfg| Ok(Arc::new(dashscope::Dashscope::new(cfg)?)),
        dashboard: dashscope::dashboard,
        // Edit: the image-editing models (`imageedit`, `wan2.5-i2i-preview`) take the source.
        operations: &[Generate, Edit],
        default_operations: &[Generate, Edit],
        bills: true,
        default_base_url: Some(dashscope::DEFAULT_BASE_URL),
        needs_base_url: true,
        needs_model: true,
        default_key_env: Some("DASHSCOPE_API_KEY"),
        request_timeout: Duration::from_secs(120),
        synchronous: false,
        hosts_without_idempotency: &["dashscope.aliyuncs.com", "dashscope-intl.aliyuncs.com"],
        own_keys: &[],
        max_image_bytes: 10 * MB,
        mock_path: "/dashscope",
        mock_model: Some("wan2.2-t2i-flash"),
    },
    KindSpec {
        name: "gemini",
        build: |cfg| Ok(Arc::new(gemini::Gemini::new(cfg)?)),
        dashboard: gemini::dashboard,
        // Draft: with a text model and `operations = ["draft"]` (`gemini::draft`).
        operations: &[Generate, Edit, Draft],
        default_operations: &[Generate, Edit],
        bills: true,
        default_base_url: None,
        needs_base_url: true,
        needs_model: true,
        default_key_env: None,
        request_timeout: Duration::from_secs(600),
        synchronous: true,
        hosts_without_idempotency: &["generativelanguage.googleapis.com"],
        own_keys: &["batch"],
        max_image_bytes: 10 * MB,
        mock_path: "/gemini",
        mock_model: Some("gemini-2.5-flash-image"),
    },
    KindSpec {
        name: "bfl",
        build: |cfg| Ok(Arc::new(bfl::Bfl::new(cfg)?)),
        dashboard: bfl::dashboard,
        // Edit: FLUX Kontext's `input_image`.
        operations: &[Generate, Edit],
        default_operations: &[Generate, Edit],
        bills: true,
        default_base_url: None,
        needs_base_url: true,
        needs_model: true,
        default_key_env: None,
        request_timeout: Duration::from_secs(120),
        synchronous: false,
        hosts_without_idempotency: &["api.bfl.ai", "api.bfl.ml", "api.eu.bfl.ai", "api.us.bfl.ai", "api.us1.bfl.ai"],
        own_keys: &[],
        max_image_bytes: 10 * MB,
        mock_path: "/bfl",
        mock_model: Some("flux-pro-1.1"),
    },
    KindSpec {
        name: "photoroom",
        build: |cfg| Ok(Arc::new(photoroom::Photoroom::new(cfg)?)),
        dashboard: photoroom::dashboard,
        operations: &[Cutout],
        default_operations: &[Cutout],
        bills: true,
        default_base_url: Some(photoroom::DEFAULT_BASE_URL),
        needs_base_url: true,
        needs_model: false,
        default_key_env: None,
        request_timeout: Duration::from_secs(120),
        synchronous: true,
        hosts_without_idempotency: &["sdk.photoroom.com", "image-api.photoroom.com"],
        own_keys: &[],
        // The remove-background API takes images up to 30 MB.
        max_image_bytes: 30 * MB,
        mock_path: "",
        mock_model: None,
    },
    KindSpec {
        name: "openai_responses",
        build: |cfg| Ok(Arc::new(openai_responses::OpenaiResponses::new(cfg)?)),
        dashboard: openai_responses::dashboard,
        // Drafting only: the Responses API with image inputs and structured output.
        operations: &[Draft],
        default_operations: &[Draft],
        bills: true,
        default_base_url: Some("https://api.openai.com/v1"),
        needs_base_url: true,
        needs_model: true,
        default_key_env: Some("OPENAI_API_KEY"),
        request_timeout: Duration::from_secs(120),
        synchronous: false,
        hosts_without_idempotency: &["api.openai.com"],
        own_keys: &[],
        max_image_bytes: 20 * MB,
        mock_path: "",
        mock_model: Some("gpt-5-mini"),
    },
    KindSpec {
        name: "dashscope_chat",
        build: |cfg| Ok(Arc::new(dashscope::chat::DashscopeChat::new(cfg)?)),
        dashboard: dashscope::dashboard,
        // Drafting only: Qwen-VL through the OpenAI-compatible chat completions.
        operations: &[Draft],
        default_operations: &[Draft],
        bills: true,
        default_base_url: Some(dashscope::chat::DEFAULT_BASE_URL),
        needs_base_url: true,
        needs_model: true,
        default_key_env: Some("DASHSCOPE_API_KEY"),
        request_timeout: Duration::from_secs(180),
        synchronous: true,
        hosts_without_idempotency: &["dashscope.aliyuncs.com", "dashscope-intl.aliyuncs.com"],
        own_keys: &[],
        max_image_bytes: 10 * MB,
        mock_path: "/dashscope/compatible-mode/v1",
        mock_model: Some("qwen-vl-max"),
    },
];

/// The kind named `name`.
pub fn find(name: &str) -> Option<&'static KindSpec> {
    KINDS.iter().find(|k| k.name == name)
}

/// Every kind's name, for error messages.
pub fn names() -> Vec<&'static str> {
    KINDS.iter().map(|k| k.name).collect()
}

/// Every kind's hosts that take no idempotency header.
pub fn hosts_without_idempotency() -> impl Iterator<Item = &'static str> {
    KINDS.iter().flat_map(|k| k.hosts_without_idempotency.iter().copied())
}

/// A configured provider's kind: a handle on its [`KindSpec`], compared by name. The
/// constants name each kind for code and tests that need a particular one.
#[derive(Clone, Copy)]
pub struct ProviderKind(&'static KindSpec);

#[allow(non_upper_case_globals)]
impl ProviderKind {
    /// The `demo` kind.
    pub const Demo: ProviderKind = ProviderKind(&KINDS[0]);
    /// The `openai_images` kind.
    pub const OpenaiImages: ProviderKind = ProviderKind(&KINDS[1]);
    /// The `replicate` kind.
    pub const Replicate: ProviderKind = ProviderKind(&KINDS[2]);
    /// The `fal_queue` kind.
    pub const FalQueue: ProviderKind = ProviderKind(&KINDS[3]);
    /// The `dashscope` kind.
    pub const Dashscope: ProviderKind = ProviderKind(&KINDS[4]);
    /// The `gemini` kind.
    pub const Gemini: ProviderKind = ProviderKind(&KINDS[5]);
    /// The `bfl` kind.
    pub const Bfl: ProviderKind = ProviderKind(&KINDS[6]);
    /// The `photoroom` kind.
    pub const Photoroom: ProviderKind = ProviderKind(&KINDS[7]);
    /// The `openai_responses` kind.
    pub const OpenaiResponses: ProviderKind = ProviderKind(&KINDS[8]);
    /// The `dashscope_chat` kind.
    pub const DashscopeChat: ProviderKind = ProviderKind(&KINDS[9]);

    /// The kind named `s`.
    pub fn parse(s: &str) -> Option<ProviderKind> {
        find(s).map(ProviderKind)
    }

    /// Its declaration.
    pub fn spec(self) -> &'static KindSpec {
        self.0
    }

    /// The name used in config files.
    pub fn as_str(self) -> &'static str {
        self.0.name
    }

    /// Every kind tally ships.
    pub fn all() -> impl Iterator<Item = ProviderKind> {
        KINDS.iter().map(ProviderKind)
    }
}

impl PartialEq for ProviderKind {
    fn eq(&self, other: &Self) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for ProviderKind {}

impl std::fmt::Debug for ProviderKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_once_with_its_constant_and_consistent_operations() {
        let mut names = names();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), KINDS.len(), "a kind is described twice");
        for (i, k) in [
            ProviderKind::Demo,
            ProviderKind::OpenaiImages,
            ProviderKind::Replicate,
            ProviderKind::FalQueue,
            ProviderKind::Dashscope,
            ProviderKind::Gemini,
            ProviderKind::Bfl,
            ProviderKind::Photoroom,
            ProviderKind::OpenaiResponses,
            ProviderKind::DashscopeChat,
        ]
        .iter()
        .enumerate()
        {
            assert_eq!(k.spec().name, KINDS[i].name);
        }
        assert_eq!(ProviderKind::all().count(), 10, "a kind without its ProviderKind constant");
        for k in KINDS {
            assert!(!k.operations.is_empty(), "{}", k.name);
            assert!(k.default_operations.iter().all(|o| k.operations.contains(o)), "{}", k.name);
            assert_eq!(k.bills, k.name != "demo");
            assert!(!k.bills || !k.hosts_without_idempotency.is_empty(), "{}: a paid kind names its hosts", k.name);
        }
    }

    #[test]
    fn an_openai_compatible_gateway_gets_no_openai_link() {
        use crate::providers::settings::ProviderConfig;
        let at = |url: &str| ProviderConfig {
            kind: ProviderKind::OpenaiImages,
            base_url: Some(url.into()),
            ..ProviderConfig::demo()
        };
        let own = (ProviderKind::OpenaiImages.spec().dashboard)(&at("https://api.openai.com/v1"));
        assert_eq!(own.page, "openai_usage");
        let gw = (ProviderKind::OpenaiImages.spec().dashboard)(&at("https://llm-gateway.example.cn/v1"));
        assert_eq!((gw.page.as_str(), gw.url), ("gateway", None));
    }
}
