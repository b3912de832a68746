//! Image bytes inside the database: generated images (artifacts) and uploaded reference
//! photos (uploads), one `blobs` row each, keyed by the artifact's or upload's id.
//!
//! Invariants enforced here:
//! - **Bytes are verified before they reach the writer.** The only way to hand bytes to the
//!   store is a [`NewImage`], made by [`NewImage::verify`]: PNG, JPEG or WebP by their magic
//!   bytes, with the sha256 and size computed from the bytes themselves. The writer only
//!   inserts; it never hashes (that would stall every other write behind a large image).
//! - **An image commits with its row.** [`insert_blob`] is called only inside the operation
//!   that commits the row the bytes belong to — the fenced finish, a late result, an
//!   operator's resolve, an upload — so `succeeded` and its verified bytes are one commit:
//!   there is no image without its row, and no row without its image.
//! - **Reads stream.** [`BlobReader`] reads at most [`CHUNK`] bytes per call, each in its own
//!   short read transaction on a reader connection (incremental blob I/O). No request holds a
//!   whole image in memory, and no download pins a WAL snapshot for longer than one chunk, so
//!   the writer's checkpoints are not held back by slow clients (see the checkpoint policy in
//!   `store::sqlite`). Each chunk looks the row up by its id again: ids are never reused, so a
//!   chunk can only ever come from the same image (a pruned image ends the read with
//!   [`StoreError::Invalid`]).
//!
//! For small uses that need the whole image (references sent to a provider, thumbnails),
//! [`SqliteStore::read_image_bytes`]. Everything outside the store reaches image bytes through these
//! functions, never through SQL, so another backend can keep them elsewhere (`bytea`).

use std::sync::Arc;

use rusqlite::{Connection, OptionalExtension, params};
use sha2::{Digest, Sha256};

use super::{SqliteStore, StoreError};
use crate::domain::hex;

/// The most bytes one [`BlobReader`] read returns (and holds in memory).
pub const CHUNK: usize = 256 * 1024;

/// The bytes were not a PNG, JPEG or WebP image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the bytes are not a PNG, JPEG or WebP image")]
pub struct NotAnImage;

/// Image bytes checked to be PNG, JPEG or WebP, with their sha256: what the store accepts.
/// Cheap to clone (the bytes are shared).
#[derive(Clone)]
pub struct NewImage {
    sha256: String,
    media_type: &'static str,
    data: Arc<Vec<u8>>,
}

impl std::fmt::Debug for NewImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewImage")
            .field("media_type", &self.media_type)
            .field("bytes", &self.data.len())
            .field("sha256", &self.sha256)
            .finish()
    }
}

impl NewImage {
    /// Check the bytes (magic bytes of PNG, JPEG or WebP; not empty) and hash them. Hashing a
    /// large image takes milliseconds: call this off the async threads for large inputs
    /// ([`NewImage::verify_async`]).
    pub fn verify(bytes: Vec<u8>) -> Result<NewImage, NotAnImage> {
        let media_type = crate::domain::sniff_image(&bytes).ok_or(NotAnImage)?;
        let sha256 = hex(&Sha256::digest(&bytes));
        Ok(NewImage { sha256, media_type, data: Arc::new(bytes) })
    }

    /// [`NewImage::verify`] on a blocking thread when the image is large.
    pub async fn verify_async(bytes: Vec<u8>) -> Result<NewImage, NotAnImage> {
        if bytes.len() < 256 * 1024 {
            return NewImage::verify(bytes);
        }
        tokio::task::spawn_blocking(move || NewImage::verify(bytes)).await.unwrap_or(Err(NotAnImage))
    }

    /// The sha256 of the bytes, lowercase hex.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// `image/png`, `image/jpeg` or `image/webp`.
    pub fn media_type(&self) -> &'static str {
        self.media_type
    }

    /// The size in bytes.
    pub fn len(&self) -> i64 {
        self.data.len() as i64
    }

    /// Never true: an empty input is not an image.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.data
    }
}

