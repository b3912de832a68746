//! `[delivery]`: the configured delivery profiles (`[[delivery.profiles]]`) and targets
//! (`[[delivery.targets]]`), checked into [`crate::delivery::profile::Profile`]s and
//! [`TargetConfig`]s. The built-in profiles are added here, and the default `exports` target
//! by [`DeliveryConfig::targets`] (it lives in the data directory, which `--data-dir` may
//! change after the file is read), so those two are everything a delivery can name.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::ConfigError;
use crate::delivery::profile::{self, Profile, ProfileSpec};
use crate::delivery::target::{
    DEFAULT_RETRY_FOR_MS, DEFAULT_TARGET, DEFAULT_TIMEOUT_MS, S3Config, ShopifyConfig, ShopifyPlacement, TargetConfig,
    TargetKind, default_targets,
};

/// The longest `timeout_ms` a target may have: one hour.
const MAX_TIMEOUT_MS: i64 = 3_600_000;
/// The longest `retry_for_ms` an s3 target may have: one hour (0: one try, no retrying).
const MAX_RETRY_FOR_MS: i64 = 3_600_000;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDelivery {
    #[serde(default)]
    profiles: Vec<RawProfile>,
    #[serde(default)]
    targets: Vec<RawTarget>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    name: Option<String>,
    width: Option<i64>,
    height: Option<i64>,
    fit: Option<String>,
    background: Option<String>,
    format: Option<String>,
    quality: Option<i64>,
    max_bytes: Option<i64>,
    min_source: Option<i64>,
    file_name: Option<String>,
    background_rule: Option<String>,
    fill: Option<f64>,
    no_alpha: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    name: Option<String>,
    kind: Option<String>,
    timeout_ms: Option<i64>,
    retry_for_ms: Option<i64>,
    path: Option<PathBuf>,
    endpoint: Option<String>,
    region: Option<String>,
    bucket: Option<String>,
    prefix: Option<String>,
    access_key_id_env: Option<String>,
    secret_access_key_env: Option<String>,
    shop: Option<String>,
    access_token_env: Option<String>,
    api_version: Option<String>,
    base_url: Option<String>,
    placement: Option<String>,
}

/// `[delivery]`, resolved: every profile and target a delivery may name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryConfig {
    /// The built-in profiles followed by the configured ones (names are unique).
    pub profiles: Vec<Profile>,
    /// The configured targets as written (names are unique; a folder's `path` may be
    /// relative): use [`DeliveryConfig::targets`] for the resolved list.
    pub configured_targets: Vec<TargetConfig>,
}

impl DeliveryConfig {
    /// The profile called `name`.
    pub fn profile(&self, name: &str) -> Option<&Profile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    /// Every target a delivery may name, for the data directory `data_dir`: the configured
    /// ones with a relative folder `path` taken inside `data_dir`, plus the default `exports`
    /// folder (`data_dir/exports`) unless a folder target is configured under that name.
    pub fn targets(&self, data_dir: &Path) -> Vec<TargetConfig> {
        let resolved: Vec<TargetConfig> = self
            .configured_targets
            .iter()
            .map(|t| match &t.kind {
                TargetKind::Folder { path } if !path.is_absolute() => {
                    TargetConfig { kind: TargetKind::Folder { path: data_dir.join(path) }, ..t.clone() }
                }
                _ => t.clone(),
            })
            .collect();
        default_targets(&resolved, data_dir)
    }

    /// The target called `name`, for the data directory `data_dir` (see [`Self::targets`]).
    pub fn target(&self, name: &str, data_dir: &Path) -> Option<TargetConfig> {
        self.targets(data_dir).into_iter().find(|t| t.name == name)
    }
}

