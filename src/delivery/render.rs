//! Making a profile's file from a chosen image ([`render`]) and saying in plain words why an
//! image will not meet a profile ([`check`]). Local work at no cost, CPU-bound and blocking:
//! an async caller runs it on a blocking thread (`tokio::task::spawn_blocking`).
//! Past 600 lines because the render and the checks share one pipeline and must agree on it;
//! the listing rules and the words on the image have their own modules.
//!
//! The steps of a render, in order: decode (PNG, JPEG or WebP, under the daemon's image budget:
//! [`crate::pixels`], so an image too large for it is refused with its size before its pixels
//! are allocated), convert to 8-bit sRGB (an embedded ICC profile is converted
//! with `moxcms`, the colour engine the `image` crate itself uses; an image without one is
//! taken as sRGB), flatten any transparency onto the profile's `background`, apply the EXIF
//! orientation, scale with
//! `fit` (pad: fit inside and fill the rest with `background`, never cropping; crop: cover
//! and cut the overflow equally from both sides), and encode without metadata (no EXIF, no
//! ICC, no text chunks). Scaling is `fast_image_resize`'s (SIMD, Catmull-Rom; an area average
//! for a shrink to half or less), straight into the padded canvas; JPEG is `jpeg-encoder`'s
//! (baseline, 4:4:4 as before, SIMD where the CPU has AVX2) — together several times faster
//! than the `image` crate's own, for the same pictures (issue #41). A JPEG that is over `max_bytes` is encoded again at a quality 5
//! lower, down to [`MIN_QUALITY`]; PNG tries the strongest compression; WebP is lossless
//! (see [`super::profile::Render::quality`]). Deterministic: the same source and profile give
//! the same bytes, so a resumed delivery can compare sha256s.

use std::io::Cursor;

use fast_image_resize as fir;
use image::{DynamicImage, ImageDecoder, ImageFormat, RgbImage, RgbaImage};
use sha2::{Digest, Sha256};

pub use super::listing::Listing;
use super::profile::{Fit, Format, MIN_QUALITY, Profile, Render, Rgb};

/// The largest source side decoded (a larger image is refused as unreadable).
pub const MAX_SOURCE_SIDE: u32 = crate::pixels::MAX_SIDE;

/// A made file.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Rendered {
    /// The file's bytes.
    pub bytes: Vec<u8>,
    /// Its pixel width and height.
    pub width: u32,
    pub height: u32,
    /// Its media type (`image/jpeg`, …).
    pub media_type: &'static str,
    /// Its extension without the dot (`jpg`, `png`, `webp`), for `{ext}`.
    pub ext: &'static str,
    /// The lowercase hex sha256 of `bytes`.
    pub sha256: String,
    /// The JPEG quality it was written at (`None`: not a JPEG made here).
    pub quality: Option<u8>,
}

/// Why a file could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[allow(missing_docs)]
pub enum RenderError {
    /// The source is not an image this can read (plain words why).
    #[error("{0}")]
    Unreadable(String),
    /// Even at the lowest quality (or strongest lossless compression) the file is over the
    /// profile's `max_bytes`.
    #[error("the file is {smallest} bytes at best; profile `{profile}` takes at most {max_bytes} bytes")]
    TooManyBytes { profile: String, max_bytes: u64, smallest: u64 },
    /// The image is too large for the daemon's image budget (its size and the budget, in
    /// words): refused before its pixels were decoded.
    #[error("{0}")]
    TooLarge(String),
    /// Encoding failed (not expected for valid pixels).
    #[error("cannot encode the file: {0}")]
    Encode(String),
    /// A `main_white` shot's chosen image has no product to compose on white (nothing found,
    /// no background found, or not a cutout), in plain words.
    #[error("{0}")]
    NoProduct(String),
    /// The shot's words cannot be drawn (they do not fit, a character the font lacks, …).
    #[error("{0}")]
    Overlay(String),
}