/// A verified image to attach to a task as its artifact (the bytes commit with the row).
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct NewArtifact {
    pub id: String,
    pub image: NewImage,
}

impl NewArtifact {
    /// An artifact with a fresh id (UUIDv7).
    pub fn new(image: NewImage) -> Self {
        NewArtifact { id: uuid::Uuid::now_v7().to_string(), image }
    }
}

/// What is recorded about a stored image.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct BlobMeta {
    pub id: String,
    pub sha256: String,
    pub bytes: i64,
    pub media_type: String,
}

/// Store an image's bytes under `id`. Only called inside the operation that commits the row
/// the bytes belong to (see the module docs).
pub(in crate::store) fn insert_blob(c: &Connection, id: &str, img: &NewImage) -> Result<(), StoreError> {
    c.prepare_cached("INSERT INTO blobs (id, sha256, bytes, media_type, data) VALUES (?1, ?2, ?3, ?4, ?5)")?
        .execute(params![id, img.sha256, img.len(), img.media_type, img.bytes()])?;
    Ok(())
}

/// What is recorded about the image stored under `id`.
pub fn blob_meta(c: &Connection, id: &str) -> Result<Option<BlobMeta>, StoreError> {
    Ok(c.prepare_cached("SELECT id, sha256, bytes, media_type FROM blobs WHERE id = ?1")?
        .query_row([id], |r| Ok(BlobMeta { id: r.get(0)?, sha256: r.get(1)?, bytes: r.get(2)?, media_type: r.get(3)? }))
        .optional()?)
}

/// Read up to `buf.len()` bytes of image `id` from offset `pos`, in one short read
/// transaction (the reader's own when it runs inside one). `None` when there is no such image
/// (any more).
fn read_at(c: &Connection, id: &str, pos: usize, buf: &mut [u8]) -> Result<Option<usize>, StoreError> {
    let own = c.is_autocommit();
    if own {
        c.prepare_cached("BEGIN")?.execute([])?;
    }
    let result = (|| -> Result<Option<usize>, StoreError> {
        let rowid: Option<i64> =
            c.prepare_cached("SELECT rowid FROM blobs WHERE id = ?1")?.query_row([id], |r| r.get(0)).optional()?;
        let Some(rowid) = rowid else { return Ok(None) };
        let blob = c.blob_open(rusqlite::MAIN_DB, c"blobs", c"data", rowid, true)?;
        Ok(Some(blob.read_at(buf, pos)?))
    })();
    // A read transaction: ending it can only fail if the connection is broken, and then the
    // next use reports it.
    if own {
        let _ = c.prepare_cached("COMMIT").and_then(|mut s| s.execute([]));
    }
    result
}

/// A streaming reader of one stored image: each read is one short read transaction of at most
/// [`CHUNK`] bytes (see the module docs). Blocking: use it off the async threads.
pub struct BlobReader {
    source: Source,
    meta: BlobMeta,
    pos: usize,
    /// The sha256 of the bytes read so far, compared with the recorded one at the end.
    hasher: Sha256,
}

/// Where a [`BlobReader`] reads from.
enum Source {
    Sqlite(SqliteStore),
    Postgres(super::postgres::PgStore),
}

impl BlobReader {
    /// A reader of an image stored in PostgreSQL (`bytea`, read chunk by chunk).
    pub(in crate::store) fn postgres(store: super::postgres::PgStore, meta: BlobMeta) -> BlobReader {
        BlobReader { source: Source::Postgres(store), meta, pos: 0, hasher: Sha256::new() }
    }

    /// What is recorded about the image (size, media type, sha256).
    pub fn meta(&self) -> &BlobMeta {
        &self.meta
    }

