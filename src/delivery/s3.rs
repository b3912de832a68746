//! The `s3` delivery target: files put into any S3-compatible bucket, signed with SigV4 by
//! `object_store` (its `aws` client on tally's own reqwest and ring; no second TLS stack). The
//! HTTP side (bodies capped, answers sorted for a retry) is [`super::s3_http`].
//!
//! Invariants kept here:
//! - Nothing is ever overwritten: every write is a conditional create (`If-None-Match: *`), so
//!   a name that is already taken answers 412 and the object there is read back and compared
//!   ([`Put::AlreadyThere`] or [`Put::Different`]). This holds on services that honour
//!   `If-None-Match` on PutObject (AWS S3 since 2024, R2, MinIO, moto); a service that ignores
//!   it would let a second write replace the first, and no client can prevent that.
//! - A write whose answer was lost or late (a reset connection, a timeout) is settled by
//!   reading the object back before anything is written again: our bytes there →
//!   [`Put::Written`]; other bytes → [`Put::Different`]; nothing there → written again, and
//!   that repeat is a conditional create too, so a lost write that lands late is found, not
//!   doubled. A read-back that cannot be made by the item's deadline → [`TargetError::Ambiguous`].
//! - Busy answers (`503 SlowDown`, `500`, `429`), connections that could not be made, and
//!   writes settled as "nothing landed" are tried again with exponential backoff and jitter
//!   for `retry_for_ms` ([`ItemClock`]); every request of the item (writes, read-backs,
//!   `HEAD`s) ends by one deadline, `retry_for_ms + timeout_ms` after its first. A 403 or a
//!   missing bucket ends the item at once, naming the credentials or the bucket.
//! - A read-back reads at most the size written (a different size is a different object,
//!   not read at all); error bodies at most 4 KB ([`super::s3_http::BODY_MAX`]). Every
//!   reason leaving this module is short and carries neither the access key id, the secret,
//!   nor a signature ([`tidy_reason`]).
//! - `object_store`'s own retries are off: every attempt is one request, and the retrying is
//!   this module's, on the answer classified by [`super::s3_http::classify`].
//!
//! Each object carries its sha256 twice: as user metadata `x-amz-meta-sha256` (hex; read by
//! [`S3Target::look`] with one HEAD), and as the S3 checksum header `x-amz-checksum-sha256`,
//! which AWS S3 checks against the body it received (moto does not). Settling a write
//! always hashes the bytes read back; `look` does so only when the metadata is missing.

use std::time::Duration;

use futures_util::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder, Checksum, S3ConditionalPut};
use object_store::client::ClientOptions;
use object_store::path::Path;
use object_store::{Attribute, Attributes, GetOptions, ObjectStore, PutMode, PutOptions, PutPayload, RetryConfig};
use sha2::{Digest, Sha256};

use super::s3_http::{Class, Connector, classify};
use super::target::{ItemClock, Look, Put, S3Config, Stored, TargetError, tidy_reason};

/// The metadata key under which the object's sha256 (lowercase hex) is stored.
const SHA256_METADATA: &str = "sha256";

/// The first wait before trying again; it doubles per try up to [`BACKOFF_MAX`].
const BACKOFF_FIRST: Duration = Duration::from_millis(200);
/// The longest wait between two tries.
const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// An access key pair for a bucket.
#[derive(Clone)]
pub struct Credentials {
    /// The access key id.
    pub access_key_id: String,
    /// The secret access key (never printed: `Debug` leaves it out).
    pub secret_access_key: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"…")
            .finish()
    }
}

impl Credentials {
    /// Read the key pair from the environment variables `cfg` names. A missing or empty
    /// variable is a [`TargetError::Permanent`] naming it.
    pub fn from_env(cfg: &S3Config) -> Result<Self, TargetError> {
        let read = |var: &str, what: &str| match std::env::var(var) {
            Ok(v) if !v.trim().is_empty() => Ok(v),
            Ok(_) => Err(TargetError::Permanent(format!(
                "the S3 bucket `{}`'s {what} is read from the environment variable {var}, which is empty",
                cfg.bucket
            ))),
            Err(_) => Err(TargetError::Permanent(format!(
                "the S3 bucket `{}`'s {what} is read from the environment variable {var}, which is not set",
                cfg.bucket
            ))),
        };
        Ok(Credentials {
            access_key_id: read(&cfg.access_key_id_env, "access key id")?,
            secret_access_key: read(&cfg.secret_access_key_env, "secret access key")?,
        })
    }
}