/// What kind of problem [`check`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemKind {
    /// The source cannot be read as an image.
    Unreadable,
    /// The source is too large to work on within the daemon's image budget.
    TooLarge,
    /// A source side is below the profile's `min_source`.
    TooSmall,
    /// The source has transparent pixels and the profile keeps them (`original`); every
    /// rendered profile fills them with its `background` instead.
    Transparent,
    /// No quality meets the profile's `max_bytes`.
    TooManyBytes,
    /// A rule of the profile measured on the file made (`background_rule`, `fill`,
    /// `no_alpha`) is not met.
    Rule,
    /// A `main_white` shot's image has no product to compose on white.
    NoProduct,
    /// The shot's words cannot be drawn.
    Overlay,
}

/// One reason an image will not meet a profile, in plain words.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Problem {
    pub kind: ProblemKind,
    /// A sentence for the owner: "the Main photo's chosen image is 800 px wide; amazon asks
    /// for at least 1000 px".
    pub message: String,
}

/// Make `profile`'s file from `source` (the chosen image's bytes). For `original` the bytes
/// are returned untouched (only their size and format are read).
pub fn render(profile: &Profile, source: &[u8]) -> Result<Rendered, RenderError> {
    render_listing(profile, source, &Listing::default())
}

/// [`render`] with what the shot adds ([`Listing`]): a `main_white` shot's cutout composed on
/// pure white instead of fitted, and the owner's words drawn on the frame before encoding.
/// `original` takes neither: it delivers the bytes as generated.
pub fn render_listing(profile: &Profile, source: &[u8], listing: &Listing<'_>) -> Result<Rendered, RenderError> {
    let Some(spec) = profile.render else {
        if listing.overlay.is_some() {
            return Err(RenderError::Overlay(crate::domain::words::say_with(
                "say.overlay_needs_render",
                &[("profile", &profile.name)],
            )));
        }
        return original(profile, source);
    };
    let (mut frame, _ticket) = if listing.white {
        super::listing::compose_white(source, &spec, profile.fill)?
    } else {
        let (flat, ticket) = decode_flat(source, spec.background, |w, h| fit_peak(w, h, &spec))?;
        (fit(flat, &spec)?, ticket)
    };
    if let Some(o) = listing.overlay {
        super::overlay::draw(&mut frame, o).map_err(|e| RenderError::Overlay(e.said()))?;
    }
    encode(profile, &spec, frame)
}

/// Why `source` will not meet `profile`, in plain words about `subject` (e.g. "the Main
/// photo's chosen image"); empty when it will. Reports, in this order: an unreadable image (or
/// one too large for the daemon's image budget), a side below `min_source`, transparency
/// `original` would keep, and a file over `max_bytes` at any quality. Costs a full render for
/// a rendered profile (that is the only way to know both that it decodes and how many bytes
/// it makes); one decode for `original`. Holds at most one image-budget ticket at a time.
pub fn check(profile: &Profile, source: &[u8], subject: &str) -> Vec<Problem> {
    check_and_render(profile, source, subject).0
}

/// [`check`], also giving back the file the check rendered (a rendered profile's, when it
/// could be made), so that a caller about to deliver it need not render it again.
pub fn check_and_render(profile: &Profile, source: &[u8], subject: &str) -> (Vec<Problem>, Option<Rendered>) {
    check_listing(profile, source, &Listing::default(), subject)
}

/// [`check_and_render`] with what the shot adds ([`Listing`]); the profile's rules
/// (`background_rule`, `fill`, `no_alpha`: [`super::listing::problems`]) are measured on the
/// file made, and a file that breaks one is not given back.
pub fn check_listing(
    profile: &Profile,
    source: &[u8],
    listing: &Listing<'_>,
    subject: &str,
) -> (Vec<Problem>, Option<Rendered>) {
    let mut file = None;
    let mut problems = check_into(profile, source, listing, subject, &mut file);
    if let Some(f) = &file {
        let broken = super::listing::problems(profile, f, subject);
        if !broken.is_empty() {
            file = None;
            problems.extend(broken);
        }
    }
    (problems, file)
}

