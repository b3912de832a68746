//! Downloads a person recognises: file names made from the product and the shot's role
//! (`red-sneaker_main.png`) or the job's prompt (`blue-mug-on-a-wooden-table.png`), sent in
//! `Content-Disposition`, and `GET /v1/sets/{id}/download`, every finished image of a set as
//! one zip streamed while it is written.
//!
//! The zip holds stored entries (PNG, JPEG and WebP are compressed already), one per image,
//! written on a blocking thread into a bounded channel that feeds the response body, so a
//! large set never sits in memory whole. Each image is read from the database in chunks
//! ([`crate::store::BlobReader`]) and checked against its recorded sha256 before the answer
//! starts: a damaged one is left out, and a note in the zip (`NOT-INCLUDED.txt`) names it
//! ([`set_zip`]). The copy checks each image again, so bytes damaged in between end the
//! download with an error instead of going out under a trusted name.
//!
//! `?which=chosen|all` picks the images (default: the chosen image where a shot has one,
//! else every candidate's) and `?profile=NAME` makes each one listing-ready with a delivery
//! profile first (`super::download_profile`).

use std::collections::{HashMap, HashSet};
use std::io::Write;

use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tokio::sync::mpsc;
use utoipa::IntoParams;

use super::AppState;
use super::error::ApiError;
use crate::domain::words::say;
use crate::providers::extension;
use crate::store::{ArtifactView, SetView, Store, StoreError, TaskView};

/// The longest file-name stem made from a prompt or product, in characters.
pub(super) const MAX_STEM: usize = 48;
/// The size of one chunk of a streamed zip.
const CHUNK: usize = 64 * 1024;

pub use crate::delivery::names::slug;

/// A file name's stem for a shot role: `selling_point` → `selling-point`.
fn role_stem(role: Option<&str>) -> String {
    role.and_then(|r| slug(r, MAX_STEM)).unwrap_or_else(|| "shot".into())
}

/// The file names of a set's finished images, in shot order: `red-sneaker_main.png`,
/// `red-sneaker_scene-1.png` and `red-sneaker_scene-2.png` when a role repeats, `-2` after
/// a shot's second image. Names are unique within the set. A shot with a chosen image
/// contributes that image only; a shot without one, every candidate's image.
pub fn set_file_names(set: &SetView) -> Vec<(ArtifactView, String)> {
    let mut names = all_file_names(set);
    names.retain(|(a, _)| {
        let shot = set.candidates.iter().position(|c| c.iter().any(|t| t.id == a.task_id));
        match shot.and_then(|i| set.chosen.get(i).cloned().flatten()) {
            Some(chosen) => chosen == a.id,
            None => true,
        }
    });
    names
}

/// Every finished image of a set with its file name (what a single image is named after,
/// chosen or not), in shot and candidate order.
fn all_file_names(set: &SetView) -> Vec<(ArtifactView, String)> {
    let product = slug(&set.product, MAX_STEM).unwrap_or_else(|| "image-set".into());
    let mut per_role: HashMap<String, usize> = HashMap::new();
    for shot in &set.shots {
        *per_role.entry(role_stem(shot.shot_role.as_deref())).or_default() += 1;
    }
    let mut seen_role: HashMap<String, usize> = HashMap::new();
    let mut taken: HashSet<String> = HashSet::new();
    let mut out = Vec::new();
    for (shot, cands) in set.shots.iter().zip(&set.candidates) {
        let role = role_stem(shot.shot_role.as_deref());
        let n = seen_role.entry(role.clone()).or_default();
        *n += 1;
        let stem = if per_role.get(&role).copied().unwrap_or(0) > 1 {
            format!("{product}_{role}-{n}")
        } else {
            format!("{product}_{role}")
        };
        for (i, a) in cands.iter().flat_map(|t| &t.artifacts).enumerate() {
            let mut name = if i == 0 { stem.clone() } else { format!("{stem}-{}", i + 1) };
            while taken.contains(&name) {
                name.push('x');
            }
            taken.insert(name.clone());
            out.push((a.clone(), format!("{name}.{}", extension(&a.media_type))));
        }
    }
    out
}

/// The download name of a single job's image: from its set (product and role) when it is a
/// shot, else from its prompt.
pub fn artifact_file_name(task: &TaskView, set: Option<&SetView>, artifact: &ArtifactView) -> String {
    if let Some(set) = set
        && let Some((_, name)) = all_file_names(set).into_iter().find(|(a, _)| a.id == artifact.id)
    {
        return name;
    }
    let stem = slug(&task.prompt, MAX_STEM).unwrap_or_else(|| "image".into());
    let n = task.artifacts.iter().position(|a| a.id == artifact.id).unwrap_or(0);
    let stem = if n == 0 { stem } else { format!("{stem}-{}", n + 1) };
    format!("{stem}.{}", extension(&artifact.media_type))
}

