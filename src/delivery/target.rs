//! What a delivery target answers: the vocabulary shared by every target kind (a local folder,
//! an S3-compatible bucket). The engine records an item's write before it is attempted and
//! confirms it after; these types are what it confirms with.
//!
//! Invariant kept by every target: a file that is already there with other bytes is never
//! overwritten silently ([`Put::Different`]), and a write whose answer was lost is settled by
//! looking ([`Look`]), never by writing again blindly.

/// The outcome of writing one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Put {
    /// The file was written and is durable at the target.
    Written,
    /// A file of that name with the same sha256 was already there: delivered, nothing written.
    AlreadyThere,
    /// A file of that name with other bytes is there; nothing was written.
    Different {
        /// The sha256 of what is there, when the target can tell.
        existing_sha256: Option<String>,
    },
}

/// What looking for one file at the target finds (to settle an item whose write's answer was
/// lost).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Look {
    /// Nothing of that name is there.
    Absent,
    /// A file of that name is there, with this sha256.
    Present { sha256: String },
    /// The target cannot say (plain words why).
    CannotTell(String),
}

/// Why a write or a look did not give an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// Nothing was written and trying again may succeed (a 503, a timeout before sending,
    /// a full disk that may be freed).
    #[error("{0}")]
    Transient(String),
    /// Nothing was written and trying again will not help until something is changed (wrong
    /// credentials, a missing bucket or folder, no permission).
    #[error("{0}")]
    Permanent(String),
    /// The write may or may not have landed (the answer was lost after the request left).
    #[error("{0}")]
    Ambiguous(String),
}

/// One configured target (`[[delivery.targets]]`), resolved from the config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetConfig {
    /// The name a delivery names (`"target": NAME`, `--to NAME`).
    pub name: String,
    /// How long one item's write may take, in milliseconds (`timeout_ms`, default 30000).
    pub timeout_ms: u64,
    /// Where the files go.
    pub kind: TargetKind,
}

/// The kinds of target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetKind {
    /// A local directory (`kind = "folder"`, `path`).
    Folder { path: std::path::PathBuf },
    /// An S3-compatible bucket (`kind = "s3"`).
    S3(S3Config),
    /// A Shopify store's product media (`kind = "shopify"`), through the Admin GraphQL API.
    Shopify(ShopifyConfig),
}

/// Where on the product a `shopify` target puts a delivery's images (`placement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShopifyPlacement {
    /// Added after the product's existing media (`append`, the default).
    Append,
    /// The product's media become exactly the delivery's files (`replace`).
    Replace,
}

/// The keys of a `shopify` target. The access token is read from the named environment
/// variable when the target is used, never stored in the config, the database or an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShopifyConfig {
    /// `shop`: the admin domain, `NAME.myshopify.com`.
    pub shop: String,
    /// `access_token_env`: the environment variable holding a custom app's Admin API token.
    pub access_token_env: String,
    /// `api_version`, e.g. `2026-01`.
    pub api_version: String,
    /// `base_url` (default `https://{shop}`); the endpoint is
    /// `{base_url}/admin/api/{api_version}/graphql.json`.
    pub base_url: String,
    /// `placement`.
    pub placement: ShopifyPlacement,
}

/// The keys of an `s3` target. Credentials are read from the named environment variables when
/// the target is used, never stored in the config or the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Config {
    /// The service's URL (`endpoint`); `None` means AWS itself for `region`.
    pub endpoint: Option<String>,
    /// `region`, e.g. `us-east-1`.
    pub region: String,
    /// `bucket`.
    pub bucket: String,
    /// `prefix` put before every file name (may be empty; a trailing `/` is not added for you).
    pub prefix: String,
    /// `access_key_id_env`: the environment variable holding the access key id.
    pub access_key_id_env: String,
    /// `secret_access_key_env`: the environment variable holding the secret key.
    pub secret_access_key_env: String,
}

/// The name of the target that exists with no configuration: a folder `exports` in the data
/// directory ([`default_targets`]).
pub const DEFAULT_TARGET: &str = "exports";

/// The default `timeout_ms` of a target: 30 seconds for one item's write.
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;

/// The targets a configuration gives, with `exports` added when it is not configured: a
/// `folder` target named `exports` at `DATA_DIR/exports`. A configured target may take the
/// name `exports` only as a folder (it then replaces the default, at its own `path`); the
/// config refuses `exports` for another kind, so `--to exports` always means a local folder.
pub fn default_targets(configured: &[TargetConfig], data_dir: &std::path::Path) -> Vec<TargetConfig> {
    let mut out = configured.to_vec();
    if !out.iter().any(|t| t.name == DEFAULT_TARGET) {
        out.push(TargetConfig {
            name: DEFAULT_TARGET.into(),
            timeout_ms: DEFAULT_TIMEOUT_MS,
            kind: TargetKind::Folder { path: data_dir.join(DEFAULT_TARGET) },
        });
    }
    out
}

