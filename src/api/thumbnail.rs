//! Thumbnails for the web page's lists: `GET /v1/artifacts/{id}/thumbnail` and
//! `GET /v1/uploads/{id}/thumbnail`, the image scaled to fit [`SIZE`]×[`SIZE`] pixels, flattened
//! onto white and sent as a small JPEG (a few kB instead of a full-size PNG per row).
//!
//! Images never change once stored (an artifact or upload id names fixed bytes), so a
//! thumbnail is cached twice: in the browser (`immutable`) and here, in a small in-memory
//! cache bounded by bytes ([`CACHE_BYTES`]) that forgets the oldest first. Decoding runs on a
//! blocking thread, at most [`PARALLEL`] at a time, under the daemon's image budget
//! ([`crate::pixels`]), so a hostile image cannot make tally allocate without bound.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, OnceLock};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::sync::Semaphore;

use super::AppState;
use super::error::ApiError;
use crate::store::Store;

/// The longest side of a thumbnail, in pixels (sharp at about 128 CSS pixels on a 2× screen).
pub const SIZE: u32 = 256;
/// How many bytes of thumbnails the cache keeps.
const CACHE_BYTES: usize = 8 * 1024 * 1024;
/// How many thumbnails are made at once (the machine's cores are for the engine first).
const PARALLEL: usize = 2;

/// The thumbnail cache: id → JPEG bytes, oldest first out.
#[derive(Default)]
struct Cache {
    map: HashMap<String, Bytes>,
    order: VecDeque<String>,
    bytes: usize,
}

impl Cache {
    fn get(&self, key: &str) -> Option<Bytes> {
        self.map.get(key).cloned()
    }

    fn put(&mut self, key: String, value: Bytes) {
        if value.len() > CACHE_BYTES || self.map.contains_key(&key) {
            return;
        }
        self.bytes += value.len();
        self.order.push_back(key.clone());
        self.map.insert(key, value);
        while self.bytes > CACHE_BYTES {
            let Some(old) = self.order.pop_front() else { break };
            if let Some(v) = self.map.remove(&old) {
                self.bytes -= v.len();
            }
        }
    }
}

fn cache() -> &'static Mutex<Cache> {
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    CACHE.get_or_init(Mutex::default)
}

fn permits() -> &'static Semaphore {
    static PERMITS: OnceLock<Semaphore> = OnceLock::new();
    PERMITS.get_or_init(|| Semaphore::new(PARALLEL))
}

/// Scale image bytes (PNG, JPEG or WebP) to fit `size`×`size`, turn it upright by its EXIF
/// orientation, flatten onto white, encode as JPEG. Errors are in words for the API.
/// The pixels are decoded under the daemon's image budget ([`crate::pixels`]): an image too
/// large for it is refused in words before its buffer is allocated, and its ticket is given
/// back as soon as the small copy is made.
pub fn make(bytes: &[u8], size: u32) -> Result<Vec<u8>, String> {
    // Besides the decoder's buffer: the thumbnail and its RGBA copy, both at most size².
    let small = 8 * u64::from(size) * u64::from(size);
    let d = crate::pixels::decode(bytes, crate::pixels::decoded_plus(0, small))
        .map_err(|e| format!("cannot decode the image: {e}"))?;
    let img = d.image;
    let mut small = if img.width() > size || img.height() > size { img.thumbnail(size, size) } else { img };
    // Upright, as the photo was taken (a phone's portrait photo is stored on its side with an
    // EXIF orientation); turning the small copy costs nothing worth counting.
    small.apply_orientation(d.orientation);
    let rgba = small.to_rgba8();
    drop(small);
    drop(d.ticket);
    let mut rgb = image::RgbImage::new(rgba.width(), rgba.height());
    for (dst, src) in rgb.pixels_mut().zip(rgba.pixels()) {
        let a = u16::from(src[3]);
        for c in 0..3 {
            // Alpha over white: c·a + 255·(1 − a).
            dst[c] = ((u16::from(src[c]) * a + 255 * (255 - a)) / 255) as u8;
        }
    }
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 82)
        .encode_image(&rgb)
        .map_err(|e| format!("cannot encode the thumbnail: {e}"))?;
    Ok(out)
}

/// A cached or freshly made thumbnail of the image stored under `id`, answered as
/// `image/jpeg`. The image is read whole (`Store::read_image_bytes`): decoding needs it all.
/// The read checks it against its sha256 on both backends, so a damaged image is 500
/// `image_damaged` (through `ApiError::from`), never a thumbnail of damaged bytes.
async fn answer(store: &Store, key: String, id: String, what: String) -> Result<Response, ApiError> {
    let cached = cache().lock().unwrap_or_else(|e| e.into_inner()).get(&key);
    let jpeg = match cached {
        Some(j) => j,
        None => {
            let _permit = permits().acquire().await.map_err(|_| ApiError::unavailable(&"thumbnails are shut down"))?;
            let (_, bytes) = store
                .read_image_bytes(id)
                .await?
                .ok_or_else(|| ApiError::unavailable(&format!("{what}: its image is not stored")))?;
            let made = tokio::task::spawn_blocking(move || make(&bytes, SIZE))
                .await
                .map_err(|e| ApiError::unavailable(&format!("thumbnail worker: {e}")))?
                .map_err(|why| {
                    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "no_thumbnail", format!("{what}: {why}"))
                })?;
            let made = Bytes::from(made);
            cache().lock().unwrap_or_else(|e| e.into_inner()).put(key, made.clone());
            made
        }
    };
    let mut r = (StatusCode::OK, jpeg).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("image/jpeg"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("private, max-age=31536000, immutable"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    Ok(r)
}

/// `GET /v1/artifacts/{id}/thumbnail`.
#[utoipa::path(
    get,
    path = "/artifacts/{id}/thumbnail",
    operation_id = "get_artifact_thumbnail",
    tag = "images",
    params(super::images::ArtifactId),
    responses(
        (status = 200, description = "A JPEG at most 256 px on a side.", content(("image/jpeg"))),
        (status = 422, description = "The stored image cannot be decoded into a thumbnail (`no_thumbnail`).",
            body = super::error::ErrorBody),
        super::openapi::NotFound,
        super::openapi::ImageDamaged,
        super::openapi::StoreFailure,
    )
)]
pub async fn artifact(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let store = state.engine().store();
    let a = store.artifact(id).await?.ok_or_else(|| ApiError::not_found("artifact"))?;
    answer(store, format!("a/{}", a.id), a.id.clone(), format!("artifact {}", a.id)).await
}

