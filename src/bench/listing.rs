//! Listing images against a plain resize, for `tally bench --only listing` (issue #37): a
//! 4096×4096 source made into a marketplace file the way a delivery makes it — a `main_white`
//! shot's cutout composed on pure white for `amazon_main`, and a photo with the owner's words
//! drawn for `taobao_main`, each with the check that measures the profile's rules on the file —
//! against the plain pipeline of [`super::rendering`] (decode with `image`, resize with
//! `fast_image_resize`, pad, encode with `jpeg-encoder`, write) on the same source. Both run in
//! one thread, alternating which goes first each round; a case's ratio is the median of its
//! per-round ratios. The bar: at most 2×.

use std::path::Path;
use std::time::Instant;

use image::{Rgba, RgbaImage};

use super::rendering::{ProfileRender, RenderBench, median, reference_file, sample_images, scratch_dir};
use crate::delivery::folder::FolderTarget;
use crate::delivery::profile::{Fit, Format, builtin};
use crate::delivery::render::{self, Listing};
use crate::domain::overlay::Overlay;

/// The side of the sources.
pub const SIDE: u32 = 4096;

/// Measure both cases `rounds` times (at least 1).
pub(super) fn listing_ratio(rounds: usize) -> Result<RenderBench, String> {
    let dir = scratch_dir()?;
    let result = measure(&dir, rounds.max(1));
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn measure(dir: &Path, rounds: usize) -> Result<RenderBench, String> {
    let photo = sample_images(1, SIDE).pop().ok_or("listing: no sample image")?;
    let cutout = cutout_of(&photo)?;
    let words = Overlay { template: "headline_band".into(), lines: vec!["手工青花 Hand painted".into()] };
    let target =
        FolderTarget { name: "bench".into(), path: dir.join("tally"), timeout: std::time::Duration::from_secs(60) };
    let reference_dir = dir.join("reference");
    std::fs::create_dir_all(&reference_dir).map_err(|e| format!("listing: {e}"))?;
    let cases: [(&str, &str, &[u8], Listing<'_>); 2] = [
        ("amazon_main (white main image)", "amazon_main", &cutout, Listing { white: true, overlay: None }),
        ("taobao_main (words drawn)", "taobao_main", &photo, Listing { white: false, overlay: Some(&words) }),
    ];
    let mut per_profile = Vec::new();
    for (case, name, source, listing) in cases {
        let profile = builtin(name).ok_or_else(|| format!("listing: no built-in profile `{name}`"))?;
        let spec = match profile.render {
            Some(s) if s.fit == Fit::Pad && s.format == Format::Jpeg => s,
            _ => return Err(format!("listing: `{name}` is not a padded JPEG")),
        };
        let (mut tally_t, mut ref_t, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let tally_round = || -> Result<f64, String> {
                let start = Instant::now();
                let (problems, file) = render::check_listing(&profile, source, &listing, "the image");
                if let Some(p) = problems.first() {
                    return Err(format!("listing: {}", p.message));
                }
                let file = file.ok_or("listing: no file made")?;
                target.put(&format!("{name}-{round}.jpg"), &file.bytes, &file.sha256).map_err(|e| e.to_string())?;
                Ok(start.elapsed().as_secs_f64())
            };
            let ref_round = || -> Result<f64, String> {
                let start = Instant::now();
                reference_file(&spec, source, &reference_dir.join(format!("{name}-{round}.jpg")))?;
                Ok(start.elapsed().as_secs_f64())
            };
            let (t, r) = if round % 2 == 0 {
                let t = tally_round()?;
                (t, ref_round()?)
            } else {
                let r = ref_round()?;
                (tally_round()?, r)
            };
            tally_t.push(t);
            ref_t.push(r);
            ratios.push(t / r.max(1e-9));
        }
        per_profile.push(ProfileRender {
            profile: case.to_string(),
            images: 1,
            tally_s: median(&mut tally_t),
            reference_s: median(&mut ref_t),
            ratio: median(&mut ratios),
        });
    }
    let ratio = per_profile.iter().map(|p| p.ratio).fold(0.0, f64::max);
    Ok(RenderBench { per_profile, ratio })
}

/// `photo` as a cutout would answer it: the middle 60 % kept, the rest transparent (an RGBA
/// PNG of the same size).
fn cutout_of(photo: &[u8]) -> Result<Vec<u8>, String> {
    let img = image::load_from_memory(photo).map_err(|e| format!("listing: {e}"))?.into_rgba8();
    let (w, h) = img.dimensions();
    let keep = |v: u32, n: u32| v >= n / 5 && v < n - n / 5;
    let out = RgbaImage::from_fn(w, h, |x, y| {
        let p = img.get_pixel(x, y).0;
        Rgba([p[0], p[1], p[2], if keep(x, w) && keep(y, h) { 255 } else { 0 }])
    });
    let mut bytes = std::io::Cursor::new(Vec::new());
    out.write_to(&mut bytes, image::ImageFormat::Png).map_err(|e| format!("listing: {e}"))?;
    Ok(bytes.into_inner())
}