/// `name` with the last 8 hex digits of `id` (its random part: UUIDv7 ids made close together
/// share their first digits) before the extension: `red-sneaker_main_5c1d9e2f.png`, so two
/// versions of one shot saved into one folder keep apart.
pub fn with_short_id(name: &str, id: &str) -> String {
    let hexits: Vec<char> = id.chars().filter(char::is_ascii_hexdigit).map(|c| c.to_ascii_lowercase()).collect();
    let short: String = hexits[hexits.len().saturating_sub(8)..].iter().collect();
    match name.rsplit_once('.') {
        Some((stem, ext)) => format!("{stem}_{short}.{ext}"),
        None => format!("{name}_{short}"),
    }
}

/// A `Content-Disposition` value (`inline` or `attachment`) naming `name`: an ASCII
/// `filename=` for old clients and the exact UTF-8 name in `filename*=` (RFC 6266).
pub fn content_disposition(disposition: &str, name: &str) -> HeaderValue {
    let ascii: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect();
    let encoded: String = name
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"._-".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") }
        })
        .collect();
    HeaderValue::from_str(&format!("{disposition}; filename=\"{ascii}\"; filename*=UTF-8''{encoded}"))
        .unwrap_or_else(|_| HeaderValue::from_static("attachment"))
}

/// The file name a `Content-Disposition` value gives (`filename*=` preferred), reduced to a
/// plain file name (no directories), or `None`.
pub fn disposition_file_name(value: &str) -> Option<String> {
    let mut plain = None;
    for part in value.split(';').map(str::trim) {
        if let Some(v) = part.strip_prefix("filename*=") {
            let v = v.trim_matches('"');
            let encoded = v.split("''").nth(1)?;
            let mut bytes = Vec::new();
            let mut it = encoded.bytes();
            while let Some(b) = it.next() {
                if b == b'%' {
                    let hi = (it.next()? as char).to_digit(16)?;
                    let lo = (it.next()? as char).to_digit(16)?;
                    bytes.push((hi * 16 + lo) as u8);
                } else {
                    bytes.push(b);
                }
            }
            return plain_file_name(&String::from_utf8(bytes).ok()?);
        }
        if let Some(v) = part.strip_prefix("filename=") {
            plain = plain_file_name(v.trim_matches('"'));
        }
    }
    plain
}

/// `name` if it is one plain file name: not empty, no `/` or `\`, not `.` or `..`, no
/// control characters.
pub fn plain_file_name(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\'])
        && !name.chars().any(char::is_control);
    ok.then(|| name.to_string())
}

/// `GET /v1/sets/{id}/download` query.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DownloadQuery {
    /// A delivery profile (a built-in such as `amazon`, `taobao_main` or `original`, or one from
    /// `[[delivery.profiles]]`): each image is made listing-ready with it (pixel size, fit,
    /// background, format, byte limit), named by its `file_name` pattern, and the zip carries
    /// `manifest.csv` and `manifest.json`. Absent: the images as generated.
    #[param(schema_with = super::openapi::profile_names)]
    pub profile: Option<String>,
    /// `chosen`: only the shots' chosen images; `all`: every candidate's image. Absent: the
    /// chosen image where a shot has one, else every candidate's.
    #[param(schema_with = super::openapi::which_names)]
    pub which: Option<String>,
}

/// Which of a set's images a download holds (`?which=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// No `which`: the chosen image where a shot has one, else every candidate's.
    Default,
    /// `chosen`: only chosen images.
    Chosen,
    /// `all`: every candidate's image.
    All,
}

impl Which {
    /// Parse `?which=`.
    pub fn parse(v: Option<&str>) -> Result<Which, ApiError> {
        match v.map(str::trim) {
            None | Some("") => Ok(Which::Default),
            Some("chosen") => Ok(Which::Chosen),
            Some("all") => Ok(Which::All),
            Some(o) => Err(ApiError::bad_request(format!("which=`{o}` must be \"chosen\" or \"all\""))),
        }
    }
}

/// A set's finished images with their download names, as `which` picks them.
pub fn picked_file_names(set: &SetView, which: Which) -> Vec<(ArtifactView, String)> {
    match which {
        Which::Default => set_file_names(set),
        Which::All => all_file_names(set),
        Which::Chosen => {
            let chosen: HashSet<&str> = set.chosen.iter().flatten().map(String::as_str).collect();
            all_file_names(set).into_iter().filter(|(a, _)| chosen.contains(a.id.as_str())).collect()
        }
    }
}