/// Check `[delivery]`.
pub(super) fn resolve_delivery(raw: RawDelivery, origin: &str) -> Result<DeliveryConfig, ConfigError> {
    let bad = |key: String, reason: String| ConfigError::Invalid { path: origin.into(), key, reason };
    let mut profiles = profile::builtins();
    for (i, p) in raw.profiles.into_iter().enumerate() {
        let spec = ProfileSpec {
            name: p.name,
            width: p.width,
            height: p.height,
            fit: p.fit,
            background: p.background,
            format: p.format,
            quality: p.quality,
            max_bytes: p.max_bytes,
            min_source: p.min_source,
            file_name: p.file_name,
            background_rule: p.background_rule,
            fill: p.fill,
            no_alpha: p.no_alpha,
        };
        let made = Profile::custom(spec).map_err(|e| bad(format!("delivery.profiles[{i}].{}", e.key), e.reason))?;
        if profiles.iter().any(|q| q.name == made.name) {
            return Err(bad(format!("delivery.profiles[{i}].name"), format!("`{}` is configured twice", made.name)));
        }
        profiles.push(made);
    }
    let mut targets: Vec<TargetConfig> = Vec::new();
    for (i, t) in raw.targets.into_iter().enumerate() {
        let made = resolve_target(t).map_err(|(key, reason)| bad(format!("delivery.targets[{i}].{key}"), reason))?;
        if targets.iter().any(|q| q.name == made.name) {
            return Err(bad(format!("delivery.targets[{i}].name"), format!("`{}` is configured twice", made.name)));
        }
        targets.push(made);
    }
    Ok(DeliveryConfig { profiles, configured_targets: targets })
}

/// One `[[delivery.targets]]` entry; errors are (key, reason).
fn resolve_target(t: RawTarget) -> Result<TargetConfig, (&'static str, String)> {
    let name = t.name.ok_or(("name", "is required".to_string()))?;
    profile::check_name(&name).map_err(|r| ("name", r))?;
    let timeout_ms = match t.timeout_ms {
        None => DEFAULT_TIMEOUT_MS,
        Some(n) if (1..=MAX_TIMEOUT_MS).contains(&n) => n as u64,
        Some(n) => return Err(("timeout_ms", format!("{n} must be between 1 and {MAX_TIMEOUT_MS}"))),
    };
    let kind = t.kind.ok_or(("kind", "is required: \"folder\", \"s3\" or \"shopify\"".to_string()))?;
    let shopify_keys = [
        ("shop", t.shop.is_some()),
        ("access_token_env", t.access_token_env.is_some()),
        ("api_version", t.api_version.is_some()),
        ("base_url", t.base_url.is_some()),
        ("placement", t.placement.is_some()),
    ];
    let retry_for = [("retry_for_ms", t.retry_for_ms.is_some())];
    let only = |kind: &str, keys: &[(&'static str, bool)]| -> Result<(), (&'static str, String)> {
        match keys.iter().find(|(_, set)| *set) {
            Some((key, _)) => Err((key, format!("is not a key of a `{kind}` target"))),
            None => Ok(()),
        }
    };
    let kind = match kind.trim() {
        "folder" => {
            only(
                "folder",
                &[
                    ("endpoint", t.endpoint.is_some()),
                    ("region", t.region.is_some()),
                    ("bucket", t.bucket.is_some()),
                    ("prefix", t.prefix.is_some()),
                    ("access_key_id_env", t.access_key_id_env.is_some()),
                    ("secret_access_key_env", t.secret_access_key_env.is_some()),
                ],
            )?;
            only("folder", &shopify_keys)?;
            only("folder", &retry_for)?;
            let path = t.path.ok_or(("path", "is required for a folder target (a local directory)".to_string()))?;
            if path.as_os_str().is_empty() {
                return Err(("path", "is empty".into()));
            }
            TargetKind::Folder { path }
        }
        "s3" => {
            only("s3", &[("path", t.path.is_some())])?;
            only("s3", &shopify_keys)?;
            if name == DEFAULT_TARGET {
                return Err((
                    "name",
                    format!("`{DEFAULT_TARGET}` is the default local folder target; an s3 target needs another name"),
                ));
            }
            let required = |key: &'static str, v: Option<String>| -> Result<String, (&'static str, String)> {
                match v.map(|s| s.trim().to_string()) {
                    Some(s) if !s.is_empty() => Ok(s),
                    _ => Err((key, "is required for an s3 target".to_string())),
                }
            };
            let env_name = |key: &'static str, v: Option<String>| -> Result<String, (&'static str, String)> {
                let v = required(key, v)?;
                if v.contains('=') || v.chars().any(char::is_whitespace) {
                    return Err((
                        key,
                        format!("`{v}` must name an environment variable (the secret itself stays out of the file)"),
                    ));
                }
                Ok(v)
            };
            let endpoint = match t.endpoint.map(|e| e.trim().to_string()) {
                None => None,
                Some(e) if e.starts_with("http://") || e.starts_with("https://") => Some(e),
                Some(e) => return Err(("endpoint", format!("`{e}` must be a URL starting with http:// or https://"))),
            };
            TargetKind::S3(S3Config {
                endpoint,
                region: required("region", t.region)?,
                bucket: required("bucket", t.bucket)?,
                prefix: t.prefix.unwrap_or_default(),
                access_key_id_env: env_name("access_key_id_env", t.access_key_id_env)?,
                secret_access_key_env: env_name("secret_access_key_env", t.secret_access_key_env)?,
                retry_for_ms: match t.retry_for_ms {
                    None => DEFAULT_RETRY_FOR_MS,
                    Some(n) if (0..=MAX_RETRY_FOR_MS).contains(&n) => n as u64,
                    Some(n) => {
                        return Err(("retry_for_ms", format!("{n} must be between 0 and {MAX_RETRY_FOR_MS}")));
                    }
                },
            })
        }
        "shopify" => {
            only(
                "shopify",
                &[
                    ("path", t.path.is_some()),
                    ("endpoint", t.endpoint.is_some()),
                    ("region", t.region.is_some()),
                    ("bucket", t.bucket.is_some()),
                    ("prefix", t.prefix.is_some()),
                    ("access_key_id_env", t.access_key_id_env.is_some()),
                    ("secret_access_key_env", t.secret_access_key_env.is_some()),
                    ("retry_for_ms", t.retry_for_ms.is_some()),
                ],
            )?;
            if name == DEFAULT_TARGET {
                return Err((
                    "name",
                    format!(
                        "`{DEFAULT_TARGET}` is the default local folder target; a shopify target needs another name"
                    ),
                ));
            }
            TargetKind::Shopify(resolve_shopify(t.shop, t.access_token_env, t.api_version, t.base_url, t.placement)?)
        }
        other => return Err(("kind", format!("`{other}` must be \"folder\", \"s3\" or \"shopify\""))),
    };
    Ok(TargetConfig { name, timeout_ms, kind })
}