fn check_into(
    profile: &Profile,
    source: &[u8],
    listing: &Listing<'_>,
    subject: &str,
    file: &mut Option<Rendered>,
) -> Vec<Problem> {
    let problem = |kind, message: String| Problem { kind, message };
    let unreadable = |e: &RenderError| match e {
        RenderError::NoProduct(m) => vec![problem(ProblemKind::NoProduct, subject_reason(subject, m))],
        RenderError::Overlay(m) => vec![problem(ProblemKind::Overlay, subject_reason(subject, m))],
        _ => {
            let kind =
                if matches!(e, RenderError::TooLarge(_)) { ProblemKind::TooLarge } else { ProblemKind::Unreadable };
            let why = e.to_string();
            vec![problem(
                kind,
                crate::domain::words::say_with("say.chosen_unreadable", &[("subject", subject), ("why", &why)]),
            )]
        }
    };
    // The size from the header alone: no pixels are decoded for it.
    let (w, h) = match header_dimensions(source) {
        Ok(d) => d,
        Err(e) => return unreadable(&e),
    };
    let mut out = Vec::new();
    out.extend(too_small(profile, w, h, subject));
    let too_big = match (profile.render, profile.max_bytes) {
        (Some(_), max) => match render_listing(profile, source, listing) {
            Ok(f) => {
                *file = Some(f);
                None
            }
            Err(RenderError::TooManyBytes { smallest, max_bytes, .. }) => Some((smallest, max.unwrap_or(max_bytes))),
            Err(e) => return unreadable(&e),
        },
        (None, max) => {
            if listing.overlay.is_some() {
                return unreadable(&RenderError::Overlay(crate::domain::words::say_with(
                    "say.overlay_needs_render",
                    &[("profile", &profile.name)],
                )));
            }
            match transparent(source) {
                Ok(false) => {}
                Ok(true) => out.push(problem(
                    ProblemKind::Transparent,
                    format!(
                        "{subject} has transparent areas, and `{}` delivers the image as generated, so they stay \
                         transparent (a marketplace may show them grey or black); a profile with a background fills them",
                        profile.name
                    ),
                )),
                Err(e) => return unreadable(&e),
            }
            max.and_then(|m| (source.len() as u64 > m).then_some((source.len() as u64, m)))
        }
    };
    if let Some((n, max)) = too_big {
        out.push(too_many_bytes(profile, n, max, subject));
    }
    out
}

/// "{subject}: {reason}", from the catalogue (so both are translated where they are its lines).
fn subject_reason(subject: &str, reason: &str) -> String {
    crate::domain::words::say_with("say.subject_reason", &[("subject", subject), ("reason", reason)])
}

/// Whether any pixel of `source` is not fully opaque (one decode, under the image budget).
fn transparent(source: &[u8]) -> Result<bool, RenderError> {
    let d = crate::pixels::decode(source, crate::pixels::decoded_plus(4, 0))?;
    if !d.image.color().has_alpha() {
        return Ok(false);
    }
    let rgba = d.image.into_rgba8();
    Ok(rgba.pixels().any(|p| p[3] < 255))
}

/// A file of `n` bytes is over `profile`'s `max` bytes, in plain words about `subject`.
pub fn too_many_bytes(profile: &Profile, n: u64, max: u64, subject: &str) -> Problem {
    Problem {
        kind: ProblemKind::TooManyBytes,
        message: crate::domain::words::say_with(
            "say.too_many_bytes",
            &[("subject", subject), ("size", &human_bytes(n)), ("profile", &profile.name), ("max", &human_bytes(max))],
        ),
    }
}