/// One S3-compatible bucket (and prefix) that files are delivered to.
pub struct S3Target {
    store: AmazonS3,
    bucket: String,
    prefix: String,
    /// The limit of one request (`timeout_ms`).
    timeout: Duration,
    /// How long an item's tries go on (`retry_for_ms`).
    retry_for: Duration,
    /// What a reason must never show: the access key id and the secret.
    secrets: [String; 2],
}

impl std::fmt::Debug for S3Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Target").field("bucket", &self.bucket).field("prefix", &self.prefix).finish()
    }
}

/// What reading an object back found.
enum Found {
    Absent,
    /// Our bytes, and the object's remote id.
    Ours(Option<String>),
    /// Other bytes (their sha256 when read or in the metadata).
    Other(Option<String>),
}

/// What one try of a write came to: done, or worth another try (why), or over.
enum Try {
    Again(String),
    Over(TargetError),
}

impl S3Target {
    /// The target for `cfg`, with credentials from the environment variables it names and
    /// `timeout_ms` as the limit of one request (a write, or one read-back).
    pub fn new(cfg: &S3Config, timeout_ms: u64) -> Result<Self, TargetError> {
        Self::with_credentials(cfg, timeout_ms, Credentials::from_env(cfg)?)
    }

    /// The target for `cfg` with the given credentials (tests, and callers that hold them).
    pub fn with_credentials(cfg: &S3Config, timeout_ms: u64, creds: Credentials) -> Result<Self, TargetError> {
        // reqwest is built without a default crypto provider; install ring once per process.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let timeout = Duration::from_millis(timeout_ms.max(1));
        let client = reqwest::Client::builder()
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .timeout(timeout)
            .build()
            .map_err(|e| TargetError::Permanent(format!("the S3 client could not be set up: {e}")))?;
        let allow_http = cfg.endpoint.as_deref().is_some_and(|e| e.starts_with("http://"));
        let secrets = [creds.access_key_id.clone(), creds.secret_access_key.clone()];
        let mut builder = AmazonS3Builder::new()
            .with_region(&cfg.region)
            .with_bucket_name(&cfg.bucket)
            .with_access_key_id(creds.access_key_id)
            .with_secret_access_key(creds.secret_access_key)
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .with_checksum_algorithm(Checksum::SHA256)
            .with_retry(RetryConfig { max_retries: 0, retry_timeout: timeout, ..RetryConfig::default() })
            .with_client_options(ClientOptions::new().with_allow_http(allow_http).with_timeout(timeout))
            .with_http_connector(Connector(client));
        if let Some(endpoint) = &cfg.endpoint {
            // Path-style addressing (`endpoint/bucket/key`) works on every S3-compatible service;
            // virtual-hosted names need DNS that local services do not have.
            builder = builder.with_endpoint(endpoint.trim_end_matches('/')).with_virtual_hosted_style_request(false);
        }
        let store = builder.build().map_err(|e| {
            TargetError::Permanent(format!("the S3 target for bucket `{}` is misconfigured: {e}", cfg.bucket))
        })?;
        Ok(S3Target {
            store,
            bucket: cfg.bucket.clone(),
            prefix: cfg.prefix.clone(),
            timeout,
            retry_for: Duration::from_millis(cfg.retry_for_ms),
            secrets,
        })
    }

    /// A new item's clock: tries for `retry_for_ms`, each request at most `timeout_ms`.
    pub fn clock(&self) -> ItemClock {
        ItemClock::start(self.timeout, self.retry_for)
    }

    /// The object key for a file name: the prefix, then the name.
    fn path(&self, name: &str) -> Result<Path, TargetError> {
        let key = format!("{}{}", self.prefix, name);
        Path::parse(&key).map_err(|e| {
            TargetError::Permanent(format!("`{key}` cannot be an object key in bucket `{}`: {e}", self.bucket))
        })
    }

    /// `e` as it may leave this module: short, no credentials ([`tidy_reason`]).
    fn tidy(&self, e: TargetError) -> TargetError {
        let t = |s: String| tidy_reason(&s, &[&self.secrets[0], &self.secrets[1]]);
        match e {
            TargetError::Transient(s) => TargetError::Transient(t(s)),
            TargetError::Permanent(s) => TargetError::Permanent(t(s)),
            TargetError::Ambiguous(s) => TargetError::Ambiguous(t(s)),
        }
    }

