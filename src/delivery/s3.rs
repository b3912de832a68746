//! The `s3` delivery target: files put into any S3-compatible bucket, signed with SigV4 by
//! `object_store` (its `aws` client on tally's own reqwest and ring; no second TLS stack).
//!
//! Invariants kept here:
//! - Nothing is ever overwritten: every write is a conditional create (`If-None-Match: *`), so
//!   a name that is already taken answers 412 and the object there is read back and compared
//!   ([`Put::AlreadyThere`] or [`Put::Different`]). This holds on services that honour
//!   `If-None-Match` on PutObject (AWS S3 since 2024, R2, MinIO, moto); a service that ignores
//!   it would let a second write replace the first, and no client can prevent that.
//! - A write whose answer was lost after the request left is settled by reading the object
//!   back, never by writing again: our bytes there → [`Put::Written`]; other bytes →
//!   [`Put::Different`]; nothing there → [`TargetError::Transient`] (trying again is safe,
//!   because the retry is a conditional create too: if the lost write lands late, the retry
//!   finds it); the read-back failing as well → [`TargetError::Ambiguous`].
//! - [`TargetError::Transient`] is said of a write only where trying again cannot write twice:
//!   a 5xx (which on S3 means nothing was stored, and should it ever have been, the retry's
//!   conditional create finds it and settles it by reading back), a connection that could not
//!   be made, or a lost answer with nothing there.
//! - `object_store`'s own retries are off: every attempt is one request, and whether to try
//!   again is the engine's decision, made on the answer classified here.
//!
//! Each object carries its sha256 twice: as user metadata `x-amz-meta-sha256` (hex; read by
//! [`S3Target::look`] with one HEAD), and as the S3 checksum header `x-amz-checksum-sha256`,
//! which AWS S3 checks against the body it received (moto does not). Settling a write
//! always hashes the bytes read back; `look` does so only when the metadata is missing.

use std::error::Error as StdError;
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder, Checksum, S3ConditionalPut};
use object_store::client::{
    ClientOptions, HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse, HttpService,
};
use object_store::path::Path;
use object_store::{Attribute, Attributes, GetOptions, ObjectStore, PutMode, PutOptions, PutPayload, RetryConfig};
use sha2::{Digest, Sha256};

use super::target::{Look, Put, S3Config, TargetError};