/// What the zip writer needs of one image.
struct Entry {
    id: String,
    name: String,
    sha256: String,
    created_at: crate::domain::Millis,
}

/// The name of the note a set zip carries when it leaves damaged images out.
pub const LEFT_OUT_NOTE: &str = "NOT-INCLUDED.txt";
/// The response header saying how many of the set's images the zip leaves out (damaged).
pub const LEFT_OUT_HEADER: &str = "tally-images-left-out";

/// `GET /v1/sets/{id}/download`: the set's finished images as one zip (`application/zip`,
/// `attachment; filename="<product>.zip"`), one stored entry per image in shot order, named
/// by [`set_file_names`]. 409 `no_images` when no shot has an image yet (`nothing_chosen`
/// with `which=chosen` and no shot chosen). With `?profile=` the images are made with that
/// delivery profile first (`super::download_profile::profile_zip`).
///
/// Damaged images are left out, not sent: before the answer starts, every image is read once
/// and checked against its recorded sha256 (on a blocking thread, in chunks; the copy into the
/// zip reads it again). One that fails (or is not stored) gets no entry; the zip ends with
/// [`LEFT_OUT_NOTE`] naming each one left out and why, and [`LEFT_OUT_HEADER`] counts them.
/// When every image is damaged the answer is 500 `image_damaged` instead of a zip. Should an
/// image change between the check and its copy, the copy's own check ends the transfer with
/// an error (an incomplete download, never a complete-looking zip).
#[utoipa::path(
    get,
    path = "/sets/{id}/download",
    operation_id = "download_set",
    tag = "sets",
    params(super::sets::SetId, DownloadQuery),
    responses(
        (status = 200, description = "The set's finished images as one zip, `<product>_<role>.png` each (with \
            `profile`: made with that delivery profile, named by its `file_name` pattern, with `manifest.csv` and \
            `manifest.json`; an image the profile cannot be made from is left out and named in \
            `NOT-INCLUDED.txt`). Damaged \
            images are left out; then the zip's last entry is `NOT-INCLUDED.txt`, naming each one left out and \
            why, and `Tally-Images-Left-Out` counts them.",
            content(("application/zip")),
            headers(
                ("Content-Disposition" = String, description = "`attachment; filename=\"<product>.zip\"`"),
                ("Tally-Images-Left-Out" = u32, description = "How many damaged images the zip leaves out \
                    (only when it leaves some out)"),
            )),
        (status = 400, description = "An unknown `profile` (the message lists the known ones) or a `which` \
            other than `chosen` or `all` (`bad_request`).", body = super::error::ErrorBody),
        (status = 409, description = "None of the set's shots has a finished image yet (`no_images`), \
            none of the picked images can be made with the profile (`cannot_make`, saying why), or \
            `which=chosen` and no shot has a chosen image (`nothing_chosen`).",
            body = super::error::ErrorBody),
        (status = 422, description = "A `profile` other than `original` (`invalid_request`).",
            body = super::error::ErrorBody),
        (status = 500, description = "Every image of the set is damaged (`image_damaged`); `tally check` \
            lists them.", body = super::error::ErrorBody),
        super::openapi::NotFound,
        super::openapi::StoreFailure,
    )
)]
pub async fn set_zip(
    State(state): State<AppState>,
    UrlPath(id): UrlPath<String>,
    query: Result<Query<DownloadQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query?;
    let which = Which::parse(q.which.as_deref())?;
    let profile = match q.profile.as_deref().map(str::trim).filter(|p| !p.is_empty()) {
        None => None,
        Some(name) => {
            let all = state.delivery_profiles();
            let found = all.iter().find(|p| p.name == name).cloned();
            Some(found.ok_or_else(|| {
                let known: Vec<&str> = all.iter().map(|p| p.name.as_str()).collect();
                ApiError::bad_request(format!("profile `{name}` is not one tally has; use one of {}", known.join(", ")))
            })?)
        }
    };
    let set = state.engine().store().get_set(id).await?.ok_or_else(|| ApiError::not_found("set"))?;
    let files = picked_file_names(&set, which);
    if files.is_empty() {
        if which == Which::Chosen && !all_file_names(&set).is_empty() {
            return Err(ApiError::conflict("nothing_chosen", say("say.no_choice_yet")));
        }
        return Err(ApiError::conflict("no_images", say("say.error_no_finished")));
    }
    if let Some(profile) = profile {
        return super::download_profile::profile_zip(&state, &set, files, &profile).await;
    }
    let entries: Vec<Entry> = files
        .into_iter()
        .map(|(a, name)| Entry { id: a.id, name, sha256: a.sha256, created_at: a.created_at })
        .collect();
    // Check every image first (both backends: through the store's blob reader).
    let store = state.engine().store().clone();
    let (good, left_out) = tokio::task::spawn_blocking(move || sort_damaged(&store, entries))
        .await
        .map_err(|e| ApiError::unavailable(&e))??;
    if good.is_empty() {
        let (first, why) = &left_out[0];
        return Err(ApiError::damaged(
            &first.id,
            &format!("{why}; every image of this set is damaged ({} of them)", left_out.len()),
        ));
    }
    let note = (!left_out.is_empty()).then(|| left_out_note(&left_out));
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    tokio::task::spawn_blocking(move || {
        let errors = tx.clone();
        let out = ChannelWriter { tx, buf: Vec::with_capacity(CHUNK) };
        if let Err(e) = write_zip(&good, note.as_deref(), out) {
            tracing::warn!(error = %e, "a set download ended early");
            let _ = errors.blocking_send(Err(e));
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    let name = zip_name(&set, None);
    let mut r = (StatusCode::OK, Body::from_stream(stream)).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/zip"));
    h.insert(header::CONTENT_DISPOSITION, content_disposition("attachment", &name));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    if !left_out.is_empty() {
        h.insert(LEFT_OUT_HEADER, HeaderValue::from(left_out.len()));
    }
    Ok(r)
}

/// Images a set zip leaves out, each with why.
type LeftOut = Vec<(Entry, String)>;
/// Images a set zip holds, each with its bytes (read and checked before the first byte).
type ReadBack = Vec<(Entry, Vec<u8>)>;

/// The set zip's name: `<product>.zip`, or `<product>_<profile>.zip` for a profile.
pub(super) fn zip_name(set: &SetView, profile: Option<&str>) -> String {
    let product = slug(&set.product, MAX_STEM).unwrap_or_else(|| "image-set".into());
    match profile.and_then(|p| slug(p, MAX_STEM)) {
        Some(p) => format!("{product}_{p}.zip"),
        None => format!("{product}.zip"),
    }
}

/// Read every entry's image whole, checked against its sha256, before the zip's first byte:
/// the images that read back intact (with their bytes), and those left out with why
/// (damaged, not stored, or pruned since the set was read). Any other store failure ends the
/// request. Nothing is read from the store once the zip starts, so a prune or a failing disk
/// meanwhile cannot cut a zip short: it is whole, or refused before its first byte. A set is a
/// handful of images of a few MB, held for the length of one download.
fn sort_damaged(store: &Store, entries: Vec<Entry>) -> Result<(ReadBack, LeftOut), StoreError> {
    let (mut good, mut bad) = (Vec::new(), Vec::new());
    for e in entries {
        let checked = match store.open_blob(&e.id)? {
            None => Err("its image is not stored".to_string()),
            Some(r) if r.meta().sha256 != e.sha256 => {
                Err("its stored image does not match the sha256 the set records".to_string())
            }
            Some(mut r) => match r.read_all() {
                Ok(bytes) => Ok(bytes),
                Err(StoreError::Damaged { why, .. }) => Err(why),
                Err(StoreError::Gone { .. }) => Err("its image was deleted while the zip was made".to_string()),
                Err(other) => return Err(other),
            },
        };
        match checked {
            Ok(bytes) => good.push((e, bytes)),
            Err(why) => {
                tracing::error!(image = %e.id, %why, "a set download leaves an image out");
                bad.push((e, why));
            }
        }
    }
    Ok((good, bad))
}

/// The text of [`LEFT_OUT_NOTE`]: which images the zip leaves out, and why.
fn left_out_note(left_out: &[(Entry, String)]) -> String {
    let mut t = format!(
        "{} image(s) of this set are NOT in this zip: they could not be read back intact from tally's database \
         (each line says why).\n\
         For a damaged image, run `tally check` on the daemon's machine to list every damaged image; restore a \
         backup that has them, or retry the shots to make them again.\n\n",
        left_out.len()
    );
    for (e, why) in left_out {
        t.push_str(&format!("{}  (artifact {}): {why}\n", e.name, e.id));
    }
    t
}

/// Write the zip from the images already read and checked ([`sort_damaged`]), each a stored
/// entry; then `note`, if any, as [`LEFT_OUT_NOTE`].
fn write_zip(entries: &[(Entry, Vec<u8>)], note: Option<&str>, out: ChannelWriter) -> std::io::Result<()> {
    use zip::write::SimpleFileOptions;
    let mut zip = zip::ZipWriter::new_stream(out);
    for (e, bytes) in entries {
        let opts = SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .last_modified_time(zip_time(e.created_at))
            .unix_permissions(0o644);
        zip.start_file(e.name.as_str(), opts).map_err(std::io::Error::other)?;
        zip.write_all(bytes)?;
    }
    if let Some(note) = note {
        let opts =
            SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored).unix_permissions(0o644);
        zip.start_file(LEFT_OUT_NOTE, opts).map_err(std::io::Error::other)?;
        zip.write_all(note.as_bytes())?;
    }
    let mut out = zip.finish().map_err(std::io::Error::other)?.into_inner();
    out.flush()
}

/// One file of an in-memory zip: its name, its bytes, and its time (`None`: the zip's default).
pub(crate) type ZipEntry<'a> = (&'a str, &'a [u8], Option<crate::domain::Millis>);

/// A zip held in memory with every entry stored, not compressed (images are compressed
/// already, and a stored entry is the file byte for byte): the profile downloads and the
/// delivered files' download.
pub(crate) fn stored_zip(entries: &[ZipEntry]) -> zip::result::ZipResult<Vec<u8>> {
    use zip::write::SimpleFileOptions;
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let stored =
        SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored).unix_permissions(0o644);
    for (name, bytes, at) in entries {
        zip.start_file(*name, at.map_or(stored, |at| stored.last_modified_time(zip_time(at))))?;
        zip.write_all(bytes)?;
    }
    Ok(zip.finish()?.into_inner())
}

/// A zip entry's time (UTC; zip has no zone) from milliseconds since the epoch.
pub(crate) fn zip_time(ms: crate::domain::Millis) -> zip::DateTime {
    let days = ms.div_euclid(86_400_000);
    let secs = ms.rem_euclid(86_400_000) / 1000;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    zip::DateTime::from_date_and_time(
        u16::try_from(year).unwrap_or(1980),
        month as u8,
        day as u8,
        (secs / 3600) as u8,
        (secs / 60 % 60) as u8,
        (secs % 60) as u8,
    )
    .unwrap_or_default()
}

/// A `Write` that sends full chunks into the response body's channel (blocking: it runs on a
/// blocking thread). A closed channel (the client went away) is a broken pipe.
struct ChannelWriter {
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    buf: Vec<u8>,
}

impl ChannelWriter {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client stopped the download"))
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_readable_file_names() {
        assert_eq!(slug("Red Sneaker", 48).as_deref(), Some("red-sneaker"));
        assert_eq!(slug("  Café au lait — mug! ", 48).as_deref(), Some("café-au-lait-mug"));
        assert_eq!(slug("../../etc/passwd", 48).as_deref(), Some("etc-passwd"));
        assert_eq!(slug("!!!", 48), None);
        let long = slug("the shoe on a white background with soft studio light and a shadow", 30).unwrap();
        assert!(long.chars().count() <= 30 && !long.ends_with('-'), "{long}");
        assert_eq!(long, "the-shoe-on-a-white-background");
    }

    #[test]
    fn short_ids_keep_two_versions_apart() {
        let id = "01a2b3c4-0000-7000-8000-00005c1d9e2f";
        assert_eq!(with_short_id("red-sneaker_main.png", id), "red-sneaker_main_5c1d9e2f.png");
        assert_eq!(with_short_id("image", id), "image_5c1d9e2f");
    }

    #[test]
    fn disposition_round_trips_and_refuses_paths() {
        let v = content_disposition("attachment", "café_main.png");
        let text = v.to_str().unwrap();
        assert!(text.starts_with("attachment; filename=\"caf__main.png\""), "{text}");
        assert_eq!(disposition_file_name(text).as_deref(), Some("café_main.png"));
        assert_eq!(disposition_file_name("attachment; filename=\"a.png\"").as_deref(), Some("a.png"));
        assert_eq!(disposition_file_name("attachment; filename=\"../a.png\""), None);
        assert_eq!(disposition_file_name("attachment; filename*=UTF-8''..%2Fa.png"), None);
    }

    #[test]
    fn zip_times_are_civil_dates() {
        // 2026-12-01T09:29:45Z; zip (DOS) times count seconds in steps of two.
        let t = zip_time(1_796_117_385_000);
        assert_eq!((t.year(), t.month(), t.day(), t.hour(), t.minute(), t.second()), (2026, 12, 1, 9, 29, 44));
        let leap = zip_time(1_709_164_800_000); // 2024-02-29T00:00:00Z
        assert_eq!((leap.year(), leap.month(), leap.day()), (2024, 2, 29));
    }
}