    /// The rest of the image, whole, checked against its recorded size and sha256
    /// ([`StoreError::Damaged`] otherwise). For images small enough to hold in memory: a
    /// download checks these before its first byte (`api::images`).
    pub fn read_all(&mut self) -> Result<Vec<u8>, StoreError> {
        let mut out = Vec::with_capacity((self.meta.bytes.max(0) as usize).saturating_sub(self.pos));
        while let Some(chunk) = self.next_chunk(CHUNK)? {
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }

    /// Read the rest of the image without keeping it, only to check it against its recorded
    /// size and sha256 (the set zip does this before it names an image in the zip).
    pub fn verify_rest(&mut self) -> Result<(), StoreError> {
        while self.next_chunk(CHUNK)?.is_some() {}
        Ok(())
    }

    /// The next chunk (at most `max` bytes, capped at [`CHUNK`]); `None` at the end.
    pub fn next_chunk(&mut self, max: usize) -> Result<Option<Vec<u8>>, StoreError> {
        let left = (self.meta.bytes.max(0) as usize).saturating_sub(self.pos);
        if left == 0 {
            return Ok(None);
        }
        let mut buf = vec![0u8; left.min(max.clamp(1, CHUNK))];
        let n = self.read_into(&mut buf)?;
        buf.truncate(n);
        Ok(Some(buf))
    }

    fn read_into(&mut self, buf: &mut [u8]) -> Result<usize, StoreError> {
        let (id, pos) = (self.meta.id.clone(), self.pos);
        let n = match &self.source {
            Source::Sqlite(store) => store.read_blocking(|c| read_at(c, &id, pos, buf))?,
            Source::Postgres(store) => store.read_blob_chunk_blocking(&id, pos, buf.len())?.map(|chunk| {
                let n = chunk.len().min(buf.len());
                buf[..n].copy_from_slice(&chunk[..n]);
                n
            }),
        }
        .ok_or_else(|| StoreError::Gone { id: id.clone() })?;
        if n == 0 && pos < self.meta.bytes as usize {
            return Err(StoreError::Damaged {
                id,
                why: format!("it is shorter ({pos} bytes) than its recorded size ({} bytes)", self.meta.bytes),
            });
        }
        self.hasher.update(&buf[..n]);
        self.pos += n;
        if self.pos >= self.meta.bytes.max(0) as usize && hex(&self.hasher.clone().finalize()) != self.meta.sha256 {
            return Err(StoreError::Damaged { id, why: "its bytes do not match their recorded sha256".into() });
        }
        Ok(n)
    }
}

impl std::io::Read for BlobReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.is_empty() || self.pos >= self.meta.bytes.max(0) as usize {
            return Ok(0);
        }
        let max = buf.len().min(CHUNK);
        self.read_into(&mut buf[..max]).map_err(std::io::Error::other)
    }
}

impl SqliteStore {
    /// Open a streaming reader of the image stored under `id` (an artifact's or an upload's
    /// id); `None` if there is none. Blocking: call it off the async threads.
    pub fn open_blob(&self, id: &str) -> Result<Option<BlobReader>, StoreError> {
        let meta = self.read_blocking(|c| blob_meta(c, id))?;
        Ok(meta.map(|meta| BlobReader { source: Source::Sqlite(self.clone()), meta, pos: 0, hasher: Sha256::new() }))
    }

    /// The whole image stored under `id`, for small uses that need all of it at once
    /// (references sent to a provider, thumbnails). Serving a download should stream with
    /// [`SqliteStore::open_blob`] instead.
    pub async fn read_image_bytes(&self, id: String) -> Result<Option<(BlobMeta, Vec<u8>)>, StoreError> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || store.read_image_bytes_blocking(&id))
            .await
            .map_err(|e| StoreError::Fatal(format!("reader task failed: {e}")))?
    }

    /// [`SqliteStore::read_image_bytes`] on the current thread.
    pub fn read_image_bytes_blocking(&self, id: &str) -> Result<Option<(BlobMeta, Vec<u8>)>, StoreError> {
        let Some(mut r) = self.open_blob(id)? else { return Ok(None) };
        let mut out = Vec::with_capacity(r.meta.bytes.max(0) as usize);
        while let Some(chunk) = r.next_chunk(CHUNK)? {
            out.extend_from_slice(&chunk);
        }
        Ok(Some((r.meta, out)))
    }
}

