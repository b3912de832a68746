//! Tests of rendering and checking: every built-in profile's output decoded and measured
//! (pixel size, padding colour, format, byte limit), fit, flattening, colour conversion,
//! metadata stripping, and the plain-words reasons of `check`.

use std::borrow::Cow;

use image::{GenericImageView, ImageFormat, Rgba};

use super::*;
use crate::delivery::profile::{ProfileSpec, builtin, builtins};

/// A PNG of `w`×`h` whose pixel at (x, y) is `f(x, y)`, with optional ICC profile and a text
/// chunk (metadata the renderer must drop).
fn png(w: u32, h: u32, icc: Option<Vec<u8>>, f: impl Fn(u32, u32) -> [u8; 4]) -> Vec<u8> {
    let mut data = Vec::with_capacity((w * h * 4) as usize);
    for y in 0..h {
        for x in 0..w {
            data.extend_from_slice(&f(x, y));
        }
    }
    let mut info = png::Info::with_size(w, h);
    info.color_type = png::ColorType::Rgba;
    info.bit_depth = png::BitDepth::Eight;
    info.icc_profile = icc.map(Cow::Owned);
    let mut out = Vec::new();
    let mut enc = png::Encoder::with_info(&mut out, info).expect("info");
    enc.add_text_chunk("Comment".into(), "secret-metadata-marker".into()).expect("text");
    let mut w = enc.write_header().expect("header");
    w.write_image_data(&data).expect("data");
    w.finish().expect("finish");
    out
}

/// A photo-like opaque image: a smooth gradient with some texture, so JPEG sizes are real.
fn photo(w: u32, h: u32) -> Vec<u8> {
    png(w, h, None, |x, y| {
        let n = (x.wrapping_mul(2654435761) ^ y.wrapping_mul(40503)) % 23;
        [(60 + x * 120 / w + n) as u8, (40 + y * 150 / h) as u8, (90 + n * 3) as u8, 255]
    })
}

fn near(a: [u8; 3], b: [u8; 3], tol: u8) -> bool {
    a.iter().zip(b).all(|(x, y)| x.abs_diff(y) <= tol)
}

fn rgb(img: &image::DynamicImage, x: u32, y: u32) -> [u8; 3] {
    let Rgba([r, g, b, _]) = img.get_pixel(x, y);
    [r, g, b]
}

fn custom(name: &str, w: i64, h: i64, extra: impl FnOnce(&mut ProfileSpec)) -> Profile {
    let mut s = ProfileSpec { name: Some(name.into()), width: Some(w), height: Some(h), ..ProfileSpec::default() };
    extra(&mut s);
    Profile::custom(s).expect("valid profile")
}

