//! What a delivery target answers: the vocabulary shared by every target kind (a local folder,
//! an S3-compatible bucket). The engine records an item's write before it is attempted and
//! confirms it after; these types are what it confirms with.
//!
//! Invariant kept by every target: a file that is already there with other bytes is never
//! overwritten silently ([`Put::Different`]), and a write whose answer was lost is settled by
//! looking ([`Look`]), never by writing again blindly.
//!
//! Past 600 lines because the vocabulary and the one `Target` that dispatches to each kind (with
//! its bounded blocking calls) belong together; each kind's own code lives in its module.

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

/// A settled write: what [`Put`] says, and the id the destination gave the file when it
/// gives one (an S3 object's ETag, with `?versionId=…` in a versioned bucket), kept as the
/// item's `remote_id` and in the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// How the write ended.
    pub put: Put,
    /// The destination's id for the file (`None`: a folder has none).
    pub remote_id: Option<String>,
}

/// What looking for one file at the target finds (to settle an item whose write's answer was
/// lost).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Look {
    /// Nothing of that name is there.
    Absent,
    /// A file of that name is there, with this sha256 (and the destination's id for it, when
    /// it gives one: an S3 object's ETag).
    Present { sha256: String, remote_id: Option<String> },
    /// A file of that name is there and is surely not the one written (its size differs), so
    /// it was not read (plain words what is there).
    Differs(String),
    /// The target cannot say (plain words why).
    CannotTell(String),
}

/// Why a write or a look did not give an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// Nothing was written and trying again may succeed (a 503, a timeout before sending,
    /// a full disk that may be freed).
    #[error("{}", crate::domain::words::english(.0))]
    Transient(String),
    /// Nothing was written and trying again will not help until something is changed (wrong
    /// credentials, a missing bucket or folder, no permission).
    #[error("{}", crate::domain::words::english(.0))]
    Permanent(String),
    /// The write may or may not have landed (the answer was lost after the request left).
    #[error("{}", crate::domain::words::english(.0))]
    Ambiguous(String),
}

impl TargetError {
    /// Its words as the owner is shown them later: a said line where tally made them
    /// (`domain::words::say`), a destination's own words otherwise. Display is English.
    pub fn words(&self) -> &str {
        let (TargetError::Transient(w) | TargetError::Permanent(w) | TargetError::Ambiguous(w)) = self;
        w
    }
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

impl TargetConfig {
    /// The longest one item's steps may take at this target ([`ItemClock`]): `timeout_ms`,
    /// plus `retry_for_ms` for an s3 target.
    pub fn item_budget_ms(&self) -> u64 {
        match &self.kind {
            TargetKind::S3(c) => self.timeout_ms.saturating_add(c.retry_for_ms),
            _ => self.timeout_ms,
        }
    }
}

/// The kinds of target.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
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
    /// `retry_for_ms` (default [`DEFAULT_RETRY_FOR_MS`]): how long one file's busy or lost
    /// answers are tried again, with backoff, before the item ends (see [`ItemClock`]).
    pub retry_for_ms: u64,
}

/// The default `retry_for_ms` of an `s3` target: two minutes of backoff per file.
pub const DEFAULT_RETRY_FOR_MS: u64 = 120_000;

/// The longest reason (`why`) an item keeps, in characters ([`tidy_reason`]).
pub const WHY_MAX_CHARS: usize = 300;

/// One item's clock: every request for one file (a write, a read-back, a `HEAD`) shares one
/// deadline, so a slow or trickling service holds a file for at most `retry_for + timeout`
/// from its first request, not a timeout per step.
///
/// Invariant (enforced by [`ItemClock::request`] and [`ItemClock::may_retry_after`]): no
/// request runs past [`ItemClock::deadline`], no request is longer than `timeout`, and no new
/// try starts after `retry_for` has passed.
#[derive(Debug, Clone, Copy)]
pub struct ItemClock {
    started: std::time::Instant,
    retry_until: std::time::Instant,
    deadline: std::time::Instant,
    timeout: std::time::Duration,
}