/// Whether a `w`×`h` source is below `profile`'s `min_source`, in plain words about `subject`
/// ("the Main photo's chosen image is 800 px wide; amazon asks for at least 1000 px"). The one
/// wording of this reason: [`check`] and a set's `delivery.blocking` both use it.
pub fn too_small(profile: &Profile, w: u32, h: u32, subject: &str) -> Option<Problem> {
    let min = profile.min_source?;
    if w.min(h) >= min {
        return None;
    }
    let (key, side, n) = if w <= h { ("say.too_small_wide", "w", w) } else { ("say.too_small_high", "h", h) };
    let (n, min) = (n.to_string(), min.to_string());
    let params = [("subject", subject), (side, n.as_str()), ("profile", profile.name.as_str()), ("min", min.as_str())];
    let message = crate::domain::words::say_with(key, &params);
    Some(Problem { kind: ProblemKind::TooSmall, message })
}

/// An image's upright pixel size read from its header (PNG, JPEG or WebP), without decoding
/// its pixels: the size a render would see (an EXIF orientation that turns it a quarter is
/// applied). `source` may be only the first part of the file; an error then means "read more".
pub fn header_dimensions(source: &[u8]) -> Result<(u32, u32), RenderError> {
    use image::metadata::Orientation;
    let reader = image::ImageReader::new(Cursor::new(source))
        .with_guessed_format()
        .map_err(|e| RenderError::Unreadable(e.to_string()))?;
    if !matches!(reader.format(), Some(ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP)) {
        return Err(RenderError::Unreadable(not_an_image()));
    }
    let mut decoder = reader.into_decoder().map_err(|e| RenderError::Unreadable(e.to_string()))?;
    let (w, h) = decoder.dimensions();
    let turned = matches!(
        decoder.orientation().unwrap_or(Orientation::NoTransforms),
        Orientation::Rotate90 | Orientation::Rotate270 | Orientation::Rotate90FlipH | Orientation::Rotate270FlipH
    );
    Ok(if turned { (h, w) } else { (w, h) })
}

/// `n` bytes in words: `812 KB`, `10.0 MB`.
pub fn human_bytes(n: u64) -> String {
    match n {
        0..1_000 => format!("{n} bytes"),
        1_000..1_000_000 => format!("{} KB", n / 1_000),
        _ => format!("{:.1} MB", n as f64 / 1e6),
    }
}

/// The lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    crate::domain::hex(&Sha256::digest(bytes))
}

/// `original`: the bytes as generated; only the header is read for the size and format.
fn original(profile: &Profile, source: &[u8]) -> Result<Rendered, RenderError> {
    let reader = image::ImageReader::new(Cursor::new(source))
        .with_guessed_format()
        .map_err(|e| RenderError::Unreadable(e.to_string()))?;
    let format = reader.format().ok_or_else(|| RenderError::Unreadable(not_an_image()))?;
    let (width, height) = reader.into_dimensions().map_err(|e| RenderError::Unreadable(e.to_string()))?;
    if let Some(max) = profile.max_bytes
        && source.len() as u64 > max
    {
        return Err(RenderError::TooManyBytes {
            profile: profile.name.clone(),
            max_bytes: max,
            smallest: source.len() as u64,
        });
    }
    Ok(Rendered {
        bytes: source.to_vec(),
        width,
        height,
        media_type: format.to_mime_type(),
        ext: format.extensions_str().first().copied().unwrap_or("bin"),
        sha256: sha256_hex(source),
        quality: None,
    })
}

fn not_an_image() -> String {
    "it is not a PNG, JPEG or WebP image".into()
}