    /// [`Self::write`] with a clock started now (tests, and callers with no item).
    pub async fn put(&self, name: &str, bytes: Vec<u8>, sha256_hex: &str) -> Result<Put, TargetError> {
        self.write(name, bytes, sha256_hex, &self.clock()).await.map(|s| s.put)
    }

    /// Write `bytes` as `name` unless something of that name is there already, trying again
    /// within `clock` (see the module doc). `sha256_hex` is the sha256 the delivery recorded
    /// for these bytes; it is checked against them first.
    pub async fn write(
        &self,
        name: &str,
        bytes: Vec<u8>,
        sha256_hex: &str,
        clock: &ItemClock,
    ) -> Result<Stored, TargetError> {
        let ours = sha256_hex.to_ascii_lowercase();
        let actual = hex_sha256(&bytes);
        if actual != ours {
            return Err(TargetError::Permanent(format!(
                "`{name}`: the bytes to deliver have sha256 {actual}, not the recorded {ours}; nothing was sent"
            )));
        }
        let path = self.path(name)?;
        let payload = PutPayload::from(bytes);
        let mut tries = 0u32;
        loop {
            tries += 1;
            let why = match self.try_write(&path, &payload, &ours, clock).await {
                Ok(stored) => return Ok(stored),
                Err(Try::Over(e)) => return Err(self.tidy(e)),
                Err(Try::Again(why)) => why,
            };
            let wait = backoff(tries);
            if !clock.may_retry_after(wait) {
                return Err(self.tidy(TargetError::Transient(format!(
                    "{why} (tried {tries} times in {} s, retry_for_ms = {})",
                    clock.elapsed().as_secs(),
                    self.retry_for.as_millis()
                ))));
            }
            tokio::time::sleep(wait).await;
        }
    }

    /// One write, settled when its answer was lost.
    async fn try_write(&self, path: &Path, payload: &PutPayload, ours: &str, clock: &ItemClock) -> Result<Stored, Try> {
        let Some(limit) = clock.request() else {
            return Err(Try::Over(TargetError::Transient(format!(
                "writing `{path}` to bucket `{}`: the item's time ran out; nothing more was sent",
                self.bucket
            ))));
        };
        let mut attributes = Attributes::new();
        attributes.insert(Attribute::Metadata(SHA256_METADATA.into()), ours.to_string().into());
        if let Some(ct) = content_type(path.as_ref()) {
            attributes.insert(Attribute::ContentType, ct.into());
        }
        let opts = PutOptions { mode: PutMode::Create, attributes, ..PutOptions::default() };
        let len = payload.content_length() as u64;
        let class = match tokio::time::timeout(limit, self.store.put_opts(path, payload.clone(), opts)).await {
            Ok(Ok(r)) => return Ok(Stored { put: Put::Written, remote_id: remote_id(r.e_tag, r.version) }),
            Ok(Err(e)) => classify(&e),
            Err(_) => Class::MaybeSent(format!("no answer within {} ms", limit.as_millis())),
        };
        let b = &self.bucket;
        match class {
            Class::Taken => match self.read_back(path, ours, len, clock).await {
                Ok(Found::Ours(remote_id)) => Ok(Stored { put: Put::AlreadyThere, remote_id }),
                Ok(Found::Other(existing_sha256)) => {
                    Ok(Stored { put: Put::Different { existing_sha256 }, remote_id: None })
                }
                // 409: another write of that name was in progress and has not landed.
                Ok(Found::Absent) => Err(Try::Again(format!(
                    "`{path}` in bucket `{b}`: another write of that name was in progress; nothing was written"
                ))),
                Err(e) => Err(Try::Again(format!(
                    "`{path}` in bucket `{b}` is already there, and reading it back to compare failed: {e}"
                ))),
            },
            Class::MaybeSent(why) => match self.read_back(path, ours, len, clock).await {
                Ok(Found::Ours(remote_id)) => Ok(Stored { put: Put::Written, remote_id }),
                Ok(Found::Other(existing_sha256)) => {
                    Ok(Stored { put: Put::Different { existing_sha256 }, remote_id: None })
                }
                Ok(Found::Absent) => Err(Try::Again(format!(
                    "the answer to writing `{path}` to bucket `{b}` was lost ({}), and the object is not there: \
                     nothing landed",
                    short(&why)
                ))),
                Err(e) => Err(Try::Over(TargetError::Ambiguous(format!(
                    "`{path}` in bucket `{b}` may or may not be there: the answer to writing it was lost ({}), \
                     and reading it back failed too ({})",
                    short(&why),
                    short(&e.to_string())
                )))),
            },
            Class::Busy(_) | Class::NotSent(_) => Err(Try::Again(self.error(class, "writing", path).to_string())),
            other => Err(Try::Over(self.error(other, "writing", path))),
        }
    }