impl ItemClock {
    /// A clock starting now: tries may start for `retry_for`, and each request may take
    /// `timeout`, all ending by `retry_for + timeout` from now.
    pub fn start(timeout: std::time::Duration, retry_for: std::time::Duration) -> ItemClock {
        let started = std::time::Instant::now();
        let retry_until = started + retry_for;
        ItemClock { started, retry_until, deadline: retry_until + timeout, timeout }
    }

    /// How long the next request may take: `timeout`, cut to what is left before the
    /// deadline; `None` once it has passed.
    pub fn request(&self) -> Option<std::time::Duration> {
        let left = self.deadline.checked_duration_since(std::time::Instant::now())?;
        (!left.is_zero()).then(|| left.min(self.timeout))
    }

    /// Whether another try may start after waiting `wait`.
    pub fn may_retry_after(&self, wait: std::time::Duration) -> bool {
        std::time::Instant::now() + wait <= self.retry_until
    }

    /// When every step of the item has ended.
    pub fn deadline(&self) -> std::time::Instant {
        self.deadline
    }

    /// How long since the item's clock started.
    pub fn elapsed(&self) -> std::time::Duration {
        self.started.elapsed()
    }
}

/// A reason as an item keeps it: credentials and signatures redacted (each of `secrets`
/// literally, and the values of `Authorization`, `Signature=`, `Credential=`,
/// `X-Amz-Security-Token` and `X-Shopify-Access-Token`, however a service echoed them), control
/// characters and runs of spaces made one space, and at most [`WHY_MAX_CHARS`] characters
/// (the beginning kept: it says what failed). A said line (`domain::words::say`) is kept
/// whole: only its words are tidied, each piece within the bound, a space at a piece's edge
/// kept so the pieces do not run together.
pub fn tidy_reason(text: &str, secrets: &[&str]) -> String {
    if !crate::domain::words::is_said(text) {
        return tidy_words(text, secrets);
    }
    crate::domain::words::map_words(text, &|piece: &str| {
        let tidy = tidy_words(piece, secrets);
        let (lead, trail) = (piece.starts_with(char::is_whitespace), piece.ends_with(char::is_whitespace));
        match tidy.is_empty() {
            true if lead || trail => " ".to_string(),
            true => tidy,
            false => format!("{}{tidy}{}", if lead { " " } else { "" }, if trail { " " } else { "" }),
        }
    })
}

/// [`tidy_reason`] of text that holds no said line.
fn tidy_words(text: &str, secrets: &[&str]) -> String {
    let mut s = text.to_string();
    for secret in secrets.iter().filter(|x| x.len() >= 4) {
        s = s.replace(secret, "[redacted]");
    }
    // Tokens: after `name=`, or after a header-like name followed by `:`, `=`, `"` or `>`,
    // the value goes up to a space or a separator.
    let token_end = |c: char| c.is_whitespace() || ",;&\"'<>".contains(c);
    for marker in ["signature=", "credential="] {
        s = redact_after(&s, marker, false, token_end);
    }
    for marker in ["x-amz-security-token", "x-amz-signature", "x-amz-credential"] {
        s = redact_after(&s, marker, true, token_end);
    }
    // Header values with spaces in them: to the end of the line (or of a quoted or XML value).
    for marker in ["authorization", "x-shopify-access-token"] {
        s = redact_after(&s, marker, true, |c| "\r\n\"<&".contains(c));
    }
    let mut out = String::with_capacity(s.len().min(WHY_MAX_CHARS * 4));
    let mut space = false;
    let mut count = 0;
    for c in s.chars() {
        let c = if c.is_control() || c.is_whitespace() { ' ' } else { c };
        if c == ' ' && (space || out.is_empty()) {
            continue;
        }
        space = c == ' ';
        if count == WHY_MAX_CHARS - 1 {
            out.push('…');
            return out;
        }
        out.push(c);
        count += 1;
    }
    out.trim_end().to_string()
}