/// Decode `source` under the daemon's image budget and bring it to upright, opaque 8-bit sRGB
/// over `bg`; `after(w, h)` is the most the caller's work on the result holds at once besides
/// it. Returns the pixels with the ticket that pays for them (drop both together). The order of
/// the steps keeps at most two full-size buffers alive at once: the decoded image becomes RGBA
/// (the decoder's buffer is dropped once converted), is converted to sRGB in place, flattened
/// into RGB (the RGBA is then dropped), and turned upright last (a quarter turn copies the RGB).
fn decode_flat(
    source: &[u8],
    bg: Rgb,
    after: impl Fn(u32, u32) -> u64,
) -> Result<(RgbImage, crate::pixels::Ticket<'static>), RenderError> {
    let peak = |s: crate::pixels::Size| {
        let px = s.pixels();
        let decoding = s.decoded + 4 * px;
        let flattening = 7 * px;
        // Either way up: the orientation is not known from the size alone.
        let fitting = 3 * px + after(s.width, s.height).max(after(s.height, s.width));
        decoding.max(flattening).max(6 * px).max(fitting)
    };
    let d = crate::pixels::decode(source, peak)?;
    let flat = if d.image.color().has_alpha() {
        let mut rgba = d.image.into_rgba8();
        if let Some(icc) = &d.icc {
            let (w, _) = rgba.dimensions();
            to_srgb(&mut rgba, w, moxcms::Layout::Rgba, icc);
        }
        flatten(&rgba, bg)
    } else {
        // Nothing to flatten: straight to RGB (a move when the file is 8-bit RGB already).
        let mut rgb = d.image.into_rgb8();
        if let Some(icc) = &d.icc {
            let (w, _) = rgb.dimensions();
            to_srgb(&mut rgb, w, moxcms::Layout::Rgb, icc);
        }
        rgb
    };
    let mut upright = DynamicImage::ImageRgb8(flat);
    upright.apply_orientation(d.orientation);
    Ok((upright.into_rgb8(), d.ticket))
}

impl From<crate::pixels::DecodeError> for RenderError {
    fn from(e: crate::pixels::DecodeError) -> Self {
        match e {
            crate::pixels::DecodeError::Unreadable(m) => RenderError::Unreadable(m),
            e @ crate::pixels::DecodeError::TooLarge { .. } => RenderError::TooLarge(e.to_string()),
        }
    }
}

/// Convert pixels (`layout`, `width` per row) described by an embedded ICC profile to sRGB in
/// place, a band of rows at a time (no second full-size buffer). A profile moxcms cannot use
/// (damaged, or not an RGB one) leaves the pixels as they are.
fn to_srgb(raw: &mut [u8], width: u32, layout: moxcms::Layout, icc: &[u8]) {
    use moxcms::{ColorProfile, TransformOptions};
    let Ok(src) = ColorProfile::new_from_slice(icc) else { return };
    let Ok(t) = src.create_transform_8bit(layout, &ColorProfile::new_srgb(), layout, TransformOptions::default())
    else {
        return;
    };
    let band = (width as usize * layout.channels() * 64).max(layout.channels());
    let mut out = vec![0u8; band];
    for rows in raw.chunks_mut(band) {
        let dst = &mut out[..rows.len()];
        if t.transform(rows, dst).is_err() {
            return;
        }
        rows.copy_from_slice(dst);
    }
}

/// Every pixel composited over `bg` (alpha over an opaque colour), giving an opaque image.
pub(super) fn flatten(rgba: &RgbaImage, bg: Rgb) -> RgbImage {
    let mut out = RgbImage::new(rgba.width(), rgba.height());
    for (dst, src) in out.pixels_mut().zip(rgba.pixels()) {
        let a = u32::from(src[3]);
        for c in 0..3 {
            // c·a + bg·(1 − a), rounded.
            dst[c] = ((u32::from(src[c]) * a + u32::from(bg.0[c]) * (255 - a) + 127) / 255) as u8;
        }
    }
    out
}

/// Whether scaling `from` to `to` halves (or more) both sides.
fn halves(from: (u32, u32), to: (u32, u32)) -> bool {
    from.0 >= to.0.saturating_mul(2) && from.1 >= to.1.saturating_mul(2)
}