/// `GET /v1/uploads/{id}/thumbnail`.
#[utoipa::path(
    get,
    path = "/uploads/{id}/thumbnail",
    operation_id = "get_upload_thumbnail",
    tag = "images",
    params(super::images::UploadId),
    responses(
        (status = 200, description = "A JPEG at most 256 px on a side.", content(("image/jpeg"))),
        (status = 422, description = "The stored image cannot be decoded into a thumbnail (`no_thumbnail`).",
            body = super::error::ErrorBody),
        super::openapi::NotFound,
        super::openapi::ImageDamaged,
        super::openapi::StoreFailure,
    )
)]
pub async fn upload(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let store = state.engine().store();
    let u = store.upload(id).await?.ok_or_else(|| ApiError::not_found("upload"))?;
    answer(store, format!("u/{}", u.id), u.id.clone(), format!("upload {}", u.id)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_png_becomes_a_small_jpeg_that_keeps_its_shape() {
        let big = crate::render::placeholder_png("red sneaker", 1024);
        let t = make(&big, SIZE).expect("thumbnail");
        assert!(t.starts_with(&[0xff, 0xd8, 0xff]), "a JPEG");
        assert!(t.len() * 4 < big.len(), "{} bytes from {}", t.len(), big.len());
        let img = image::load_from_memory(&t).expect("decodes");
        assert_eq!((img.width(), img.height()), (SIZE, SIZE));
        assert!(make(b"not an image", SIZE).is_err());
    }

    /// A JPEG of `w`×`h` with an EXIF APP1 segment saying `orientation` (1–8), as a phone
    /// stores a portrait photo: the sensor's landscape pixels and "turn 90° clockwise" (6).
    pub(crate) fn jpeg_with_orientation(w: u32, h: u32, orientation: u16) -> Vec<u8> {
        let mut plain = Vec::new();
        let img =
            image::RgbImage::from_fn(
                w,
                h,
                |x, _| if x < w / 2 { image::Rgb([200, 0, 0]) } else { image::Rgb([0, 0, 200]) },
            );
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut plain, 90).encode_image(&img).expect("jpeg");
        // TIFF (little endian): header, one IFD with one entry (0x0112 Orientation, SHORT, 1).
        let mut tiff = b"II*\0".to_vec();
        tiff.extend(8u32.to_le_bytes());
        tiff.extend(1u16.to_le_bytes());
        tiff.extend(0x0112u16.to_le_bytes());
        tiff.extend(3u16.to_le_bytes());
        tiff.extend(1u32.to_le_bytes());
        tiff.extend(orientation.to_le_bytes());
        tiff.extend([0, 0]);
        tiff.extend(0u32.to_le_bytes());
        let mut app1 = b"Exif\0\0".to_vec();
        app1.extend(tiff);
        let mut out = plain[..2].to_vec();
        out.extend([0xff, 0xe1]);
        out.extend(((app1.len() + 2) as u16).to_be_bytes());
        out.extend(app1);
        out.extend(&plain[2..]);
        out
    }

    #[test]
    fn a_portrait_photo_stored_on_its_side_is_shown_upright() {
        let photo = jpeg_with_orientation(400, 200, 6);
        let t = make(&photo, SIZE).expect("thumbnail");
        let img = image::load_from_memory(&t).expect("decodes");
        assert_eq!((img.width(), img.height()), (SIZE / 2, SIZE), "portrait, as taken");
        // Turned clockwise: the sensor's left half (red) is now the top.
        let top = img.to_rgb8().get_pixel(SIZE / 4, 4).0;
        assert!(top[0] > 150 && top[2] < 80, "red on top: {top:?}");
        let upright = make(&jpeg_with_orientation(400, 200, 1), SIZE).expect("thumbnail");
        let img = image::load_from_memory(&upright).expect("decodes");
        assert_eq!((img.width(), img.height()), (SIZE, SIZE / 2), "no orientation: as stored");
    }

    #[test]
    fn the_cache_forgets_the_oldest_beyond_its_bound() {
        let mut c = Cache::default();
        let chunk = Bytes::from(vec![0u8; CACHE_BYTES / 3 + 1]);
        for k in ["a", "b", "c"] {
            c.put(k.into(), chunk.clone());
        }
        assert!(c.get("a").is_none() && c.get("b").is_some() && c.get("c").is_some());
        assert!(c.bytes <= CACHE_BYTES);
    }
}
