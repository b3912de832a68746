//! Rendering a delivery profile against a plain reference pipeline, for `tally bench --only
//! scale` (issue #41). Tally's side is what a delivery does per image: the check the
//! delivery runs before it starts, the render ([`crate::delivery::render`]), and the write
//! into a folder target (temporary name, fsync, move, fsync of the folder). The reference uses
//! no tally code: decode with `image`, scale with `fast_image_resize` (Catmull-Rom, as tally),
//! pad onto the profile's background, encode with `jpeg-encoder` at the profile's quality,
//! write and fsync. Both run on the same images, in the same thread, alternating which goes
//! first each round; a profile's ratio is the median of its per-round ratios.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use fast_image_resize::images::{CroppedImageMut, Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

use crate::delivery::folder::FolderTarget;
use crate::delivery::profile::{Fit, Format, Profile, Render, builtin};
use crate::delivery::render;

/// One profile's measurement.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProfileRender {
    /// The profile's name (`amazon`).
    pub profile: String,
    /// How many images each round rendered.
    pub images: usize,
    /// Tally's time for all the images in one round, seconds (median over the rounds).
    pub tally_s: f64,
    /// The reference pipeline's time for the same images, seconds (median over the rounds).
    pub reference_s: f64,
    /// The median of the per-round ratios tally ÷ reference.
    pub ratio: f64,
}

/// Every profile's measurement and the worst ratio among them.
#[derive(Debug, Clone, serde::Serialize)]
#[allow(missing_docs)]
pub struct RenderBench {
    pub per_profile: Vec<ProfileRender>,
    /// The largest of the profiles' ratios.
    pub ratio: f64,
}

