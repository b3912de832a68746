//! The delivery renderer checked against Pillow (issue #41): one fixed photo-like source
//! rendered with tally's `amazon` (2000×2000, an upscale) and `taobao` (800×800, a shrink)
//! profiles and by Pillow doing the same by hand (`tests/pillow/reference.py`: resize with
//! BICUBIC to the fitted size, pad on white, JPEG at the profile's quality, 4:4:4) must give
//! files of the same size whose pixels differ by less than [`TOLERANCE`] on average. This is
//! what makes the crate-level reference of `tally bench` (fast_image_resize + jpeg-encoder,
//! `src/bench/rendering.rs`) a fair stand-in for Pillow.
//!
//! Pillow is pinned in `tests/pillow/requirements.txt` and installed into `target/pillow-venv`
//! by `scripts/install-pillow.sh` (scripts/test.sh runs it). Missing, the test fails under
//! CI=true, and outside CI says how to install it and passes without checking.

use std::path::PathBuf;
use std::process::Command;

use crate::common::TempDir;

/// The most the mean absolute difference per channel (0–255) may be: two Catmull-Rom
/// implementations (Pillow's fixed-point, fast_image_resize's) and two JPEG encoders at the
/// same quality differ by rounding only; a wrong filter, offset, colour or quality costs more.
const TOLERANCE: f64 = 1.0;

fn python() -> PathBuf {
    match std::env::var_os("TALLY_PILLOW_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target/pillow-venv/bin/python")),
    }
}

/// A fixed 1500×1125 photo-like PNG: gradients, a woven texture and a little grain.
fn source() -> Vec<u8> {
    let (w, h) = (1500u32, 1125u32);
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        let (fx, fy) = (x as f32 / w as f32, y as f32 / h as f32);
        let grain = ((x.wrapping_mul(2_654_435_761) ^ y.wrapping_mul(40_503)) % 7) as f32 - 3.0;
        let weave = (fx * 37.0).sin() * (fy * 29.0).cos();
        let r = 40.0 + 150.0 * fx + 25.0 * weave + grain;
        let g = 60.0 + 120.0 * fy + 20.0 * ((fx + fy) * 23.0).sin() + grain;
        let b = 110.0 + 60.0 * (1.0 - fx) * fy + 30.0 * (fx * 9.0 - fy * 11.0).cos() - grain;
        image::Rgb([r, g, b].map(|v| v.clamp(0.0, 255.0) as u8))
    });
    let mut out = Vec::new();
    img.write_to(&mut std::io::Cursor::new(&mut out), image::ImageFormat::Png).expect("encode the source");
    out
}

#[test]
fn amazon_and_taobao_match_pillow_within_the_tolerance() {
    let python = python();
    if !python.exists() {
        let msg = format!(
            "the Pillow venv is missing ({}): run `bash scripts/install-pillow.sh` (scripts/test.sh does)",
            python.display()
        );
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{msg}");
        eprintln!("not checked against Pillow: {msg}");
        return;
    }
    let dir = TempDir::new();
    let src = source();
    let src_path = dir.0.join("source.png");
    std::fs::write(&src_path, &src).expect("write the source");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/pillow/reference.py");
    for name in ["amazon", "taobao"] {
        let profile = tally::delivery::profile::builtin(name).expect("a built-in profile");
        let spec = profile.render.expect("a rendered profile");
        let ours = tally::delivery::render::render(&profile, &src).expect("tally renders");
        let out = dir.0.join(format!("{name}-pillow.jpg"));
        let run = Command::new(&python)
            .arg(script)
            .arg(&src_path)
            .args([spec.width.to_string(), spec.height.to_string(), spec.quality.to_string()])
            .arg(&out)
            .output()
            .expect("run Pillow");
        let said = format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
        assert!(run.status.success(), "Pillow failed for {name}:\n{said}");
        let a = image::load_from_memory(&ours.bytes).expect("tally's file decodes").into_rgb8();
        let b = image::open(&out).expect("Pillow's file decodes").into_rgb8();
        assert_eq!(a.dimensions(), (spec.width, spec.height), "{name}: tally's size");
        assert_eq!(b.dimensions(), a.dimensions(), "{name}: Pillow's size ({said})");
        let sum: u64 = a.as_raw().iter().zip(b.as_raw()).map(|(x, y)| u64::from(x.abs_diff(*y))).sum();
        let mad = sum as f64 / a.as_raw().len() as f64;
        eprintln!("{name}: mean absolute difference from Pillow {mad:.3} (tolerance {TOLERANCE})");
        assert!(mad < TOLERANCE, "{name}: tally's file differs from Pillow's by {mad:.3} on average (> {TOLERANCE})");
        // The padding is the profile's white on both.
        assert_eq!(a.get_pixel(0, 0), &image::Rgb([255, 255, 255]), "{name}: tally's padding");
    }
}