    /// Write `bytes` as `name`, replacing whatever is there: only for a delivery's manifests,
    /// which tally alone names. Never used for an image.
    pub async fn replace(&self, name: &str, bytes: Vec<u8>) -> Result<(), TargetError> {
        let path = self.path(name)?;
        let mut attributes = Attributes::new();
        attributes.insert(Attribute::Metadata(SHA256_METADATA.into()), hex_sha256(&bytes).into());
        if let Some(ct) = content_type(name) {
            attributes.insert(Attribute::ContentType, ct.into());
        }
        let opts = PutOptions { mode: PutMode::Overwrite, attributes, ..PutOptions::default() };
        match self.store.put_opts(&path, PutPayload::from(bytes), opts).await {
            Ok(_) => Ok(()),
            Err(e) => Err(self.tidy(self.error(classify(&e), "writing", &path))),
        }
    }

    /// Where files go, in words: `s3://bucket/prefix`.
    pub fn location(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }

    /// [`Self::look_within`] with a clock started now, not knowing the size.
    pub async fn look(&self, name: &str) -> Result<Look, TargetError> {
        self.look_within(name, None, &self.clock()).await
    }

    /// What is at `name`: one HEAD, and the sha256 from the object's metadata. An object with
    /// none (written by something other than tally) is read back and hashed when its size is
    /// `bytes`, and is [`Look::Differs`] when it is another size. A missing bucket reads as
    /// [`Look::Absent`] (a HEAD's 404 carries no body to tell the two apart); a write there
    /// then fails plainly.
    pub async fn look_within(&self, name: &str, bytes: Option<u64>, clock: &ItemClock) -> Result<Look, TargetError> {
        let path = self.path(name)?;
        let Some(limit) = clock.request() else {
            return Err(TargetError::Transient(format!("looking for `{path}`: the item's time ran out")));
        };
        let head = GetOptions { head: true, ..GetOptions::default() };
        let answer = match tokio::time::timeout(limit, self.store.get_opts(&path, head)).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                return match classify(&e) {
                    Class::NotFound => Ok(Look::Absent),
                    other => Err(self.tidy(self.error(other, "looking for", &path))),
                };
            }
            Err(_) => {
                let why = format!("no answer within {} ms", limit.as_millis());
                return Err(self.tidy(self.error(Class::MaybeSent(why), "looking for", &path)));
            }
        };
        let meta = answer.attributes.get(&Attribute::Metadata(SHA256_METADATA.into())).map(|v| v.to_string());
        let id = remote_id(answer.meta.e_tag.clone(), answer.meta.version.clone());
        if let Some(sha) = meta.filter(|s| is_sha256_hex(s)) {
            return Ok(Look::Present { sha256: sha.to_ascii_lowercase(), remote_id: id });
        }
        let size = answer.meta.size;
        match bytes {
            None => Ok(Look::CannotTell(format!(
                "`{path}` in bucket `{}` has no sha256 metadata, and the size written is not known to compare",
                self.bucket
            ))),
            Some(len) if len != size => Ok(Look::Differs(format!(
                "`{path}` in bucket `{}` is {size} bytes, not the {len} written",
                self.bucket
            ))),
            Some(len) => match self.read_back(&path, "", len, clock).await {
                Ok(Found::Absent) => Ok(Look::Absent),
                Ok(Found::Other(Some(sha256))) => Ok(Look::Present { sha256, remote_id: id }),
                Ok(Found::Ours(_) | Found::Other(None)) => {
                    Ok(Look::Differs(format!("`{path}` in bucket `{}` changed while it was read", self.bucket)))
                }
                Err(e) => Err(self.tidy(e)),
            },
        }
    }

    /// Read the object at `path` back, reading at most `len` bytes (the size written), and
    /// compare it with `ours`; a busy or lost read-back is tried again within `clock`.
    async fn read_back(&self, path: &Path, ours: &str, len: u64, clock: &ItemClock) -> Result<Found, TargetError> {
        let mut tries = 0u32;
        loop {
            tries += 1;
            let Some(limit) = clock.request() else {
                return Err(TargetError::Transient("the item's time ran out before it could be read back".into()));
            };
            let class = match tokio::time::timeout(limit, self.read_once(path, ours, len)).await {
                Ok(Ok(found)) => return Ok(found),
                Ok(Err(e)) => classify(&e),
                Err(_) => Class::MaybeSent(format!("no answer within {} ms", limit.as_millis())),
            };
            match class {
                Class::NotFound => return Ok(Found::Absent),
                Class::Busy(_) | Class::NotSent(_) | Class::MaybeSent(_) => {
                    let wait = backoff(tries);
                    if !clock.may_retry_after(wait) {
                        return Err(self.error(class, "reading back", path));
                    }
                    tokio::time::sleep(wait).await;
                }
                other => return Err(self.error(other, "reading back", path)),
            }
        }
    }

    /// One read-back (see [`Self::read_back`]).
    async fn read_once(&self, path: &Path, ours: &str, len: u64) -> object_store::Result<Found> {
        let got = self.store.get_opts(path, GetOptions::default()).await?;
        let meta_sha = got.attributes.get(&Attribute::Metadata(SHA256_METADATA.into())).map(|v| v.to_string());
        if got.meta.size != len {
            return Ok(Found::Other(meta_sha.filter(|s| is_sha256_hex(s))));
        }
        let id = remote_id(got.meta.e_tag.clone(), got.meta.version.clone());
        let mut stream = got.into_stream();
        let (mut hash, mut read) = (Sha256::new(), 0u64);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            read += chunk.len() as u64;
            if read > len {
                // More than it said: not ours, and not read further.
                return Ok(Found::Other(None));
            }
            hash.update(&chunk);
        }
        let sha = crate::domain::hex(&hash.finalize());
        Ok(if read == len && sha == ours { Found::Ours(id) } else { Found::Other(Some(sha)) })
    }

    /// The plain-words error for a failed request that settles nothing.
    fn error(&self, class: Class, doing: &str, path: &Path) -> TargetError {
        let b = &self.bucket;
        match class {
            Class::Denied(code) => TargetError::Permanent(format!(
                "{doing} `{path}` in bucket `{b}` was refused ({}): check the access key, the secret key \
                 and that they may read and write this bucket",
                short(&code)
            )),
            Class::NotFound => TargetError::Permanent(format!(
                "{doing} `{path}`: bucket `{b}` does not exist (or the endpoint or region is wrong)"
            )),
            Class::NotSent(why) => TargetError::Transient(format!(
                "{doing} `{path}` in bucket `{b}`: could not reach the service ({}); nothing was sent",
                short(&why)
            )),
            Class::Busy(why) => TargetError::Transient(format!(
                "{doing} `{path}` in bucket `{b}`: the service is busy or failing ({})",
                short(&why)
            )),
            Class::MaybeSent(why) => TargetError::Transient(format!(
                "{doing} `{path}` in bucket `{b}`: the answer was lost ({})",
                short(&why)
            )),
            Class::Taken => TargetError::Permanent(format!("{doing} `{path}` in bucket `{b}`: it is already there")),
            Class::Refused(why) => {
                TargetError::Permanent(format!("{doing} `{path}` in bucket `{b}` was refused: {}", short(&why)))
            }
        }
    }
}