/// `s` with the value after each (ASCII case-insensitive) `marker` replaced by `[redacted]`.
/// With `needs_separator`, only where the marker is followed by `:`, `=`, `"`, `'` or `>`
/// (spaces aside), so the word "authorization" in a sentence is left alone.
fn redact_after(s: &str, marker: &str, needs_separator: bool, stop: impl Fn(char) -> bool) -> String {
    let lower = s.to_ascii_lowercase();
    let mut out = String::with_capacity(s.len());
    let mut at = 0;
    while let Some(found) = lower[at..].find(marker) {
        let start = at + found + marker.len();
        out.push_str(&s[at..start]);
        let sep: usize = s[start..].chars().take_while(|c| " \t:=\"'>".contains(*c)).map(char::len_utf8).sum();
        let value_start = start + sep;
        out.push_str(&s[start..value_start]);
        at = value_start;
        if needs_separator && !s[start..value_start].contains([':', '=', '"', '\'', '>']) {
            continue;
        }
        let value: usize = s[value_start..].chars().take_while(|c| !stop(*c)).map(char::len_utf8).sum();
        if value > 0 {
            out.push_str("[redacted]");
        }
        at = value_start + value;
    }
    out.push_str(&s[at..]);
    out
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
#[allow(missing_docs)]
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

    /// The clock for one item's steps at this target, started now (see [`ItemClock`]): a
    /// folder's and a shop's steps share `timeout_ms`; an s3 target's tries go on for
    /// `retry_for_ms`, each request at most `timeout_ms`.
    pub fn clock(&self) -> ItemClock {
        match self {
            Target::Folder(f) => ItemClock::start(f.timeout, std::time::Duration::ZERO),
            Target::S3 { target, .. } => target.clock(),
            Target::Shopify { target, .. } => ItemClock::start(target.timeout(), std::time::Duration::ZERO),
        }
    }

    /// Write `bytes` (lowercase hex sha256 `sha256`) as `name`; never overwrites (see
    /// [`Put`]), within the item's `clock`. A write whose answer was lost has already been
    /// settled by looking when this answers: [`TargetError::Ambiguous`] means looking could not
    /// tell either (the item is `unknown`).
    pub async fn put(
        &self,
        name: &str,
        bytes: Vec<u8>,
        sha256: &str,
        clock: &ItemClock,
    ) -> Result<Stored, TargetError> {
        match self {
            Target::Folder(f) => {
                let Some(limit) = clock.request() else {
                    return Err(TargetError::Transient(format!("writing {name}: the item's time ran out first")));
                };
                let (f, file, sha) = (f.clone(), name.to_string(), sha256.to_string());
                let what = format!("writing {name} to {}", f.path.display());
                let work = tokio::task::spawn_blocking(move || f.put(&file, &bytes, &sha));
                let answer = match tokio::time::timeout(limit, work).await {
                    Ok(Ok(answer)) => answer,
                    Ok(Err(e)) => Err(TargetError::Ambiguous(format!("{what}: the write stopped unexpectedly ({e})"))),
                    Err(_) => Err(TargetError::Ambiguous(format!(
                        "{what} took longer than {} ms; it may still land — look before writing again",
                        limit.as_millis()
                    ))),
                };
                match answer {
                    Ok(put) => Ok(Stored { put, remote_id: None }),
                    // Settled by looking, within what is left of the item's time.
                    Err(TargetError::Ambiguous(why)) => match self.look(name, None, clock).await {
                        Ok(Look::Present { sha256: there, .. }) if there.eq_ignore_ascii_case(sha256) => {
                            Ok(Stored { put: Put::Written, remote_id: None })
                        }
                        Ok(Look::Present { sha256: there, .. }) => {
                            Ok(Stored { put: Put::Different { existing_sha256: Some(there) }, remote_id: None })
                        }
                        _ => Err(TargetError::Ambiguous(why)),
                    },
                    Err(e) => Err(e),
                }
            }
            Target::S3 { target, .. } => target.write(name, bytes, sha256, clock).await,
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

    /// Once a delivery has ended: remove the temporary files an earlier, killed run left for
    /// `names` at a folder ([`super::folder::FolderTarget::sweep`]; `before`: when this run
    /// took the delivery). Other kinds keep no temporary files.
    pub async fn sweep(&self, names: Vec<String>, before: std::time::SystemTime) {
        if let Target::Folder(f) = self {
            let f = f.clone();
            let _ = tokio::task::spawn_blocking(move || f.sweep(&names, before)).await;
        }
    }

    /// What is at `name` (to settle a write whose answer was lost), within the item's
    /// `clock`; `bytes` is the size written, when known (an s3 object without tally's sha256
    /// metadata is read back only when its size is that). Running out of time is
    /// [`TargetError::Transient`].
    pub async fn look(&self, name: &str, bytes: Option<u64>, clock: &ItemClock) -> Result<Look, TargetError> {
        match self {
            Target::Folder(f) => {
                let what = format!("looking for {name} in {}", f.path.display());
                let Some(limit) = clock.request() else {
                    return Err(TargetError::Transient(format!("{what}: the item's time ran out first")));
                };
                let (f, name) = (f.clone(), name.to_string());
                let work = tokio::task::spawn_blocking(move || f.look(&name));
                match tokio::time::timeout(limit, work).await {
                    Ok(Ok(answer)) => answer,
                    Ok(Err(e)) => Err(TargetError::Transient(format!("{what}: stopped unexpectedly ({e})"))),
                    Err(_) => Err(TargetError::Transient(format!("{what} took longer than {} ms", limit.as_millis()))),
                }
            }
            Target::S3 { target, .. } => target.look_within(name, bytes, clock).await,
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
                retry_for_ms: DEFAULT_RETRY_FOR_MS,
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
        let clock = t.clock();
        let stored = |put| Ok(Stored { put, remote_id: None });
        assert_eq!(t.put("a.png", bytes.clone(), &sha, &clock).await, stored(Put::Written));
        assert_eq!(std::fs::read(dir.join("a.png")).expect("on disk"), bytes);
        assert_eq!(t.put("a.png", bytes, &sha, &clock).await, stored(Put::AlreadyThere));
        assert_eq!(t.look("a.png", None, &clock).await, Ok(Look::Present { sha256: sha, remote_id: None }));
        assert_eq!(t.look("b.png", None, &clock).await, Ok(Look::Absent));
    }

    #[test]
    fn reasons_are_short_and_carry_no_credentials() {
        let echoed = "refused: you sent PUT /b/k\r\nAuthorization: AWS4-HMAC-SHA256 \
                      Credential=AKIAEXAMPLE123/20261204/us-east-1/s3/aws4_request, SignedHeaders=host, \
                      Signature=0123abcd\r\nx-amz-security-token: tok3n\r\n<X-Amz-Signature>feed</X-Amz-Signature> \
                      ?X-Amz-Credential=AKIAEXAMPLE123%2F2026&X-Amz-Signature=beef the authorization header is \
                      malformed; hunter2";
        let tidy = tidy_reason(echoed, &["AKIAEXAMPLE123", "hunter2"]);
        for secret in ["AKIAEXAMPLE123", "0123abcd", "tok3n", "feed<", "beef", "hunter2", "AWS4-HMAC"] {
            assert!(!tidy.contains(secret), "{secret} in {tidy}");
        }
        assert!(tidy.starts_with("refused: you sent PUT /b/k Authorization: [redacted]"), "{tidy}");
        assert!(tidy.contains("the authorization header is malformed"), "words stay: {tidy}");
        assert!(!tidy.contains('\n') && !tidy.contains("  "), "{tidy}");
        let long = tidy_reason(&format!("bucket said: {}", "<html>".repeat(100_000)), &[]);
        assert_eq!(long.chars().count(), WHY_MAX_CHARS);
        assert!(long.starts_with("bucket said: <html>") && long.ends_with('…'), "{long}");
        assert_eq!(tidy_reason("  short\n reason ", &[]), "short reason");
    }

    #[test]
    fn an_items_clock_bounds_every_request_and_every_retry() {
        let c = ItemClock::start(std::time::Duration::from_secs(30), std::time::Duration::from_secs(120));
        let first = c.request().expect("time left");
        assert!(first <= std::time::Duration::from_secs(30), "{first:?}");
        assert!(c.may_retry_after(std::time::Duration::from_secs(1)));
        assert!(!c.may_retry_after(std::time::Duration::from_secs(121)));
        assert!(c.deadline() <= std::time::Instant::now() + std::time::Duration::from_secs(150));
        let spent = ItemClock::start(std::time::Duration::ZERO, std::time::Duration::ZERO);
        assert_eq!(spent.request(), None, "nothing is sent past the deadline");
        assert!(!spent.may_retry_after(std::time::Duration::from_millis(1)));
    }
}