/// A target ready to write to, built from its [`TargetConfig`] ([`Target::from_config`]).
/// `put` and `look` are async: the blocking work runs off the async runtime and one call may
/// take at most the target's `timeout_ms`.
#[derive(Debug, Clone)]
pub enum Target {
    /// A local directory ([`super::folder::FolderTarget`]).
    Folder(super::folder::FolderTarget),
    /// An S3-compatible bucket ([`super::s3::S3Target`]; its own requests carry `timeout_ms`).
    S3 { name: String, target: std::sync::Arc<super::s3::S3Target> },
    /// A Shopify product's media ([`super::shopify::ShopifyTarget`]): files go through
    /// [`super::shopify::ShopifyTarget::deliver`], not [`Target::put`].
    Shopify { name: String, target: std::sync::Arc<super::shopify::ShopifyTarget> },
}

/// What a destination can prove or offer when a write's answer was lost (issue #38), declared
/// by each kind ([`Target::capabilities`]) and read by the delivery runner, as the engine
/// reads a provider's capabilities: an item whose answer was lost is looked up when the
/// target can find it by name, written again only when the repeat cannot double or overwrite
/// anything (a conditional create or a set), and otherwise left `unknown` with the reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Writing the same thing again replaces a slot or a list: repeating it is harmless.
    pub set: bool,
    /// A file can be found by its (deterministic) name after a lost answer.
    pub find_by_name: bool,
    /// An upload nothing references yet is harmless when left behind.
    pub orphan_harmless: bool,
    /// A create fails when the name is taken, so a repeat never overwrites or doubles.
    pub conditional_create: bool,
}

impl Capabilities {
    /// Whether an item whose write's answer was lost may be settled by looking, then written
    /// again when nothing is there.
    pub fn can_settle(self) -> bool {
        self.find_by_name && (self.conditional_create || self.set)
    }
}

impl Target {
    /// Build the target a config describes. An `s3` target reads its credentials from the
    /// environment variables it names now; a missing one is a [`TargetError::Permanent`].
    pub fn from_config(config: &TargetConfig) -> Result<Target, TargetError> {
        let timeout = std::time::Duration::from_millis(config.timeout_ms.max(1));
        match &config.kind {
            TargetKind::Folder { path } => Ok(Target::Folder(super::folder::FolderTarget {
                name: config.name.clone(),
                path: path.clone(),
                timeout,
            })),
            TargetKind::S3(cfg) => Ok(Target::S3 {
                name: config.name.clone(),
                target: std::sync::Arc::new(super::s3::S3Target::new(cfg, config.timeout_ms)?),
            }),
            TargetKind::Shopify(cfg) => Ok(Target::Shopify {
                name: config.name.clone(),
                target: std::sync::Arc::new(super::shopify::ShopifyTarget::new(cfg, config.timeout_ms)?),
            }),
        }
    }

    /// What this kind of target can prove after a lost answer (see [`Capabilities`]): a
    /// folder and a bucket find a file by name and create only where the name is free; a
    /// Shopify product finds a file by name (`files(query: "filename:…")`), creates it with
    /// `RAISE_ERROR` on a taken name, attaches it with a set-like reference, and leaves a
    /// staged upload nothing uses harmlessly behind.
    pub fn capabilities(&self) -> Capabilities {
        match self {
            Target::Folder(_) | Target::S3 { .. } => {
                Capabilities { set: false, find_by_name: true, orphan_harmless: false, conditional_create: true }
            }
            Target::Shopify { .. } => {
                Capabilities { set: true, find_by_name: true, orphan_harmless: true, conditional_create: true }
            }
        }
    }

    /// The target's name.
    pub fn name(&self) -> &str {
        match self {
            Target::Folder(f) => &f.name,
            Target::S3 { name, .. } | Target::Shopify { name, .. } => name,
        }
    }

    /// Where the files go, in words for the owner (a folder's path).
    pub fn location(&self) -> String {
        match self {
            Target::Folder(f) => f.path.display().to_string(),
            Target::S3 { target, .. } => target.location(),
            Target::Shopify { target, .. } => target.location(),
        }
    }

    /// Write `bytes` (lowercase hex sha256 `sha256`) as `name`; never overwrites (see
    /// [`Put`]). A write that takes longer than `timeout_ms` answers
    /// [`TargetError::Ambiguous`]: it may still land, so look before writing again.
    pub async fn put(&self, name: &str, bytes: Vec<u8>, sha256: &str) -> Result<Put, TargetError> {
        match self {
            Target::Folder(f) => {
                let (f, name, sha256) = (f.clone(), name.to_string(), sha256.to_string());
                let timeout = f.timeout;
                let what = format!("writing {name} to {}", f.path.display());
                let work = tokio::task::spawn_blocking(move || f.put(&name, &bytes, &sha256));
                match tokio::time::timeout(timeout, work).await {
                    Ok(Ok(answer)) => answer,
                    Ok(Err(e)) => Err(TargetError::Ambiguous(format!("{what}: the write stopped unexpectedly ({e})"))),
                    Err(_) => Err(TargetError::Ambiguous(format!(
                        "{what} took longer than {} ms; it may still land — look before writing again",
                        timeout.as_millis()
                    ))),
                }
            }
            Target::S3 { target, .. } => target.put(name, bytes, sha256).await,
            Target::Shopify { .. } => Err(TargetError::Permanent(
                "a shopify target takes files only for a product (`shopify_product`)".into(),
            )),
        }
    }

