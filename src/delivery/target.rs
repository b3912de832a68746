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