/// The keys of a `shopify` target; errors are (key, reason).
fn resolve_shopify(
    shop: Option<String>,
    token_env: Option<String>,
    api_version: Option<String>,
    base_url: Option<String>,
    placement: Option<String>,
) -> Result<ShopifyConfig, (&'static str, String)> {
    let shop = shop.map(|s| s.trim().to_ascii_lowercase()).unwrap_or_default();
    let label = shop.strip_suffix(".myshopify.com").unwrap_or("");
    let label_ok = !label.is_empty()
        && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        && !label.starts_with('-')
        && !label.ends_with('-');
    if !label_ok {
        return Err((
            "shop",
            format!(
                "`{shop}` must be the shop's admin domain, NAME.myshopify.com (Shopify admin → Settings → Domains)"
            ),
        ));
    }
    let token_env = token_env.map(|s| s.trim().to_string()).unwrap_or_default();
    if token_env.is_empty() || token_env.contains('=') || token_env.chars().any(char::is_whitespace) {
        return Err((
            "access_token_env",
            "must name an environment variable holding the custom app's Admin API access token (the token itself \
             stays out of the file)"
                .into(),
        ));
    }
    let api_version = api_version.map(|s| s.trim().to_string()).unwrap_or_else(|| DEFAULT_SHOPIFY_API_VERSION.into());
    let version_ok = api_version == "unstable"
        || (api_version.len() == 7
            && api_version.as_bytes()[4] == b'-'
            && api_version.chars().enumerate().all(|(i, c)| i == 4 || c.is_ascii_digit()));
    if !version_ok {
        return Err(("api_version", format!("`{api_version}` must be a Shopify API version such as 2026-01")));
    }
    let base_url = match base_url.map(|b| b.trim().trim_end_matches('/').to_string()) {
        None => format!("https://{shop}"),
        Some(b) if b.starts_with("http://") || b.starts_with("https://") => b,
        Some(b) => return Err(("base_url", format!("`{b}` must be a URL starting with http:// or https://"))),
    };
    let placement = match placement.as_deref().map(str::trim) {
        None | Some("append") => ShopifyPlacement::Append,
        Some("replace") => ShopifyPlacement::Replace,
        Some(other) => return Err(("placement", format!("`{other}` must be \"append\" or \"replace\""))),
    };
    Ok(ShopifyConfig { shop, access_token_env: token_env, api_version, base_url, placement })
}

/// The Admin API version a `shopify` target uses when `api_version` is not set.
const DEFAULT_SHOPIFY_API_VERSION: &str = "2026-01";