    /// Write a delivery's manifest (`manifest.csv`, `manifest.json`) as `name`, replacing an
    /// earlier delivery's: the one kind of file a target overwrites.
    pub async fn replace(&self, name: &str, bytes: Vec<u8>) -> Result<(), TargetError> {
        match self {
            Target::Folder(f) => {
                let (f, name) = (f.clone(), name.to_string());
                let timeout = f.timeout;
                let work = tokio::task::spawn_blocking(move || f.replace(&name, &bytes));
                match tokio::time::timeout(timeout, work).await {
                    Ok(Ok(answer)) => answer,
                    Ok(Err(e)) => {
                        Err(TargetError::Transient(format!("writing the manifest stopped unexpectedly ({e})")))
                    }
                    Err(_) => Err(TargetError::Transient(format!(
                        "writing the manifest took longer than {} ms",
                        timeout.as_millis()
                    ))),
                }
            }
            Target::S3 { target, .. } => target.replace(name, bytes).await,
            // A shop has no place for a manifest: the delivery's records (items with their
            // sha256 and remote ids) are its manifest.
            Target::Shopify { .. } => Ok(()),
        }
    }

    /// What is at `name` (to settle a write whose answer was lost). Longer than `timeout_ms`
    /// is [`TargetError::Transient`].
    pub async fn look(&self, name: &str) -> Result<Look, TargetError> {
        match self {
            Target::Folder(f) => {
                let (f, name) = (f.clone(), name.to_string());
                let timeout = f.timeout;
                let what = format!("looking for {name} in {}", f.path.display());
                let work = tokio::task::spawn_blocking(move || f.look(&name));
                match tokio::time::timeout(timeout, work).await {
                    Ok(Ok(answer)) => answer,
                    Ok(Err(e)) => Err(TargetError::Transient(format!("{what}: stopped unexpectedly ({e})"))),
                    Err(_) => {
                        Err(TargetError::Transient(format!("{what} took longer than {} ms", timeout.as_millis())))
                    }
                }
            }
            Target::S3 { target, .. } => target.look(name).await,
            Target::Shopify { .. } => {
                Ok(Look::CannotTell("a shopify file is looked up by its own flow, not by a file name alone".into()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(name: &str, path: &std::path::Path) -> TargetConfig {
        TargetConfig {
            name: name.into(),
            timeout_ms: DEFAULT_TIMEOUT_MS,
            kind: TargetKind::Folder { path: path.into() },
        }
    }

    #[test]
    fn exports_exists_with_no_configuration_and_a_configured_one_replaces_it() {
        let data = std::path::Path::new("/data");
        let t = default_targets(&[], data);
        assert_eq!(t, [folder("exports", &data.join("exports"))]);
        let mine = folder("exports", std::path::Path::new("/elsewhere"));
        assert_eq!(default_targets(std::slice::from_ref(&mine), data), [mine]);
        let out = folder("out", std::path::Path::new("/out"));
        assert_eq!(default_targets(std::slice::from_ref(&out), data), [out, folder("exports", &data.join("exports"))]);
    }

    #[test]
    fn an_s3_target_without_its_credentials_is_refused_plainly() {
        let c = TargetConfig {
            name: "bucket".into(),
            timeout_ms: 1000,
            kind: TargetKind::S3(S3Config {
                endpoint: None,
                region: "us-east-1".into(),
                bucket: "b".into(),
                prefix: String::new(),
                access_key_id_env: "TALLY_TEST_TARGET_NO_SUCH_KEY".into(),
                secret_access_key_env: "TALLY_TEST_TARGET_NO_SUCH_SECRET".into(),
            }),
        };
        match Target::from_config(&c) {
            Err(TargetError::Permanent(why)) => assert!(why.contains("TALLY_TEST_TARGET_NO_SUCH_KEY"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn the_async_target_writes_and_looks_at_the_disk() {
        let dir = std::env::temp_dir().join(format!("tally-target-{}", uuid::Uuid::new_v4()));
        let t = Target::from_config(&folder("out", &dir)).expect("folder");
        assert_eq!(t.name(), "out");
        let bytes = b"image".to_vec();
        let sha = crate::delivery::render::sha256_hex(&bytes);
        assert_eq!(t.put("a.png", bytes.clone(), &sha).await, Ok(Put::Written));
        assert_eq!(std::fs::read(dir.join("a.png")).expect("on disk"), bytes);
        assert_eq!(t.put("a.png", bytes, &sha).await, Ok(Put::AlreadyThere));
        assert_eq!(t.look("a.png").await, Ok(Look::Present { sha256: sha }));
        assert_eq!(t.look("b.png").await, Ok(Look::Absent));
    }
}