#[test]
fn every_builtin_marketplace_profile_makes_the_file_it_promises() {
    // A wide source (2:1): padded above and below on the square profiles, left and right
    // nowhere (etsy is 4:3, so above and below too).
    let source = photo(1200, 600);
    for p in builtins().into_iter().filter(|p| !p.is_original()) {
        let spec = p.render.expect("rendered");
        let started = std::time::Instant::now();
        let out = render(&p, &source).unwrap_or_else(|e| panic!("{}: {e}", p.name));
        // Seen with --nocapture: what one render costs in this build.
        eprintln!("{}: {} bytes at quality {:?} in {:?}", p.name, out.bytes.len(), out.quality, started.elapsed());
        assert_eq!(image::guess_format(&out.bytes).expect("format"), ImageFormat::Jpeg, "{}", p.name);
        assert_eq!((out.media_type, out.ext), ("image/jpeg", "jpg"));
        let img = image::load_from_memory(&out.bytes).expect("decodes");
        assert_eq!((img.width(), img.height()), (spec.width, spec.height), "{}", p.name);
        assert_eq!((out.width, out.height), (spec.width, spec.height));
        assert!(out.bytes.len() as u64 <= p.max_bytes.expect("limit"), "{}: {} bytes", p.name, out.bytes.len());
        assert_eq!(out.sha256, sha256_hex(&out.bytes));
        // The padding: white across the top and bottom rows.
        for x in (0..spec.width).step_by(97) {
            for y in [2, spec.height - 3] {
                assert!(near(rgb(&img, x, y), [255, 255, 255], 3), "{}: ({x},{y}) is {:?}", p.name, rgb(&img, x, y));
            }
        }
        // The picture itself in the middle, edge to edge (not cropped, not white).
        let mid = spec.height / 2;
        for x in [3, spec.width / 2, spec.width - 4] {
            let px = rgb(&img, x, mid);
            assert!(!near(px, [255, 255, 255], 40), "{}: ({x},{mid}) is {px:?}, expected the image", p.name);
        }
        // Nothing of the source's metadata survives.
        assert!(!contains(&out.bytes, b"secret-metadata-marker"), "{}", p.name);
        assert!(!contains(&out.bytes, b"Exif"), "{}", p.name);
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn the_acceptance_profile_pads_a_square_with_white_above_and_below() {
    let p = custom("tall600", 600, 800, |s| {
        s.format = Some("png".into());
        s.file_name = Some("{product}_{role}_{profile}.{ext}".into());
    });
    let out = render(&p, &png(1024, 1024, None, |_, _| [20, 140, 60, 255])).expect("render");
    assert_eq!(image::guess_format(&out.bytes).expect("format"), ImageFormat::Png);
    let img = image::load_from_memory(&out.bytes).expect("decodes");
    assert_eq!(img.color(), image::ColorType::Rgb8, "8-bit RGB");
    assert_eq!(img.dimensions(), (600, 800));
    // 1024² fits as 600×600 with 100 rows of white above and below; lossless, so exact.
    for x in (0..600).step_by(50) {
        for y in [0, 5, 99, 701, 794, 799] {
            assert_eq!(rgb(&img, x, y), [255, 255, 255], "({x},{y})");
        }
        for y in [100, 400, 699] {
            assert_eq!(rgb(&img, x, y), [20, 140, 60], "({x},{y})");
        }
    }
    assert!(!contains(&out.bytes, b"secret-metadata-marker"));
}

#[test]
fn crop_covers_and_cuts_the_sides_equally() {
    let p = custom("sq", 300, 300, |s| {
        s.fit = Some("crop".into());
        s.format = Some("png".into());
    });
    // Thirds: red, green, blue across a 900×300 source; a centred square crop keeps green.
    let source = png(900, 300, None, |x, _| match x / 300 {
        0 => [255, 0, 0, 255],
        1 => [0, 255, 0, 255],
        _ => [0, 0, 255, 255],
    });
    let img = image::load_from_memory(&render(&p, &source).expect("render").bytes).expect("decodes");
    assert_eq!(img.dimensions(), (300, 300));
    for (x, y) in [(0, 0), (2, 150), (150, 150), (297, 299)] {
        assert!(near(rgb(&img, x, y), [0, 255, 0], 2), "({x},{y}) is {:?}", rgb(&img, x, y));
    }
}

#[test]
fn transparency_is_flattened_onto_the_background() {
    let p = custom("green-bg", 200, 100, |s| {
        s.background = Some("#00ff00".into());
        s.format = Some("png".into());
    });
    // Left half fully transparent (with a red colour that must not show), right half red.
    let source = png(200, 100, None, |x, _| if x < 100 { [255, 0, 0, 0] } else { [255, 0, 0, 255] });
    let out = render(&p, &source).expect("render");
    let img = image::load_from_memory(&out.bytes).expect("decodes");
    assert!(!img.color().has_alpha(), "the output is opaque");
    assert_eq!(rgb(&img, 10, 50), [0, 255, 0]);
    assert_eq!(rgb(&img, 190, 50), [255, 0, 0]);
}

#[test]
fn webp_is_lossless_and_exact() {
    let p = custom("w", 64, 64, |s| s.format = Some("webp".into()));
    let source = png(64, 64, None, |x, y| [(x * 4) as u8, (y * 4) as u8, 77, 255]);
    let out = render(&p, &source).expect("render");
    assert_eq!((image::guess_format(&out.bytes).expect("format"), out.ext), (ImageFormat::WebP, "webp"));
    let img = image::load_from_memory(&out.bytes).expect("decodes");
    assert_eq!((rgb(&img, 0, 0), rgb(&img, 63, 10)), ([0, 0, 77], [252, 40, 77]));
}

#[test]
fn jpeg_quality_steps_down_to_meet_max_bytes_or_says_it_cannot() {
    let source = photo(800, 800);
    let free = custom("free", 800, 800, |s| s.quality = Some(95));
    let full = render(&free, &source).expect("render");
    assert_eq!(full.quality, Some(95));
    let limit = full.bytes.len() as i64 * 3 / 4;
    let capped = custom("capped", 800, 800, |s| {
        s.quality = Some(95);
        s.max_bytes = Some(limit);
    });
    let out = render(&capped, &source).expect("a lower quality fits");
    assert!(
        out.bytes.len() as i64 <= limit && out.quality < Some(95),
        "{} bytes at {:?}",
        out.bytes.len(),
        out.quality
    );
    let tiny = custom("tiny", 800, 800, |s| s.max_bytes = Some(2_000));
    match render(&tiny, &source) {
        Err(RenderError::TooManyBytes { max_bytes: 2_000, smallest, .. }) => assert!(smallest > 2_000),
        other => panic!("{other:?}"),
    }
    let problems = check(&tiny, &source, "the Main photo's chosen image");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].kind, ProblemKind::TooManyBytes);
    assert!(
        crate::domain::words::english(&problems[0].message)
            .contains("even at the lowest quality; tiny takes at most 2 KB"),
        "{problems:?}"
    );
}