/// What [`verify_all`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlobCheck {
    /// Generated images whose bytes matched their recorded size and sha256.
    pub artifacts: u64,
    /// Uploaded reference photos whose bytes matched.
    pub uploads: u64,
    /// Everything that did not hold.
    pub problems: Vec<String>,
}

/// Verify every stored image: that every artifact and upload has its bytes, every stored
/// image belongs to one, their recorded sizes, hashes and types agree, and the bytes
/// themselves match the recorded size and sha256 (read in [`CHUNK`]s, so memory stays
/// bounded) — the last only when `hash` is true. Call it inside one read transaction for a
/// consistent view.
pub fn verify_all(c: &Connection, hash: bool) -> Result<BlobCheck, StoreError> {
    let mut out = BlobCheck::default();
    let missing: &[(&str, &str)] = &[
        (
            "artifact without its stored image",
            "SELECT a.id FROM artifacts a LEFT JOIN blobs b ON b.id = a.id WHERE b.id IS NULL",
        ),
        (
            "upload without its stored image",
            "SELECT u.id FROM uploads u LEFT JOIN blobs b ON b.id = u.id WHERE b.id IS NULL",
        ),
        (
            "stored image that no artifact or upload points to",
            "SELECT b.id FROM blobs b WHERE NOT EXISTS (SELECT 1 FROM artifacts a WHERE a.id = b.id)
               AND NOT EXISTS (SELECT 1 FROM uploads u WHERE u.id = b.id)",
        ),
        (
            "artifact whose recorded size, sha256 or type differs from its stored image",
            "SELECT a.id FROM artifacts a JOIN blobs b ON b.id = a.id
             WHERE a.sha256 <> b.sha256 OR a.bytes <> b.bytes OR a.media_type <> b.media_type",
        ),
        (
            "upload whose recorded size, sha256 or type differs from its stored image",
            "SELECT u.id FROM uploads u JOIN blobs b ON b.id = u.id
             WHERE u.sha256 <> b.sha256 OR u.bytes <> b.bytes OR u.media_type <> b.media_type",
        ),
    ];
    for (what, sql) in missing {
        let mut stmt = c.prepare(sql)?;
        for id in stmt.query_map([], |r| r.get::<_, String>(0))? {
            out.problems.push(format!("{what}: {}", id?));
        }
    }
    if !hash {
        return Ok(out);
    }
    let hashed = hash_all(c, 0, 1)?;
    out.problems.extend(hashed.problems);
    out.artifacts = hashed.artifacts;
    out.uploads = hashed.uploads;
    Ok(out)
}