/// The wait before try `tries + 1`: 200 ms doubling per try up to 10 s, then a random part of
/// it taken off (half to all of it is waited), so many items do not come back at once.
fn backoff(tries: u32) -> Duration {
    let full = BACKOFF_FIRST.saturating_mul(1u32 << tries.saturating_sub(1).min(16)).min(BACKOFF_MAX);
    let random = (uuid::Uuid::new_v4().as_u128() % 1000) as u32;
    full / 2 + full / 2 * random / 1000
}

/// A detail inside a reason, at most 100 characters (the whole reason is cut later too).
fn short(s: &str) -> String {
    match s.char_indices().nth(100) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// An object's remote id: its ETag (unquoted), and `?versionId=…` in a versioned bucket.
fn remote_id(e_tag: Option<String>, version: Option<String>) -> Option<String> {
    let tag = e_tag.map(|t| t.trim_matches('"').to_string());
    match (tag, version) {
        (None, None) => None,
        (tag, None) => tag,
        (tag, Some(v)) => Some(format!("{}?versionId={v}", tag.unwrap_or_default())),
    }
}

/// Lowercase hex sha256 of `bytes`.
fn hex_sha256(bytes: &[u8]) -> String {
    crate::domain::hex(&Sha256::digest(bytes))
}

/// True for 64 hex digits.
fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The Content-Type for a delivered file, by its extension.
fn content_type(name: &str) -> Option<&'static str> {
    let ext = name.rsplit_once('.')?.1.to_ascii_lowercase();
    Some(match ext.as_str() {
        "jpg" | "jpeg" => "image/jpeg",
        "png" => "image/png",
        "webp" => "image/webp",
        "csv" => "text/csv",
        "json" => "application/json",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(key_env: &str, secret_env: &str) -> S3Config {
        S3Config {
            endpoint: Some("http://127.0.0.1:9".into()),
            region: "us-east-1".into(),
            bucket: "shop".into(),
            prefix: "listings/".into(),
            access_key_id_env: key_env.into(),
            secret_access_key_env: secret_env.into(),
            retry_for_ms: 0,
        }
    }

    #[test]
    fn a_missing_credential_variable_is_named() {
        let err = S3Target::new(&cfg("TALLY_TEST_S3_NO_SUCH_KEY_VAR", "PATH"), 1000).unwrap_err();
        let TargetError::Permanent(msg) = err else { panic!("not permanent: {err:?}") };
        assert!(msg.contains("TALLY_TEST_S3_NO_SUCH_KEY_VAR") && msg.contains("not set"), "{msg}");
        let err = S3Target::new(&cfg("PATH", "TALLY_TEST_S3_NO_SUCH_SECRET_VAR"), 1000).unwrap_err();
        assert!(err.to_string().contains("TALLY_TEST_S3_NO_SUCH_SECRET_VAR"), "{err}");
    }

    #[test]
    fn credentials_debug_hides_the_secret() {
        let c = Credentials { access_key_id: "AKIA1".into(), secret_access_key: "hunter2".into() };
        let shown = format!("{c:?}");
        assert!(shown.contains("AKIA1") && !shown.contains("hunter2"), "{shown}");
    }

    #[test]
    fn content_types_follow_the_extension() {
        assert_eq!(content_type("main.JPG"), Some("image/jpeg"));
        assert_eq!(content_type("a/b.webp"), Some("image/webp"));
        assert_eq!(content_type("manifest.csv"), Some("text/csv"));
        assert_eq!(content_type("README"), None);
    }

    #[tokio::test]
    async fn bytes_that_do_not_match_the_recorded_sha256_are_not_sent() {
        let creds = Credentials { access_key_id: "a".into(), secret_access_key: "b".into() };
        let t = S3Target::with_credentials(&cfg("A", "B"), 1000, creds).unwrap();
        let err = t.put("x.png", b"abc".to_vec(), &"0".repeat(64)).await.unwrap_err();
        assert!(matches!(&err, TargetError::Permanent(m) if m.contains("nothing was sent")), "{err:?}");
    }

    #[tokio::test]
    async fn an_endpoint_that_refuses_connections_is_transient() {
        // A loopback port that was free a moment ago: nothing listens, the connection is refused.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut c = cfg("A", "B");
        c.endpoint = Some(format!("http://127.0.0.1:{port}"));
        let creds = Credentials { access_key_id: "a".into(), secret_access_key: "b".into() };
        let t = S3Target::with_credentials(&c, 2000, creds).unwrap();
        let bytes = b"abc".to_vec();
        let sha = hex_sha256(&bytes);
        let err = t.put("x.png", bytes, &sha).await.unwrap_err();
        assert!(matches!(&err, TargetError::Transient(m) if m.contains("nothing was sent")), "{err:?}");
        let err = t.look("x.png").await.unwrap_err();
        assert!(matches!(err, TargetError::Transient(_)), "{err:?}");
    }
}
