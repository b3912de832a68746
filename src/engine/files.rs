//! Artifact files under `<data_dir>/artifacts`, named after the execution token that
//! produced them. A file under its final name is always complete: it is written to a
//! temporary name, fsynced, renamed, and the directory fsynced. So a file found on disk after
//! a crash is evidence the reconciler can verify and commit.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use super::Shared;
use crate::domain::hex;
use crate::providers::{Image, extension, sniff_image};
use crate::store::NewArtifact;

const DIR: &str = "artifacts";

/// Create the artifacts directory.
pub fn prepare(data_dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(data_dir.join(DIR))
}

fn relative(name: &str, media_type: &str) -> String {
    format!("{DIR}/{name}.{}", extension(media_type))
}

/// Why an image could not be saved.
#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    /// The bytes are not an image: a definite answer about the content, not a local failure.
    #[error("the bytes are not a PNG, JPEG or WebP image")]
    NotAnImage,
    /// Writing or syncing the file failed.
    #[error("{0}")]
    Io(String),
}

/// Verify image bytes and describe them as the artifact `artifacts/<name>.<ext>`, the
/// extension following the media type sniffed from the bytes.
fn describe(bytes: &[u8], name: &str) -> Result<NewArtifact, SaveError> {
    let media_type = sniff_image(bytes).ok_or(SaveError::NotAnImage)?;
    Ok(NewArtifact {
        id: uuid::Uuid::now_v7().to_string(),
        path: relative(name, media_type),
        sha256: hex(&Sha256::digest(bytes)),
        bytes: bytes.len() as i64,
        media_type: media_type.into(),
    })
}

/// Write `bytes` to a temporary name, fsync, and rename into place. The rename is durable
/// only once the directory is fsynced ([`DirSync`]).
fn write_and_rename(data_dir: &Path, rel: &str, tmp_tag: &str, bytes: &[u8]) -> std::io::Result<()> {
    let dest = data_dir.join(rel);
    let tmp = data_dir.join(DIR).join(format!(".{tmp_tag}.tmp"));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &dest)
}

/// Group fsync of one directory: callers that renamed a file into it and then ask for a sync
/// share one `fsync` (like group commit), instead of one each.
///
/// Invariant: `sync()` returns only after an fsync of the directory that *started* after the
/// caller's request, so the caller's earlier rename is durable.
#[derive(Debug)]
pub struct DirSync {
    dir: PathBuf,
    /// Requests taken so far (each caller takes the next number).
    requested: AtomicU64,
    /// The highest request number covered by a finished fsync.
    done: tokio::sync::Mutex<u64>,
}

impl DirSync {
    /// A syncer for `dir`.
    pub fn new(dir: PathBuf) -> Self {
        DirSync { dir, requested: AtomicU64::new(0), done: tokio::sync::Mutex::new(0) }
    }

    /// Make every rename into the directory done before this call durable.
    pub async fn sync(&self) -> std::io::Result<()> {
        let mine = self.requested.fetch_add(1, Ordering::SeqCst) + 1;
        let mut done = self.done.lock().await;
        if *done >= mine {
            return Ok(()); // an fsync that started after our request has finished
        }
        let upto = self.requested.load(Ordering::SeqCst);
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || std::fs::File::open(&dir)?.sync_all())
            .await
            .map_err(std::io::Error::other)??;
        *done = upto;
        Ok(())
    }
}

/// Verify `img` (its bytes must really be an image) and save it durably as
/// `artifacts/<name>.<ext>` (file fsynced, renamed, directory fsynced through `dir_sync`).
/// `tmp_tag` makes the temporary name unique per writer.
pub async fn save(
    data_dir: &Path,
    dir_sync: &DirSync,
    name: &str,
    tmp_tag: &str,
    img: Image,
) -> Result<NewArtifact, SaveError> {
    let art = describe(&img.bytes, name)?;
    let (dir, rel, tag) = (data_dir.to_path_buf(), art.path.clone(), tmp_tag.to_string());
    tokio::task::spawn_blocking(move || write_and_rename(&dir, &rel, &tag, &img.bytes))
        .await
        .map_err(|e| SaveError::Io(format!("writer task failed: {e}")))?
        .map_err(|e| SaveError::Io(format!("cannot write the image file: {e}")))?;
    dir_sync.sync().await.map_err(|e| SaveError::Io(format!("cannot sync the artifacts directory: {e}")))?;
    Ok(art)
}