/// The hashing part of [`verify_all`]: every stored image's bytes against its recorded size
/// and sha256 — of the images whose rowid is `part` modulo `parts`, so `parts` connections on
/// as many threads share the work. `tally check` runs them beside SQLite's integrity check
/// (`store::sqlite::whole::check_with`), so hashing and the integrity check take the time of
/// the slower instead of their sum.
pub fn hash_all(c: &Connection, part: i64, parts: i64) -> Result<BlobCheck, StoreError> {
    let mut out = BlobCheck::default();
    let mut stmt = c.prepare(
        "SELECT b.rowid, b.id, b.sha256, b.bytes, EXISTS (SELECT 1 FROM uploads u WHERE u.id = b.id) FROM blobs b
         WHERE b.rowid % ?2 = ?1",
    )?;
    let rows = stmt
        .query_map([part, parts.max(1)], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?, r.get(3)?, r.get(4)?))
        })?
        .collect::<Result<Vec<(i64, String, String, i64, bool)>, _>>()?;
    let mut buf = vec![0u8; CHUNK];
    for (rowid, id, sha, bytes, is_upload) in rows {
        let blob = c.blob_open(rusqlite::MAIN_DB, c"blobs", c"data", rowid, true)?;
        let mut hasher = Sha256::new();
        let mut pos = 0;
        while pos < blob.len() {
            let n = blob.read_at(&mut buf, pos)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            pos += n;
        }
        if pos as i64 != bytes || hex(&hasher.finalize()) != sha {
            out.problems.push(format!("stored image {id} does not match its recorded size and sha256"));
        } else if is_upload {
            out.uploads += 1;
        } else {
            out.artifacts += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_images_are_accepted() {
        assert_eq!(NewImage::verify(b"hello".to_vec()).err(), Some(NotAnImage));
        assert_eq!(NewImage::verify(Vec::new()).err(), Some(NotAnImage));
        let png = crate::render::placeholder_png("x", 8);
        let img = NewImage::verify(png.clone()).expect("a png");
        assert_eq!(img.media_type(), "image/png");
        assert_eq!(img.len(), png.len() as i64);
        assert_eq!(img.sha256(), hex(&Sha256::digest(&png)));
    }

    /// An image deleted (pruned) after its reader opened is `Gone` (the API's 404), not a store
    /// failure (a 503 "try again" that would never succeed).
    #[tokio::test]
    async fn an_image_deleted_while_it_is_read_is_gone() {
        let dir = std::env::temp_dir().join(format!("tally-blob-{}", uuid::Uuid::new_v4()));
        let store = SqliteStore::open(&dir.join("tally.db"), crate::config::Durability::Normal).expect("open");
        let img = NewImage::verify(crate::render::placeholder_png("gone", 64)).expect("a png");
        let up = crate::store::Store::from(store.clone()).save_upload(img, 1_000).await.expect("upload");
        let mut r = store.open_blob(&up.id).expect("open").expect("stored");
        let id = up.id.clone();
        store
            .write(move |c| Ok(c.execute("DELETE FROM blobs WHERE id = ?1", [&id]).map(|_| ())?))
            .await
            .expect("delete");
        let err = r.read_all().expect_err("nothing left to read");
        assert!(matches!(err, StoreError::Gone { .. }), "{err}");
        store.close().expect("close");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A stored image whose bytes no longer match their recorded sha256 (a damaged page) is
    /// never read whole: the reader withholds the last chunk and fails. `tally serve`'s start-up
    /// check relies on this instead of hashing every image.
    #[tokio::test]
    async fn damaged_bytes_are_never_read_whole() {
        let dir = std::env::temp_dir().join(format!("tally-blob-{}", uuid::Uuid::new_v4()));
        let store = SqliteStore::open(&dir.join("tally.db"), crate::config::Durability::Normal).expect("open");
        let png = crate::render::placeholder_png("damaged", 64);
        let img = NewImage::verify(png.clone()).expect("a png");
        let up = crate::store::Store::from(store.clone()).save_upload(img, 1_000).await.expect("upload");
        let (_, whole) = store.read_image_bytes(up.id.clone()).await.expect("read").expect("stored");
        assert_eq!(whole, png, "intact bytes read back whole");
        let id = up.id.clone();
        store
            .write(move |c| {
                // Flip one byte of the stored data, keeping the recorded sha256.
                let rowid: i64 = c.query_row("SELECT rowid FROM blobs WHERE id = ?1", [&id], |r| r.get(0))?;
                let mut b = c.blob_open(rusqlite::MAIN_DB, c"blobs", c"data", rowid, false)?;
                let mut one = [0u8; 1];
                b.read_at_exact(&mut one, 40)?;
                b.write_at(&[one[0] ^ 0x5a], 40)?;
                Ok(())
            })
            .await
            .expect("damage");
        let err = store.read_image_bytes(up.id.clone()).await.expect_err("a damaged image is not read whole");
        assert!(matches!(err, StoreError::Damaged { .. }), "{err}");
        assert!(err.to_string().contains("do not match their recorded sha256"), "{err}");
        let mut r = store.open_blob(&up.id).expect("open").expect("stored");
        let mut got = 0;
        loop {
            match r.next_chunk(16) {
                Ok(Some(c)) => got += c.len(),
                Ok(None) => panic!("the damaged image was read to its end"),
                Err(_) => break,
            }
        }
        assert!(got < png.len(), "the last chunk is withheld ({got} of {} bytes)", png.len());
        store.close().expect("close");
        let _ = std::fs::remove_dir_all(dir);
    }
}