/// Render `images` with each of `profile_names` (built-in profiles that pad into a JPEG)
/// `rounds` times, by tally and by the reference pipeline, and compare their times. An image
/// the delivery's check refuses (e.g. smaller than the profile's `min_source`: 1000 px for
/// `amazon`) is an error, as it would block a delivery.
pub(super) fn render_ratio(images: &[Vec<u8>], profile_names: &[&str], rounds: usize) -> Result<RenderBench, String> {
    if images.is_empty() || rounds == 0 {
        return Err("rendering: no images or no rounds to measure".into());
    }
    let dir = scratch_dir()?;
    let result = measure(&dir, images, profile_names, rounds);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn measure(dir: &Path, images: &[Vec<u8>], profile_names: &[&str], rounds: usize) -> Result<RenderBench, String> {
    let target =
        FolderTarget { name: "bench".into(), path: dir.join("tally"), timeout: std::time::Duration::from_secs(60) };
    let reference_dir = dir.join("reference");
    std::fs::create_dir_all(&reference_dir).map_err(|e| format!("rendering: {e}"))?;
    let mut per_profile = Vec::new();
    for name in profile_names {
        let profile = builtin(name).ok_or_else(|| format!("rendering: no built-in profile `{name}`"))?;
        let spec = reference_spec(&profile)?;
        let (mut tally_t, mut ref_t, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let tally_round = |_: ()| -> Result<f64, String> {
                let start = Instant::now();
                for (i, source) in images.iter().enumerate() {
                    tally_file(&profile, source, &target, &format!("{name}-{round}-{i}.jpg"))?;
                }
                Ok(start.elapsed().as_secs_f64())
            };
            let ref_round = |_: ()| -> Result<f64, String> {
                let start = Instant::now();
                for (i, source) in images.iter().enumerate() {
                    reference_file(&spec, source, &reference_dir.join(format!("{name}-{round}-{i}.jpg")))?;
                }
                Ok(start.elapsed().as_secs_f64())
            };
            let (t, r) = if round % 2 == 0 {
                let t = tally_round(())?;
                (t, ref_round(())?)
            } else {
                let r = ref_round(())?;
                (tally_round(())?, r)
            };
            tally_t.push(t);
            ref_t.push(r);
            ratios.push(t / r.max(1e-9));
        }
        per_profile.push(ProfileRender {
            profile: (*name).to_string(),
            images: images.len(),
            tally_s: median(&mut tally_t),
            reference_s: median(&mut ref_t),
            ratio: median(&mut ratios),
        });
    }
    let ratio = per_profile.iter().map(|p| p.ratio).fold(0.0, f64::max);
    Ok(RenderBench { per_profile, ratio })
}

pub(super) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// A fresh directory under the system's temporary directory.
pub(super) fn scratch_dir() -> Result<PathBuf, String> {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("tally-bench-render-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("rendering: cannot create {}: {e}", dir.display()))?;
    Ok(dir)
}

/// The profile's render spec, when the reference pipeline can make it (pad into a JPEG).
fn reference_spec(profile: &Profile) -> Result<Render, String> {
    match profile.render {
        Some(spec) if spec.fit == Fit::Pad && spec.format == Format::Jpeg => Ok(spec),
        _ => Err(format!("rendering: the reference pipeline makes only padded JPEGs; `{}` is not one", profile.name)),
    }
}

/// What a delivery does with one image: the check (which renders, and keeps the file for the
/// render: `delivery::kept`), the render (the kept file, else a render), the write. Returns
/// the file.
fn tally_file(profile: &Profile, source: &[u8], target: &FolderTarget, name: &str) -> Result<Vec<u8>, String> {
    let (problems, file) = render::check_and_render(profile, source, "the image");
    if let Some(p) = problems.first() {
        return Err(format!("rendering: {}", p.message));
    }
    let kept = crate::delivery::kept::kept();
    if let Some(file) = file {
        kept.keep(name, profile, file);
    }
    let file = match kept.take(name, profile) {
        Some(file) => file,
        None => render::render(profile, source).map_err(|e| format!("rendering: {e}"))?,
    };
    target.put(name, &file.bytes, &file.sha256).map_err(|e| format!("rendering: {e}"))?;
    Ok(file.bytes)
}

/// The reference pipeline for one image (no tally code). Returns the file.
pub(super) fn reference_file(spec: &Render, source: &[u8], path: &Path) -> Result<Vec<u8>, String> {
    let err = |e: &dyn std::fmt::Display| format!("reference: {e}");
    let img = image::load_from_memory(source).map_err(|e| err(&e))?.into_rgb8();
    let (w, h) = img.dimensions();
    let (tw, th) = (spec.width, spec.height);
    let scale = (f64::from(tw) / f64::from(w.max(1))).min(f64::from(th) / f64::from(h.max(1)));
    let nw = ((f64::from(w) * scale).round() as u32).clamp(1, tw);
    let nh = ((f64::from(h) * scale).round() as u32).clamp(1, th);
    let mut canvas: Vec<u8> = spec.background.0.iter().copied().cycle().take(3 * tw as usize * th as usize).collect();
    {
        let src = ImageRef::new(w, h, img.as_raw(), PixelType::U8x3).map_err(|e| err(&e))?;
        let mut dst = Image::from_slice_u8(tw, th, &mut canvas, PixelType::U8x3).map_err(|e| err(&e))?;
        let mut part = CroppedImageMut::new(&mut dst, (tw - nw) / 2, (th - nh) / 2, nw, nh).map_err(|e| err(&e))?;
        let options = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::CatmullRom));
        Resizer::new().resize(&src, &mut part, &options).map_err(|e| err(&e))?;
    }
    drop(img);
    let (ew, eh) = (u16::try_from(tw).map_err(|e| err(&e))?, u16::try_from(th).map_err(|e| err(&e))?);
    let mut out = Vec::new();
    jpeg_encoder::Encoder::new(&mut out, spec.quality)
        .encode(&canvas, ew, eh, jpeg_encoder::ColorType::Rgb)
        .map_err(|e| err(&e))?;
    let mut f = std::fs::File::create(path).map_err(|e| err(&e))?;
    f.write_all(&out).map_err(|e| err(&e))?;
    f.sync_all().map_err(|e| err(&e))?;
    Ok(out)
}