#[test]
fn an_embedded_colour_profile_is_converted_to_srgb() {
    let p3 = moxcms::ColorProfile::new_display_p3().encode().expect("icc");
    let profile = custom("exact", 8, 8, |s| s.format = Some("png".into()));
    let plain = render(&profile, &png(8, 8, None, |_, _| [0, 200, 0, 255])).expect("render");
    let tagged = render(&profile, &png(8, 8, Some(p3), |_, _| [0, 200, 0, 255])).expect("render");
    let a = rgb(&image::load_from_memory(&plain.bytes).expect("decodes"), 4, 4);
    let b = rgb(&image::load_from_memory(&tagged.bytes).expect("decodes"), 4, 4);
    assert_eq!(a, [0, 200, 0], "an untagged image is taken as sRGB");
    // Display-P3 green is more saturated than sRGB can show: in sRGB its red goes to 0 and
    // its green up; what matters is that the numbers were converted, not copied.
    assert!(b != a && b[1] > 200, "P3 (0,200,0) → sRGB {b:?}");
    assert!(!contains(&tagged.bytes, b"iCCP"), "no profile is embedded in the output");
}

#[test]
fn original_is_the_bytes_as_generated() {
    let p = builtin("original").expect("built in");
    let source = png(300, 200, None, |_, _| [1, 2, 3, 128]);
    let out = render(&p, &source).expect("render");
    assert_eq!(out.bytes, source);
    assert_eq!((out.width, out.height, out.ext, out.media_type), (300, 200, "png", "image/png"));
    assert_eq!(out.sha256, sha256_hex(&source));
    assert!(matches!(render(&p, b"not an image"), Err(RenderError::Unreadable(_))));
}

#[test]
fn check_explains_in_plain_words() {
    let amazon = builtin("amazon").expect("built in");
    let main = "the Main photo's chosen image";
    let small = check(&amazon, &photo(800, 800), main);
    assert_eq!(small.len(), 1, "{small:?}");
    assert_eq!(small[0].kind, ProblemKind::TooSmall);
    assert_eq!(
        crate::domain::words::english(&small[0].message),
        "the Main photo's chosen image is 800 px wide; amazon asks for at least 1000 px"
    );
    let low = check(&amazon, &photo(1200, 700), main);
    assert_eq!(
        crate::domain::words::english(&low[0].message),
        "the Main photo's chosen image is 700 px high; amazon asks for at least 1000 px"
    );
    assert_eq!(check(&amazon, &photo(1024, 1024), main), Vec::<Problem>::new(), "a 1024² image meets amazon");

    let original = builtin("original").expect("built in");
    let see_through = png(64, 64, None, |x, _| [200, 10, 10, if x < 32 { 0 } else { 255 }]);
    let t = check(&original, &see_through, main);
    assert_eq!(t.iter().map(|p| p.kind).collect::<Vec<_>>(), [ProblemKind::Transparent]);
    assert!(
        crate::domain::words::english(&t[0].message).starts_with("the Main photo's chosen image has transparent areas"),
        "{t:?}"
    );
    assert!(check(&amazon, &see_through, main).iter().all(|p| p.kind != ProblemKind::Transparent), "amazon fills it");

    let u = check(&amazon, b"GIF89a nonsense", main);
    assert_eq!(u[0].kind, ProblemKind::Unreadable);
    assert!(
        crate::domain::words::english(&u[0].message)
            .starts_with("the Main photo's chosen image cannot be read as an image"),
        "{u:?}"
    );
}

#[test]
fn a_sixteen_bit_source_becomes_eight_bit() {
    let mut info = png::Info::with_size(4, 4);
    info.color_type = png::ColorType::Rgb;
    info.bit_depth = png::BitDepth::Sixteen;
    let mut src = Vec::new();
    let mut enc = png::Encoder::with_info(&mut src, info).expect("info").write_header().expect("header");
    enc.write_image_data(&[0x80u8; 4 * 4 * 6]).expect("data");
    enc.finish().expect("finish");
    let p = custom("eight", 4, 4, |s| s.format = Some("png".into()));
    let img = image::load_from_memory(&render(&p, &src).expect("render").bytes).expect("decodes");
    assert_eq!(img.color(), image::ColorType::Rgb8);
    assert_eq!(rgb(&img, 1, 1), [128, 128, 128]);
}

#[test]
fn the_header_gives_the_size_without_the_pixels_and_too_small_says_it_like_check() {
    let source = photo(300, 200);
    assert_eq!(header_dimensions(&source), Ok((300, 200)));
    // The first part of the file is enough for the header; a few bytes are not.
    assert_eq!(header_dimensions(&source[..source.len() / 2]), Ok((300, 200)));
    assert!(header_dimensions(&source[..12]).is_err());
    assert!(header_dimensions(b"not an image at all").is_err());
    let p = builtin("amazon").expect("amazon");
    let words =
        too_small(&p, 300, 200, "the Main photo's chosen image").map(|x| crate::domain::words::english(&x.message));
    assert_eq!(
        words.as_deref(),
        Some("the Main photo's chosen image is 200 px high; amazon asks for at least 1000 px")
    );
    let checked: Vec<String> = check(&p, &source, "the Main photo's chosen image")
        .into_iter()
        .filter(|x| x.kind == ProblemKind::TooSmall)
        .map(|x| crate::domain::words::english(&x.message))
        .collect();
    assert_eq!(checked, words.into_iter().collect::<Vec<_>>(), "one wording for both");
    assert_eq!(too_small(&p, 1000, 1200, "x"), None);
}
