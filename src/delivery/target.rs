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
