//! Image reads on PostgreSQL: an image's record and its bytes, chunk by chunk, each chunk in
//! its own short read-only transaction. (The other reads are written once for both backends,
//! in `store::read`.)

use super::{PgStore, Tx};
use crate::store::{BlobMeta, CHUNK, StoreError};

/// What is recorded about the image stored under `id`.
fn blob_meta(tx: &mut Tx<'_>, id: &str) -> Result<Option<BlobMeta>, StoreError> {
    Ok(tx.opt("SELECT id, sha256, bytes, media_type FROM blobs WHERE id = $1", &[&id])?.map(|r| BlobMeta {
        id: r.get(0),
        sha256: r.get(1),
        bytes: r.get(2),
        media_type: r.get(3),
    }))
}

impl PgStore {
    /// What is recorded about the image stored under `id` (an artifact's or an upload's id).
    pub async fn blob_meta(&self, id: String) -> Result<Option<BlobMeta>, StoreError> {
        self.read(move |tx| blob_meta(tx, &id)).await
    }

    /// Up to `len` bytes of image `id` from offset `pos`, in one short read transaction
    /// (`None`: no such image any more). Streaming readers call it chunk by chunk, so no
    /// request holds a whole image or a long transaction.
    pub async fn read_blob_chunk(&self, id: String, pos: usize, len: usize) -> Result<Option<Vec<u8>>, StoreError> {
        let (from, n) = (pos as i64 + 1, len.min(CHUNK) as i64);
        self.read(move |tx| {
            Ok(tx
                .opt(
                    "SELECT substring(data FROM $2::bigint::int FOR $3::bigint::int) FROM blobs WHERE id = $1",
                    &[&id, &from, &n],
                )?
                .map(|r| r.get(0)))
        })
        .await
    }

    /// [`PgStore::blob_meta`] on the current thread (off the async threads).
    pub fn blob_meta_blocking(&self, id: &str) -> Result<Option<BlobMeta>, StoreError> {
        let id = id.to_string();
        self.read_blocking(move |tx| blob_meta(tx, &id))
    }

    /// [`PgStore::read_blob_chunk`] on the current thread (off the async threads).
    pub fn read_blob_chunk_blocking(&self, id: &str, pos: usize, len: usize) -> Result<Option<Vec<u8>>, StoreError> {
        let (id, from, n) = (id.to_string(), pos as i64 + 1, len.min(CHUNK) as i64);
        self.read_blocking(move |tx| {
            Ok(tx
                .opt(
                    "SELECT substring(data FROM $2::bigint::int FOR $3::bigint::int) FROM blobs WHERE id = $1",
                    &[&id, &from, &n],
                )?
                .map(|r| r.get(0)))
        })
    }

    /// The whole image stored under `id`, for small uses that need all of it at once
    /// (references sent to a provider, thumbnails).
    pub async fn read_image_bytes(&self, id: String) -> Result<Option<(BlobMeta, Vec<u8>)>, StoreError> {
        let Some(meta) = self.blob_meta(id.clone()).await? else { return Ok(None) };
        let mut out = Vec::with_capacity(meta.bytes.max(0) as usize);
        while (out.len() as i64) < meta.bytes {
            match self.read_blob_chunk(id.clone(), out.len(), CHUNK).await? {
                Some(chunk) if !chunk.is_empty() => out.extend_from_slice(&chunk),
                Some(_) => {
                    let why =
                        format!("it is shorter ({} bytes) than its recorded size ({} bytes)", out.len(), meta.bytes);
                    return Err(StoreError::Damaged { id, why });
                }
                None => return Err(StoreError::Invalid(format!("image {id} is no longer stored"))),
            }
        }
        // As `BlobReader` does on SQLite: damaged bytes never leave the store as an image
        // (thumbnails, reference photos sent to a provider).
        out.truncate(meta.bytes.max(0) as usize);
        let sha = meta.sha256.clone();
        let (out, intact) = tokio::task::spawn_blocking(move || {
            let intact = crate::domain::hex(&<sha2::Sha256 as sha2::Digest>::digest(&out)) == sha;
            (out, intact)
        })
        .await
        .map_err(|e| StoreError::Fatal(format!("hashing task failed: {e}")))?;
        if !intact {
            return Err(StoreError::Damaged { id, why: "its bytes do not match their recorded sha256".into() });
        }
        Ok(Some((meta, out)))
    }
}