/// The scaled size [`fit`] gives a `w`×`h` image (before padding or cropping).
fn fit_size(w: u32, h: u32, spec: &Render) -> (u32, u32) {
    let (wf, hf) = (f64::from(w.max(1)), f64::from(h.max(1)));
    let (tw, th) = (spec.width, spec.height);
    let scale = match spec.fit {
        Fit::Pad => (f64::from(tw) / wf).min(f64::from(th) / hf),
        Fit::Crop => (f64::from(tw) / wf).max(f64::from(th) / hf),
    };
    let size = |v: f64, bound: u32| -> u32 {
        let n = (v * scale).round().max(1.0) as u32;
        if spec.fit == Fit::Pad { n.min(bound) } else { n.max(bound) }
    };
    (size(wf, tw), size(hf, th))
}

/// The most [`fit`] and [`encode`] hold at once for a `w`×`h` RGB image, besides the image:
/// the scaler's intermediate (its vertical pass first: 8-bit RGB, at most the source's width
/// × the new height), the scaled image (crop only; pad scales straight into the canvas, but
/// it is counted either way), the canvas and the encoder's output (at most the raw size
/// again; its own buffers are a few rows).
fn fit_peak(w: u32, h: u32, spec: &Render) -> u64 {
    let (nw, nh) = fit_size(w, h, spec);
    let scaled = 3 * u64::from(nw) * u64::from(nh);
    let canvas = 3 * u64::from(spec.width) * u64::from(spec.height);
    let intermediate = 3 * u64::from(w.max(nw)) * u64::from(nh.max(h));
    intermediate + scaled + 2 * canvas
}

/// Bring `img` to exactly `spec.width`×`spec.height` with `spec.fit`.
fn fit(img: RgbImage, spec: &Render) -> Result<RgbImage, RenderError> {
    let (tw, th) = (spec.width, spec.height);
    let (w, h) = img.dimensions();
    let (nw, nh) = fit_size(w, h, spec);
    if (nw, nh) == (w, h) && (nw, nh) == (tw, th) {
        return Ok(img);
    }
    match spec.fit {
        Fit::Pad => {
            let mut canvas = RgbImage::from_pixel(tw, th, image::Rgb(spec.background.0));
            let (x, y) = ((tw - nw) / 2, (th - nh) / 2);
            if (nw, nh) == (w, h) {
                image::imageops::replace(&mut canvas, &img, i64::from(x), i64::from(y));
            } else {
                scale_into(&img, &mut canvas, (x, y, nw, nh))?;
            }
            Ok(canvas)
        }
        Fit::Crop => {
            let scaled = if (nw, nh) == (w, h) {
                img
            } else {
                let mut scaled = RgbImage::new(nw, nh);
                scale_into(&img, &mut scaled, (0, 0, nw, nh))?;
                drop(img);
                scaled
            };
            if (nw, nh) == (tw, th) {
                return Ok(scaled);
            }
            let (x, y) = ((nw - tw) / 2, (nh - th) / 2);
            Ok(image::imageops::crop_imm(&scaled, x, y, tw, th).to_image())
        }
    }
}

/// Scale all of `src` into the `(x, y, width, height)` part of `dst` with `fast_image_resize`:
/// an area average (box filter) when both sides shrink to half or less, Catmull-Rom
/// otherwise, as `image`'s `thumbnail` and `CatmullRom` did before.
pub(super) fn scale_into(
    src: &RgbImage,
    dst: &mut RgbImage,
    (x, y, w, h): (u32, u32, u32, u32),
) -> Result<(), RenderError> {
    let fail = |e: &dyn std::fmt::Display| RenderError::Encode(format!("scaling failed: {e}"));
    let filter = if halves(src.dimensions(), (w, h)) { fir::FilterType::Box } else { fir::FilterType::CatmullRom };
    let from = fir::images::ImageRef::new(src.width(), src.height(), src.as_raw(), fir::PixelType::U8x3)
        .map_err(|e| fail(&e))?;
    let (dw, dh) = dst.dimensions();
    let mut to = fir::images::Image::from_slice_u8(dw, dh, dst, fir::PixelType::U8x3).map_err(|e| fail(&e))?;
    let mut part = fir::images::CroppedImageMut::new(&mut to, x, y, w, h).map_err(|e| fail(&e))?;
    let options = fir::ResizeOptions::new().resize_alg(fir::ResizeAlg::Convolution(filter));
    fir::Resizer::new().resize(&from, &mut part, &options).map_err(|e| fail(&e))
}