/// `n` photo-like opaque PNGs of `side`×`side` (smooth gradients, a woven texture and fine
/// noise, so neither PNG nor JPEG finds them trivially small: about 1.7 MB each at 1024 px,
/// 2.3 MB at 1536 px), the same every time.
pub(super) fn sample_images(n: usize, side: u32) -> Vec<Vec<u8>> {
    (0..n).map(|i| sample_image(i as u32, side.max(1))).collect()
}

fn sample_image(i: u32, side: u32) -> Vec<u8> {
    // xorshift32, seeded per image: deterministic fine grain.
    let mut state = 0x9E37_79B9u32 ^ i.wrapping_mul(0x85EB_CA6B) | 1;
    // Finer grain for larger images, so a sample stays about 1–2 MB as a PNG.
    let levels = match side {
        0..=1100 => 9,
        1101..=1400 => 5,
        _ => 2,
    };
    let mut noise = move || {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        (state % levels) as f32 - (levels / 2) as f32
    };
    let s = side as f32;
    let phase = i as f32 * 0.7;
    let mut raw = Vec::with_capacity(3 * side as usize * side as usize);
    for y in 0..side {
        for x in 0..side {
            let (fx, fy) = (x as f32 / s, y as f32 / s);
            let weave = (fx * 37.0 + phase).sin() * (fy * 29.0).cos();
            let r = 40.0 + 150.0 * fx + 25.0 * weave + noise();
            let g = 60.0 + 120.0 * fy + 20.0 * ((fx + fy) * 23.0 + phase).sin() + noise();
            let b = 110.0 + 60.0 * (1.0 - fx) * fy + 30.0 * (fx * 9.0 - fy * 11.0 + phase).cos() + noise();
            raw.extend([r, g, b].map(|v| v.clamp(0.0, 255.0) as u8));
        }
    }
    let mut out = Vec::new();
    let img = image::RgbImage::from_raw(side, side, raw);
    if let Some(img) = img {
        let _ = img.write_to(&mut std::io::Cursor::new(&mut out), image::ImageFormat::Png);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mean_abs_diff(a: &[u8], b: &[u8]) -> (u32, u32, u32, u32, f64) {
        let a = image::load_from_memory(a).expect("tally's file decodes").into_rgb8();
        let b = image::load_from_memory(b).expect("the reference's file decodes").into_rgb8();
        let sum: u64 = a.as_raw().iter().zip(b.as_raw()).map(|(x, y)| u64::from(x.abs_diff(*y))).sum();
        (a.width(), a.height(), b.width(), b.height(), sum as f64 / a.as_raw().len().max(1) as f64)
    }

    #[test]
    fn tally_and_the_reference_make_the_same_picture_and_the_ratio_is_measured() {
        let images = sample_images(2, 1024);
        for img in &images {
            assert!(img.len() > 1_000_000 && img.len() < 2_500_000, "a sample is {} bytes", img.len());
        }
        let dir = scratch_dir().expect("scratch");
        let target =
            FolderTarget { name: "t".into(), path: dir.join("tally"), timeout: std::time::Duration::from_secs(60) };
        for name in ["amazon", "taobao"] {
            let profile = builtin(name).expect("built-in");
            let spec = reference_spec(&profile).expect("padded jpeg");
            for (i, source) in images.iter().enumerate() {
                let ours = tally_file(&profile, source, &target, &format!("{name}-{i}.jpg")).expect("tally renders");
                let theirs =
                    reference_file(&spec, source, &dir.join(format!("{name}-{i}-ref.jpg"))).expect("reference");
                let (w, h, rw, rh, mad) = mean_abs_diff(&ours, &theirs);
                assert_eq!((w, h), (spec.width, spec.height), "{name}");
                assert_eq!((rw, rh), (w, h), "{name}");
                // Same filter, same quality: the two JPEGs differ by encoder rounding only.
                assert!(mad < 1.5, "{name} image {i}: mean absolute difference {mad:.3}");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        let bench = render_ratio(&images, &["amazon", "taobao"], 1).expect("measured");
        assert_eq!(bench.per_profile.len(), 2);
        for p in &bench.per_profile {
            assert_eq!(p.images, 2);
            assert!(p.tally_s > 0.0 && p.reference_s > 0.0 && p.ratio > 0.0, "{p:?}");
        }
        assert!(bench.per_profile.iter().any(|p| p.ratio == bench.ratio));
    }

    /// Where the time goes, stage by stage, for one source into `amazon` and `taobao`, with the
    /// `image` crate's scaler and JPEG encoder (what tally used before issue #41) beside
    /// `fast_image_resize` and `jpeg-encoder`: `cargo test --release --lib bench::rendering --
    /// --ignored --nocapture`.
    #[test]
    #[ignore]
    fn print_the_stages() {
        use sha2::Digest as _;
        let time = |f: &mut dyn FnMut()| {
            let mut best = f64::MAX;
            for _ in 0..3 {
                let t = Instant::now();
                f();
                best = best.min(t.elapsed().as_secs_f64() * 1000.0);
            }
            best
        };
        let dir = scratch_dir().expect("scratch");
        for side in [1024, 1536] {
            let source = sample_images(1, side).remove(0);
            let mut img = image::RgbImage::new(1, 1);
            let decode = time(&mut || img = image::load_from_memory(&source).expect("decodes").into_rgb8());
            for (tw, q) in [(2000u32, 90u8), (800, 90)] {
                let mut scaled = image::RgbImage::new(1, 1);
                let old_resize = time(&mut || {
                    scaled = image::DynamicImage::ImageRgb8(img.clone())
                        .resize_exact(tw, tw, image::imageops::FilterType::CatmullRom)
                        .into_rgb8()
                });
                let mut canvas = image::RgbImage::new(tw, tw);
                let new_resize = time(&mut || {
                    let src = ImageRef::new(side, side, img.as_raw(), PixelType::U8x3).expect("view");
                    let mut dst = Image::from_slice_u8(tw, tw, &mut canvas, PixelType::U8x3).expect("view");
                    let opts = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::CatmullRom));
                    Resizer::new().resize(&src, &mut dst, &opts).expect("resize");
                });
                let pad = time(&mut || {
                    let mut c = image::RgbImage::from_pixel(tw, tw, image::Rgb([255, 255, 255]));
                    image::imageops::replace(&mut c, &scaled, 0, 0);
                });
                let mut jpeg = Vec::new();
                let old_encode = time(&mut || {
                    jpeg.clear();
                    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, q)
                        .encode(canvas.as_raw(), tw, tw, image::ExtendedColorType::Rgb8)
                        .expect("encode")
                });
                let old_len = jpeg.len();
                let new_encode = time(&mut || {
                    jpeg.clear();
                    let mut e = jpeg_encoder::Encoder::new(&mut jpeg, q);
                    e.set_sampling_factor(jpeg_encoder::SamplingFactor::F_1_1);
                    e.encode(canvas.as_raw(), tw as u16, tw as u16, jpeg_encoder::ColorType::Rgb).expect("encode")
                });
                let hash = time(&mut || {
                    std::hint::black_box(sha2::Sha256::digest(&jpeg));
                });
                let write = time(&mut || {
                    let mut f = std::fs::File::create(dir.join("w.jpg")).expect("create");
                    f.write_all(&jpeg).expect("write");
                    f.sync_all().expect("fsync");
                });
                println!(
                    "{side}px -> {tw}px q{q}: decode {decode:.1} ms, resize image {old_resize:.1} / fir {new_resize:.1} ms, \
                     pad {pad:.1} ms, encode image {old_encode:.1} ms ({old_len} B) / jpeg-encoder {new_encode:.1} ms \
                     ({} B), sha256 {hash:.1} ms, write+fsync {write:.1} ms",
                    jpeg.len()
                );
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The numbers for issue #41, in a release build: `cargo test --release --lib
    /// bench::rendering -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn print_the_ratio_for_1024_and_1536_sources() {
        for side in [1024, 1536] {
            let images = sample_images(4, side);
            let sizes: Vec<usize> = images.iter().map(Vec::len).collect();
            let bench = render_ratio(&images, &["amazon", "taobao"], 5).expect("measured");
            println!("{side}px sources {sizes:?}: {}", serde_json::to_string(&bench).unwrap_or_default());
        }
    }
}