/// The metadata key under which the object's sha256 (lowercase hex) is stored.
const SHA256_METADATA: &str = "sha256";

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
#[derive(Debug)]
pub struct S3Target {
    store: AmazonS3,
    bucket: String,
    prefix: String,
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
        Ok(S3Target { store, bucket: cfg.bucket.clone(), prefix: cfg.prefix.clone() })
    }

    /// The object key for a file name: the prefix, then the name.
    fn path(&self, name: &str) -> Result<Path, TargetError> {
        let key = format!("{}{}", self.prefix, name);
        Path::parse(&key).map_err(|e| {
            TargetError::Permanent(format!("`{key}` cannot be an object key in bucket `{}`: {e}", self.bucket))
        })
    }

    /// Write `bytes` as `name` unless something of that name is there already. `sha256_hex` is
    /// the sha256 the delivery recorded for these bytes; it is checked against them first.
    pub async fn put(&self, name: &str, bytes: Vec<u8>, sha256_hex: &str) -> Result<Put, TargetError> {
        let ours = sha256_hex.to_ascii_lowercase();
        let actual = hex_sha256(&bytes);
        if actual != ours {
            return Err(TargetError::Permanent(format!(
                "`{name}`: the bytes to deliver have sha256 {actual}, not the recorded {ours}; nothing was sent"
            )));
        }
        let path = self.path(name)?;
        let mut attributes = Attributes::new();
        attributes.insert(Attribute::Metadata(SHA256_METADATA.into()), ours.clone().into());
        if let Some(ct) = content_type(name) {
            attributes.insert(Attribute::ContentType, ct.into());
        }
        let opts = PutOptions { mode: PutMode::Create, attributes, ..PutOptions::default() };
        let err = match self.store.put_opts(&path, PutPayload::from(bytes), opts).await {
            Ok(_) => return Ok(Put::Written),
            Err(e) => e,
        };
        match classify(&err) {
            Class::Taken => match self.read_back(&path).await {
                Ok(Some(there)) if there == ours => Ok(Put::AlreadyThere),
                Ok(Some(there)) => Ok(Put::Different { existing_sha256: Some(there) }),
                // 409: another write of that name was in progress and has not landed.
                Ok(None) => Err(TargetError::Transient(format!(
                    "`{}` in bucket `{}`: another write of that name was in progress; nothing was written",
                    path, self.bucket
                ))),
                Err(e) => Err(TargetError::Transient(format!(
                    "`{}` in bucket `{}` is already there, and reading it back to compare failed: {e}",
                    path, self.bucket
                ))),
            },
            Class::MaybeSent(why) => match self.read_back(&path).await {
                Ok(Some(there)) if there == ours => Ok(Put::Written),
                Ok(Some(there)) => Ok(Put::Different { existing_sha256: Some(there) }),
                Ok(None) => Err(TargetError::Transient(format!(
                    "the answer to writing `{}` to bucket `{}` was lost ({why}), and the object is not there: \
                     nothing landed; trying again is safe (the write is a conditional create)",
                    path, self.bucket
                ))),
                Err(e) => Err(TargetError::Ambiguous(format!(
                    "the answer to writing `{}` to bucket `{}` was lost ({why}), and reading it back failed \
                     too ({e}): it may or may not be there",
                    path, self.bucket
                ))),
            },
            other => Err(self.error(other, "writing", &path)),
        }
    }

    /// Write `bytes` as `name`, replacing whatever is there: only for a delivery's manifest
    /// (`manifest.csv`, `manifest.json`), which a later delivery to the same place rewrites.
    /// Never used for an image.
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
            Err(e) => Err(self.error(classify(&e), "writing", &path)),
        }
    }

    /// Where files go, in words: `s3://bucket/prefix`.
    pub fn location(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }

    /// What is at `name`: one HEAD, and the sha256 from the object's metadata; when an
    /// object has none (written by something other than tally), its bytes are read and hashed.
    /// A missing bucket reads as [`Look::Absent`] (a HEAD's 404 carries no body to tell the two
    /// apart); a write there then fails plainly.
    pub async fn look(&self, name: &str) -> Result<Look, TargetError> {
        let path = self.path(name)?;
        let head = GetOptions { head: true, ..GetOptions::default() };
        match self.store.get_opts(&path, head).await {
            Ok(r) => {
                let meta = r.attributes.get(&Attribute::Metadata(SHA256_METADATA.into())).map(|v| v.to_string());
                match meta {
                    Some(sha) if is_sha256_hex(&sha) => Ok(Look::Present { sha256: sha.to_ascii_lowercase() }),
                    _ => match self.read_back(&path).await? {
                        Some(sha256) => Ok(Look::Present { sha256 }),
                        None => Ok(Look::Absent),
                    },
                }
            }
            Err(e) => match classify(&e) {
                Class::NotFound => Ok(Look::Absent),
                other => Err(self.error(other, "looking for", &path)),
            },
        }
    }

    /// The sha256 of the bytes stored at `path` (read whole and hashed), or `None` when
    /// nothing is there.
    async fn read_back(&self, path: &Path) -> Result<Option<String>, TargetError> {
        let got = match self.store.get_opts(path, GetOptions::default()).await {
            Ok(r) => r.bytes().await,
            Err(e) => Err(e),
        };
        match got {
            Ok(bytes) => Ok(Some(hex_sha256(&bytes))),
            Err(e) => match classify(&e) {
                Class::NotFound => Ok(None),
                other => Err(self.error(other, "reading back", path)),
            },
        }
    }

    /// The plain-words error for a failed request that settles nothing.
    fn error(&self, class: Class, doing: &str, path: &Path) -> TargetError {
        let b = &self.bucket;
        match class {
            Class::Denied(code) => TargetError::Permanent(format!(
                "{doing} `{path}` in bucket `{b}` was refused ({code}): check the access key, the secret key \
                 and that they may read and write this bucket"
            )),
            Class::NotFound => TargetError::Permanent(format!(
                "{doing} `{path}`: bucket `{b}` does not exist (or the endpoint or region is wrong)"
            )),
            Class::NotSent(why) => TargetError::Transient(format!(
                "{doing} `{path}` in bucket `{b}`: could not reach the service ({why}); nothing was sent"
            )),
            Class::Busy(why) => TargetError::Transient(format!(
                "{doing} `{path}` in bucket `{b}`: the service is busy or failing ({why}); try again later"
            )),
            Class::MaybeSent(why) => {
                TargetError::Transient(format!("{doing} `{path}` in bucket `{b}`: the answer was lost ({why})"))
            }
            Class::Taken => TargetError::Permanent(format!("{doing} `{path}` in bucket `{b}`: it is already there")),
            Class::Refused(why) => {
                TargetError::Permanent(format!("{doing} `{path}` in bucket `{b}` was refused: {why}"))
            }
        }
    }
}