/// Encode with the profile's format, meeting `max_bytes` where a quality can.
fn encode(profile: &Profile, spec: &Render, img: RgbImage) -> Result<Rendered, RenderError> {
    let (width, height) = img.dimensions();
    let fits = |n: usize| profile.max_bytes.is_none_or(|max| n as u64 <= max);
    let mut smallest = u64::MAX;
    let attempts: Vec<Option<u8>> = match spec.format {
        Format::Jpeg => {
            let start = spec.quality.max(MIN_QUALITY);
            let mut qs: Vec<Option<u8>> = (MIN_QUALITY..=start).rev().step_by(5).map(Some).collect();
            if qs.last() != Some(&Some(MIN_QUALITY)) {
                qs.push(Some(MIN_QUALITY));
            }
            if spec.quality < MIN_QUALITY {
                qs = vec![Some(spec.quality)];
            }
            qs
        }
        // PNG: the default compression, then the strongest. WebP: lossless, one try.
        Format::Png => vec![None, Some(0)],
        Format::Webp => vec![None],
    };
    for attempt in attempts {
        let bytes = encode_once(spec.format, &img, attempt)?;
        if fits(bytes.len()) {
            return Ok(Rendered {
                sha256: sha256_hex(&bytes),
                bytes,
                width,
                height,
                media_type: spec.format.media_type(),
                ext: spec.format.ext(),
                quality: if spec.format == Format::Jpeg { attempt } else { None },
            });
        }
        smallest = smallest.min(bytes.len() as u64);
    }
    Err(RenderError::TooManyBytes {
        profile: profile.name.clone(),
        max_bytes: profile.max_bytes.unwrap_or(0),
        smallest,
    })
}

/// One encoding. `attempt`: the JPEG quality; for PNG `Some(_)` asks for the strongest
/// compression.
fn encode_once(format: Format, img: &RgbImage, attempt: Option<u8>) -> Result<Vec<u8>, RenderError> {
    use image::codecs::{png, webp::WebPEncoder};
    let mut out = Vec::new();
    let result = match format {
        Format::Jpeg => {
            let quality = attempt.unwrap_or(super::profile::DEFAULT_QUALITY);
            return encode_jpeg(img, quality, out);
        }
        Format::Png => {
            let level = if attempt.is_some() { png::CompressionType::Best } else { png::CompressionType::Default };
            img.write_with_encoder(png::PngEncoder::new_with_quality(&mut out, level, png::FilterType::Adaptive))
        }
        Format::Webp => img.write_with_encoder(WebPEncoder::new_lossless(&mut out)),
    };
    result.map_err(|e| RenderError::Encode(e.to_string()))?;
    Ok(out)
}

/// A baseline JPEG of `img` at `quality` with `jpeg-encoder`: 4:4:4 (no chroma subsampling,
/// as the `image` crate's encoder wrote), the standard tables scaled by quality, a JFIF header
/// and no other metadata.
fn encode_jpeg(img: &RgbImage, quality: u8, mut out: Vec<u8>) -> Result<Vec<u8>, RenderError> {
    let side = |n: u32| u16::try_from(n).map_err(|_| RenderError::Encode(format!("{n} px is too wide for a JPEG")));
    let (w, h) = (side(img.width())?, side(img.height())?);
    let mut encoder = jpeg_encoder::Encoder::new(&mut out, quality.clamp(1, 100));
    encoder.set_sampling_factor(jpeg_encoder::SamplingFactor::F_1_1);
    encoder.encode(img.as_raw(), w, h, jpeg_encoder::ColorType::Rgb).map_err(|e| RenderError::Encode(e.to_string()))?;
    Ok(out)
}

#[cfg(test)]
#[path = "render_tests.rs"]
mod tests;