/// The artifacts directory of a data dir.
pub fn artifacts_dir(data_dir: &Path) -> PathBuf {
    data_dir.join(DIR)
}

/// Save an uploaded reference image as `uploads/<sha256>.<ext>` (content-addressed, so the
/// same photo uploaded twice is stored once) and describe it.
pub async fn save_upload(
    data_dir: &Path,
    bytes: Vec<u8>,
    media_type: &str,
    now: crate::domain::Millis,
) -> Result<crate::store::UploadView, String> {
    let sha256 = hex(&Sha256::digest(&bytes));
    let rel = format!("uploads/{sha256}.{}", extension(media_type));
    let view = crate::store::UploadView {
        id: uuid::Uuid::now_v7().to_string(),
        sha256: sha256.clone(),
        path: rel.clone(),
        bytes: bytes.len() as i64,
        media_type: media_type.into(),
        created_at: now,
    };
    let dir = data_dir.to_path_buf();
    tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        std::fs::create_dir_all(dir.join("uploads"))?;
        if dir.join(&rel).exists() {
            return Ok(());
        }
        let tmp = dir.join("uploads").join(format!(".{sha256}.{}.tmp", uuid::Uuid::new_v4()));
        {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, dir.join(&rel))?;
        std::fs::File::open(dir.join("uploads"))?.sync_all()
    })
    .await
    .map_err(|e| format!("upload writer failed: {e}"))?
    .map_err(|e| format!("cannot save the upload: {e}"))?;
    Ok(view)
}

/// Look for a complete image file saved by execution `token` and verify it.
pub fn find_saved(data_dir: &Path, token: &str) -> Option<NewArtifact> {
    ["image/png", "image/jpeg", "image/webp"].iter().find_map(|mt| {
        let rel = relative(token, mt);
        let bytes = std::fs::read(data_dir.join(&rel)).ok()?;
        describe(&bytes, token).ok().filter(|a| a.path == rel)
    })
}

/// The path of an artifact's file.
pub fn path_of(data_dir: &Path, rel: &str) -> PathBuf {
    data_dir.join(rel)
}

/// Delete artifact files no row points to, once older than the grace period. A file whose
/// execution is still running or unknown is evidence, never an orphan. Runs once, in the
/// background, after start-up recovery.
pub(super) async fn sweep_orphans(shared: Arc<Shared>) {
    let dir = shared.data_dir.join(DIR);
    let grace = shared.cfg.orphan_grace;
    let store = shared.store.clone();
    let result = tokio::task::spawn_blocking(move || -> Result<usize, String> {
        let mut removed = 0;
        let entries = std::fs::read_dir(&dir).map_err(|e| e.to_string())?;
        for entry in entries.flatten() {
            let path = entry.path();
            let old = entry
                .metadata()
                .and_then(|m| m.modified())
                .map(|t| SystemTime::now().duration_since(t).unwrap_or(Duration::ZERO) > grace)
                .unwrap_or(false);
            if !old {
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let orphan = if name.ends_with(".tmp") {
                true
            } else {
                let token = name.split('.').next().unwrap_or_default().to_string();
                let rel = format!("{DIR}/{name}");
                let (has_row, status) =
                    store.read_blocking(|c| crate::store::file_owner(c, &rel, &token)).map_err(|e| e.to_string())?;
                !has_row && !matches!(status.as_deref(), Some("running" | "unknown"))
            };
            if orphan && std::fs::remove_file(&path).is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    })
    .await;
    match result {
        Ok(Ok(n)) if n > 0 => tracing::info!(removed = n, "deleted orphaned artifact files"),
        Ok(Err(e)) => tracing::warn!(error = %e, "orphan sweep failed"),
        _ => {}
    }
}