/// How a failed request ended, as far as a retry is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Class {
    /// 412 (or 409) to a conditional create: the name is taken.
    Taken,
    /// 404: no such object (or no such bucket).
    NotFound,
    /// 401/403: the credentials are wrong or lack permission (the S3 error code).
    Denied(String),
    /// The request never left: no connection could be made.
    NotSent(String),
    /// The service answered 5xx (503 SlowDown, 500 InternalError): nothing was written.
    Busy(String),
    /// The request may have been sent and its answer never came (dropped connection, timeout).
    MaybeSent(String),
    /// Any other answer: the request is wrong for this service and will not get better.
    Refused(String),
}

/// Sort an `object_store` error by what it means for the item.
fn classify(err: &object_store::Error) -> Class {
    use object_store::Error as E;
    match err {
        E::AlreadyExists { .. } | E::Precondition { .. } | E::NotModified { .. } => Class::Taken,
        E::NotFound { .. } => Class::NotFound,
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => {
            Class::Denied(s3_code(&err.to_string()).unwrap_or_else(|| "access denied".into()))
        }
        _ => {
            // Walk the causes: a 5xx answer tagged by `Service`, or the transport's error.
            let mut source: Option<&(dyn StdError + 'static)> = Some(err);
            let mut http_kind = None;
            while let Some(e) = source {
                if let Some(busy) = e.downcast_ref::<ServerError>() {
                    return Class::Busy(busy.to_string());
                }
                if let Some(r) = e.downcast_ref::<reqwest::Error>() {
                    // A connect timeout is also a timeout; it is checked first because nothing
                    // left before the connection was made.
                    if r.is_connect() {
                        return Class::NotSent(cause_chain(r));
                    }
                    return Class::MaybeSent(cause_chain(r));
                }
                if let Some(h) = e.downcast_ref::<HttpError>() {
                    http_kind = Some(h.kind());
                }
                source = e.source();
            }
            match http_kind {
                Some(HttpErrorKind::Connect) => Class::NotSent(err.to_string()),
                Some(_) => Class::MaybeSent(err.to_string()),
                None => Class::Refused(s3_code(&err.to_string()).unwrap_or_else(|| err.to_string())),
            }
        }
    }
}

/// `e` and its causes on one line (reqwest's own message is often just "error sending request").
fn cause_chain(e: &(dyn StdError + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// The `<Code>` (and `<Message>`) of an S3 XML error found in `text`, e.g. "SignatureDoesNotMatch".
fn s3_code(text: &str) -> Option<String> {
    let between = |open: &str, close: &str| {
        let start = text.find(open)? + open.len();
        let end = text[start..].find(close)? + start;
        Some(text[start..end].trim().to_string())
    };
    let code = between("<Code>", "</Code>")?;
    Some(match between("<Message>", "</Message>") {
        Some(msg) if !msg.is_empty() => format!("{code}: {msg}"),
        _ => code,
    })
}

/// A 5xx answer, turned into a transport error by [`Service`] so that it can be recognised
/// in the error's causes (object_store keeps the status of other answers private).
#[derive(Debug, thiserror::Error)]
#[error("{status}{}", code.as_deref().map(|c| format!(" {c}")).unwrap_or_default())]
struct ServerError {
    status: reqwest::StatusCode,
    code: Option<String>,
}

/// object_store's HTTP client: tally's reqwest client, with 5xx answers tagged.
#[derive(Debug)]
struct Connector(reqwest::Client);

impl HttpConnector for Connector {
    fn connect(&self, _options: &ClientOptions) -> object_store::Result<HttpClient> {
        Ok(HttpClient::new(Service(self.0.clone())))
    }
}

/// See [`Connector`].
#[derive(Debug)]
struct Service(reqwest::Client);

#[async_trait::async_trait]
impl HttpService for Service {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let resp = HttpService::call(&self.0, req).await?;
        if !resp.status().is_server_error() {
            return Ok(resp);
        }
        let (parts, body) = resp.into_parts();
        let text = body.bytes().await.map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
        let err = ServerError { status: parts.status, code: s3_code(&text) };
        Err(HttpError::new(HttpErrorKind::Unknown, err))
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
    fn s3_error_codes_are_read_from_the_body() {
        let body = "Server returned non-2xx status code: 403 Forbidden: <?xml version=\"1.0\"?><Error>\
                    <Code>SignatureDoesNotMatch</Code><Message>The request signature we calculated does not match\
                    </Message></Error>";
        assert_eq!(
            s3_code(body).as_deref(),
            Some("SignatureDoesNotMatch: The request signature we calculated does not match")
        );
        assert_eq!(s3_code("no xml here"), None);
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
