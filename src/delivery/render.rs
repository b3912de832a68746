//! Making a profile's file from a chosen image ([`render`]) and saying in plain words why an
//! image will not meet a profile ([`check`]). Local work at no cost, CPU-bound and blocking:
//! an async caller runs it on a blocking thread (`tokio::task::spawn_blocking`).
//!
//! The steps of a render, in order: decode (PNG, JPEG or WebP, within [`MAX_SOURCE_SIDE`]),
//! apply the EXIF orientation, convert to 8-bit sRGB (an embedded ICC profile is converted
//! with `moxcms`, the colour engine the `image` crate itself uses; an image without one is
//! taken as sRGB), flatten any transparency onto the profile's `background`, scale with
//! `fit` (pad: fit inside and fill the rest with `background`, never cropping; crop: cover
//! and cut the overflow equally from both sides), and encode without metadata (no EXIF, no
//! ICC, no text chunks). A JPEG that is over `max_bytes` is encoded again at a quality 5
//! lower, down to [`MIN_QUALITY`]; PNG tries the strongest compression; WebP is lossless
//! (see [`super::profile::Render::quality`]). Deterministic: the same source and profile give
//! the same bytes, so a resumed delivery can compare sha256s.

use std::io::Cursor;

use image::imageops::FilterType;
use image::{DynamicImage, ImageDecoder, ImageFormat, RgbImage, RgbaImage};
use sha2::{Digest, Sha256};

use super::profile::{Fit, Format, MIN_QUALITY, Profile, Render, Rgb};

/// The largest source side decoded (a larger image is refused as unreadable).
pub const MAX_SOURCE_SIDE: u32 = 12_000;
/// The most memory one decode may take.
const MAX_ALLOC: u64 = 1024 * 1024 * 1024;

/// A made file.
#[derive(Debug, Clone, PartialEq, Eq)]
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
pub enum RenderError {
    /// The source is not an image this can read (plain words why).
    #[error("{0}")]
    Unreadable(String),
    /// Even at the lowest quality (or strongest lossless compression) the file is over the
    /// profile's `max_bytes`.
    #[error("the file is {smallest} bytes at best; profile `{profile}` takes at most {max_bytes} bytes")]
    TooManyBytes { profile: String, max_bytes: u64, smallest: u64 },
    /// Encoding failed (not expected for valid pixels).
    #[error("cannot encode the file: {0}")]
    Encode(String),
}

/// What kind of problem [`check`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemKind {
    /// The source cannot be read as an image.
    Unreadable,
    /// A source side is below the profile's `min_source`.
    TooSmall,
    /// The source has transparent pixels and the profile keeps them (`original`); every
    /// rendered profile fills them with its `background` instead.
    Transparent,
    /// No quality meets the profile's `max_bytes`.
    TooManyBytes,
}

/// One reason an image will not meet a profile, in plain words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub kind: ProblemKind,
    /// A sentence for the owner: "the Main photo's chosen image is 800 px wide; amazon asks
    /// for at least 1000 px".
    pub message: String,
}

/// Make `profile`'s file from `source` (the chosen image's bytes). For `original` the bytes
/// are returned untouched (only their size and format are read).
pub fn render(profile: &Profile, source: &[u8]) -> Result<Rendered, RenderError> {
    let Some(spec) = profile.render else {
        return original(profile, source);
    };
    let pixels = decode(source)?;
    let flat = flatten(&pixels, spec.background);
    let fitted = fit(&flat, &spec);
    encode(profile, &spec, fitted)
}

/// Why `source` will not meet `profile`, in plain words about `subject` (e.g. "the Main
/// photo's chosen image"); empty when it will. Reports, in this order: an unreadable image, a
/// side below `min_source`, transparency `original` would keep, and a file over `max_bytes` at
/// any quality. Costs a full render when the profile has a `max_bytes` (that is the only way
/// to know).
pub fn check(profile: &Profile, source: &[u8], subject: &str) -> Vec<Problem> {
    let problem = |kind, message: String| Problem { kind, message };
    let pixels = match decode(source) {
        Ok(p) => p,
        Err(e) => return vec![problem(ProblemKind::Unreadable, format!("{subject} cannot be read as an image: {e}"))],
    };
    let mut out = Vec::new();
    let (w, h) = pixels.dimensions();
    out.extend(too_small(profile, w, h, subject));
    if profile.is_original() && pixels.pixels().any(|p| p[3] < 255) {
        out.push(problem(
            ProblemKind::Transparent,
            format!(
                "{subject} has transparent areas, and `{}` delivers the image as generated, so they stay transparent \
                 (a marketplace may show them grey or black); a profile with a background fills them",
                profile.name
            ),
        ));
    }
    if let Some(max) = profile.max_bytes {
        let too_big = match profile.render {
            None => (source.len() as u64 > max).then_some(source.len() as u64),
            Some(_) => match render(profile, source) {
                Err(RenderError::TooManyBytes { smallest, .. }) => Some(smallest),
                _ => None,
            },
        };
        if let Some(n) = too_big {
            out.push(too_many_bytes(profile, n, max, subject));
        }
    }
    out
}

/// A file of `n` bytes is over `profile`'s `max` bytes, in plain words about `subject`.
pub fn too_many_bytes(profile: &Profile, n: u64, max: u64, subject: &str) -> Problem {
    Problem {
        kind: ProblemKind::TooManyBytes,
        message: format!(
            "{subject} makes a {} file even at the lowest quality; {} takes at most {}",
            human_bytes(n),
            profile.name,
            human_bytes(max)
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
    let side = if w <= h { format!("is {w} px wide") } else { format!("is {h} px high") };
    Some(Problem {
        kind: ProblemKind::TooSmall,
        message: format!("{subject} {side}; {} asks for at least {min} px", profile.name),
    })
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

/// Decode to 8-bit sRGB RGBA, upright.
fn decode(source: &[u8]) -> Result<RgbaImage, RenderError> {
    let mut reader = image::ImageReader::new(Cursor::new(source))
        .with_guessed_format()
        .map_err(|e| RenderError::Unreadable(e.to_string()))?;
    if !matches!(reader.format(), Some(ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP)) {
        return Err(RenderError::Unreadable(not_an_image()));
    }
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_SOURCE_SIDE);
    limits.max_image_height = Some(MAX_SOURCE_SIDE);
    limits.max_alloc = Some(MAX_ALLOC);
    reader.limits(limits);
    let mut decoder = reader.into_decoder().map_err(|e| RenderError::Unreadable(e.to_string()))?;
    // A profile that cannot be read or an orientation that cannot be parsed is not worth
    // refusing the image for: the pixels are then taken as sRGB and upright.
    let icc = decoder.icc_profile().ok().flatten();
    let orientation = decoder.orientation().unwrap_or(image::metadata::Orientation::NoTransforms);
    let mut img = DynamicImage::from_decoder(decoder).map_err(|e| RenderError::Unreadable(e.to_string()))?;
    img.apply_orientation(orientation);
    let mut rgba = img.into_rgba8();
    if let Some(icc) = icc {
        to_srgb(&mut rgba, &icc);
    }
    Ok(rgba)
}

/// Convert pixels described by an embedded ICC profile to sRGB in place. A profile moxcms
/// cannot use (damaged, or not an RGB one) leaves the pixels as they are.
fn to_srgb(rgba: &mut RgbaImage, icc: &[u8]) {
    use moxcms::{ColorProfile, Layout, TransformOptions};
    let Ok(src) = ColorProfile::new_from_slice(icc) else { return };
    let Ok(t) =
        src.create_transform_8bit(Layout::Rgba, &ColorProfile::new_srgb(), Layout::Rgba, TransformOptions::default())
    else {
        return;
    };
    let mut out = vec![0u8; rgba.as_raw().len()];
    if t.transform(rgba.as_raw(), &mut out).is_ok()
        && let Some(img) = RgbaImage::from_raw(rgba.width(), rgba.height(), out)
    {
        *rgba = img;
    }
}

/// Every pixel composited over `bg` (alpha over an opaque colour), giving an opaque image.
fn flatten(rgba: &RgbaImage, bg: Rgb) -> RgbImage {
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

/// Bring `img` to exactly `spec.width`×`spec.height` with `spec.fit`.
fn fit(img: &RgbImage, spec: &Render) -> RgbImage {
    let (w, h) = (f64::from(img.width()), f64::from(img.height()));
    let (tw, th) = (spec.width, spec.height);
    let scale = match spec.fit {
        Fit::Pad => (f64::from(tw) / w).min(f64::from(th) / h),
        Fit::Crop => (f64::from(tw) / w).max(f64::from(th) / h),
    };
    let size = |v: f64, bound: u32| -> u32 {
        let n = (v * scale).round().max(1.0) as u32;
        if spec.fit == Fit::Pad { n.min(bound) } else { n.max(bound) }
    };
    let (nw, nh) = (size(w, tw), size(h, th));
    // Through `DynamicImage` (not the generic `imageops::resize`) so the resampling is
    // compiled in the `image` crate, which the dev profile optimises (Cargo.toml).
    let scaled = if (nw, nh) == img.dimensions() {
        img.clone()
    } else {
        DynamicImage::ImageRgb8(img.clone()).resize_exact(nw, nh, FilterType::CatmullRom).into_rgb8()
    };
    if (nw, nh) == (tw, th) {
        return scaled;
    }
    match spec.fit {
        Fit::Pad => {
            let mut canvas = RgbImage::from_pixel(tw, th, image::Rgb(spec.background.0));
            let (x, y) = ((tw - nw) / 2, (th - nh) / 2);
            image::imageops::replace(&mut canvas, &scaled, i64::from(x), i64::from(y));
            canvas
        }
        Fit::Crop => {
            let (x, y) = ((nw - tw) / 2, (nh - th) / 2);
            image::imageops::crop_imm(&scaled, x, y, tw, th).to_image()
        }
    }
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
    use image::codecs::{jpeg::JpegEncoder, png, webp::WebPEncoder};
    let mut out = Vec::new();
    let result = match format {
        Format::Jpeg => JpegEncoder::new_with_quality(&mut out, attempt.unwrap_or(super::profile::DEFAULT_QUALITY))
            .encode(img.as_raw(), img.width(), img.height(), image::ExtendedColorType::Rgb8),
        Format::Png => {
            let level = if attempt.is_some() { png::CompressionType::Best } else { png::CompressionType::Default };
            img.write_with_encoder(png::PngEncoder::new_with_quality(&mut out, level, png::FilterType::Adaptive))
        }
        Format::Webp => img.write_with_encoder(WebPEncoder::new_lossless(&mut out)),
    };
    result.map_err(|e| RenderError::Encode(e.to_string()))?;
    Ok(out)
}

#[cfg(test)]
#[path = "render_tests.rs"]
mod tests;
