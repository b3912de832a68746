//! What a shot adds to a profile's file for a marketplace listing (issue #37), and the
//! profile's rules measured on the file made.
//!
//! - **A white main image from the real product** ([`compose_white`]): a `main_white` shot's
//!   chosen image is a cutout (the product on a transparent background, from a photo of the
//!   real product). Its product — the box of its opaque pixels — is composed locally and
//!   deterministically on RGB 255,255,255: centred, scaled so the box fills the profile's `fill`
//!   share of the frame (a little more, so antialiased edges still measure it). No model draws
//!   the product.
//! - **The owner's words** ([`super::overlay`]): drawn by tally onto the frame after it is
//!   brought to the profile's size.
//! - **The rules** ([`problems`]): `background_rule = "pure_white"`, `fill`, `no_alpha`,
//!   measured by decoding the encoded file itself, so what is checked is what is written.
//!
//! Invariant: the chosen image's stored bytes are never changed here; a listing file is a new
//! rendering with its own sha256 (the renderer returns bytes, the store is not touched).

use image::{RgbImage, RgbaImage};

use super::overlay::Overlay;
use super::profile::{BackgroundRule, DEFAULT_FILL, Profile, Render};
use super::render::{Problem, ProblemKind, RenderError, Rendered};
use crate::domain::words::say_with;

/// The alpha from which a cutout's pixel counts as the product (its box).
const PRODUCT_ALPHA: u8 = 16;

/// Below this (in any channel) a pixel of a file made counts as product, not background:
/// a JPEG's near-white noise stays background.
const PRODUCT_LEVEL: u8 = 250;

/// How far around the product's box (in px) a JPEG's ringing may reach; `pure_white` is checked
/// on every pixel further out than this (and on the whole outer edge).
const RING: u32 = 16;

/// How much more than `fill` (in thousandths) a composition aims for, so that the measured box
/// (antialiased edges lighter than [`PRODUCT_LEVEL`]) still reaches `fill`.
const FILL_MARGIN: u16 = 10;

/// What a shot adds to a profile's file.
#[derive(Debug, Clone, Copy, Default)]
pub struct Listing<'a> {
    /// A `main_white` shot: its chosen image is a cutout, composed on pure white.
    pub white: bool,
    /// The owner's words, drawn by tally.
    pub overlay: Option<&'a Overlay>,
}

impl Listing<'_> {
    /// Whether the plain render (fit and encode) is all there is to do.
    pub fn is_plain(&self) -> bool {
        !self.white && self.overlay.is_none()
    }

    /// A short stable text naming what this adds (for the kept files' keys).
    pub fn key(&self) -> String {
        match (self.white, self.overlay) {
            (false, None) => String::new(),
            (white, o) => format!("#white={white};{}", o.map(|o| serde_json::json!(o).to_string()).unwrap_or_default()),
        }
    }
}

/// Compose a cutout (`source`, with alpha) on pure white at `spec`'s size, its product's box
/// filling `fill` thousandths of the frame (plus [`FILL_MARGIN`]). Returns the frame with the
/// image-budget ticket that pays for it and its encoding (drop both together).
pub fn compose_white(
    source: &[u8],
    spec: &Render,
    fill: Option<u16>,
) -> Result<(RgbImage, crate::pixels::Ticket<'static>), RenderError> {
    let (tw, th) = (spec.width, spec.height);
    let peak = |s: crate::pixels::Size| s.decoded + 8 * s.pixels() + 6 * u64::from(tw) * u64::from(th);
    let d = crate::pixels::decode(source, peak)?;
    if !d.image.color().has_alpha() {
        return Err(RenderError::NoProduct(say_with("say.white_not_cut_out", &[])));
    }
    let ticket = d.ticket;
    let mut img = image::DynamicImage::ImageRgba8(d.image.into_rgba8());
    img.apply_orientation(d.orientation);
    let rgba = img.into_rgba8();
    let Some((x0, y0, x1, y1)) = alpha_box(&rgba) else {
        return Err(RenderError::NoProduct(say_with("say.white_nothing_found", &[])));
    };
    let (w, h) = rgba.dimensions();
    if (x0, y0, x1, y1) == (0, 0, w - 1, h - 1) && rgba.pixels().all(|p| p[3] >= PRODUCT_ALPHA) {
        return Err(RenderError::NoProduct(say_with("say.white_no_background", &[])));
    }
    let crop = image::imageops::crop_imm(&rgba, x0, y0, x1 - x0 + 1, y1 - y0 + 1).to_image();
    drop(rgba);
    let flat = super::render::flatten(&crop, super::profile::Rgb::WHITE);
    let share = f64::from(fill.unwrap_or(DEFAULT_FILL).saturating_add(FILL_MARGIN).min(1000)) / 1000.0;
    let (bw, bh) = (f64::from(flat.width()), f64::from(flat.height()));
    let scale = (share * f64::from(tw) / bw).min(share * f64::from(th) / bh);
    let nw = ((bw * scale).round() as u32).clamp(1, tw);
    let nh = ((bh * scale).round() as u32).clamp(1, th);
    let mut canvas = RgbImage::from_pixel(tw, th, image::Rgb([255, 255, 255]));
    super::render::scale_into(&flat, &mut canvas, ((tw - nw) / 2, (th - nh) / 2, nw, nh))?;
    Ok((canvas, ticket))
}

/// The box (inclusive) of the pixels at least [`PRODUCT_ALPHA`] opaque; `None`: none is.
fn alpha_box(img: &RgbaImage) -> Option<(u32, u32, u32, u32)> {
    let mut b: Option<(u32, u32, u32, u32)> = None;
    for (x, y, p) in img.enumerate_pixels() {
        if p[3] >= PRODUCT_ALPHA {
            b = Some(match b {
                None => (x, y, x, y),
                Some((a, c, e, f)) => (a.min(x), c.min(y), e.max(x), f.max(y)),
            });
        }
    }
    b
}

/// What a file made measures, for the profile's rules.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Measured {
    pub width: u32,
    pub height: u32,
    /// Whether the file has an alpha channel.
    pub alpha: bool,
    /// Outer-edge pixels, and how many of them are not exactly white.
    pub edge: u64,
    pub edge_off: u64,
    /// Pixels further than [`RING`] px from the product's box that are not exactly white.
    pub around_off: u64,
    /// The product's box (pixels darker than [`PRODUCT_LEVEL`] in some channel), inclusive.
    pub product: Option<(u32, u32, u32, u32)>,
}

impl Measured {
    /// The share of the frame (thousandths) the product's box covers: its width over the
    /// frame's, or its height over the frame's, whichever is larger.
    pub fn fill(&self) -> u16 {
        let Some((x0, y0, x1, y1)) = self.product else { return 0 };
        let w = f64::from(x1 - x0 + 1) / f64::from(self.width.max(1));
        let h = f64::from(y1 - y0 + 1) / f64::from(self.height.max(1));
        (w.max(h) * 1000.0).floor() as u16
    }
}

/// Decode a file made and measure it.
pub fn measure(file: &[u8]) -> Result<Measured, RenderError> {
    let d = crate::pixels::decode(file, crate::pixels::decoded_plus(4, 0))?;
    let alpha = d.image.color().has_alpha();
    let rgb = d.image.into_rgb8();
    let (w, h) = rgb.dimensions();
    let white = |p: &image::Rgb<u8>| p.0 == [255, 255, 255];
    let mut product: Option<(u32, u32, u32, u32)> = None;
    let (mut edge, mut edge_off) = (0u64, 0u64);
    for (x, y, p) in rgb.enumerate_pixels() {
        if x == 0 || y == 0 || x + 1 == w || y + 1 == h {
            edge += 1;
            edge_off += u64::from(!white(p));
        }
        if p.0.iter().any(|c| *c < PRODUCT_LEVEL) {
            product = Some(match product {
                None => (x, y, x, y),
                Some((a, b, c, e)) => (a.min(x), b.min(y), c.max(x), e.max(y)),
            });
        }
    }
    let mut around_off = 0u64;
    if let Some((x0, y0, x1, y1)) = product {
        let near = |x: u32, y: u32| {
            x + RING >= x0 && x <= x1.saturating_add(RING) && y + RING >= y0 && y <= y1.saturating_add(RING)
        };
        for (x, y, p) in rgb.enumerate_pixels() {
            if !near(x, y) && !white(p) {
                around_off += 1;
            }
        }
    }
    Ok(Measured { width: w, height: h, alpha, edge, edge_off, around_off, product })
}

/// The profile's rules that `file` breaks, in plain words about `subject` (empty: none).
/// A file that cannot be decoded again is reported as such.
pub fn problems(profile: &Profile, file: &Rendered, subject: &str) -> Vec<Problem> {
    if profile.background_rule.is_none() && profile.fill.is_none() && !profile.no_alpha {
        return Vec::new();
    }
    let m = match measure(&file.bytes) {
        Ok(m) => m,
        Err(e) => {
            return vec![Problem {
                kind: ProblemKind::Unreadable,
                message: format!("{subject}: the file made cannot be read back: {e}"),
            }];
        }
    };
    let name = profile.name.as_str();
    let mut out = Vec::new();
    let rule = |kind, key: &str, params: &[(&str, &str)]| Problem { kind, message: say_with(key, params) };
    if profile.no_alpha && m.alpha {
        out.push(rule(ProblemKind::Rule, "say.rule_alpha", &[("subject", subject), ("profile", name)]));
    }
    if profile.background_rule == Some(BackgroundRule::PureWhite) {
        if m.edge_off > 0 {
            let (off, all) = (group(m.edge_off), group(m.edge));
            out.push(rule(
                ProblemKind::Rule,
                "say.rule_edge_not_white",
                &[("subject", subject), ("off", &off), ("all", &all), ("profile", name)],
            ));
        } else if m.around_off > 0 {
            let off = group(m.around_off);
            out.push(rule(
                ProblemKind::Rule,
                "say.rule_around_not_white",
                &[("subject", subject), ("off", &off), ("profile", name)],
            ));
        }
    }
    if let Some(min) = profile.fill {
        let got = m.fill();
        if got < min {
            let (got, min) = (percent(got), percent(min));
            out.push(rule(
                ProblemKind::Rule,
                "say.rule_fill",
                &[("subject", subject), ("got", &got), ("min", &min), ("profile", name)],
            ));
        }
    }
    out
}

/// Thousandths as a whole percentage, rounded down (`849` → `84`).
fn percent(thousandths: u16) -> String {
    (thousandths / 10).to_string()
}

/// `n` with thousands separated by commas (`3,196`).
fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rule's sentence is the catalogue's in both languages, the shot's name translated too.
    #[test]
    fn a_broken_rule_is_said_in_the_owners_language() {
        use crate::domain::Lang;
        use crate::domain::words::{english, render, say, say_with};
        let subject = say_with("say.chosen_image_of", &[("shot", &say("say.role_main_white"))]);
        let fill = say_with(
            "say.rule_fill",
            &[("subject", &subject), ("got", "71"), ("min", "85"), ("profile", "amazon_main")],
        );
        assert_eq!(
            english(&fill),
            "the White main image's chosen image: the product fills 71 % of the frame; amazon_main asks for at least 85 %"
        );
        let zh = render(Lang::ZhCn, &fill);
        assert!(zh.contains("白底主图") && zh.contains("71%") && zh.contains("amazon_main"), "{zh}");
        let edge = say_with(
            "say.rule_edge_not_white",
            &[("subject", &subject), ("off", &group(212)), ("all", &group(3196)), ("profile", "taobao_white")],
        );
        assert!(english(&edge).contains("212 of 3,196 edge pixels"), "{edge}");
        assert!(render(Lang::ZhCn, &edge).contains("边缘不是纯白"));
        let why = super::super::render::check_listing(
            &super::super::profile::builtin("amazon_main").expect("amazon_main"),
            &opaque_png(),
            &Listing { white: true, overlay: None },
            &subject,
        )
        .0;
        let zh = render(Lang::ZhCn, &why[0].message);
        assert!(zh.contains("白底主图") && zh.contains("抠图"), "{zh}");
    }

    /// The rules measured on a file: a grey edge, a product too small, pure white around.
    #[test]
    fn the_rules_are_measured_on_the_file() {
        let amazon = super::super::profile::builtin("amazon_main").expect("amazon_main");
        // 1000×1000 white with a 500×500 red square in the middle: fill 50 %, edge white.
        let mut img = RgbImage::from_pixel(1000, 1000, image::Rgb([255, 255, 255]));
        for y in 250..750 {
            for x in 250..750 {
                img.put_pixel(x, y, image::Rgb([200, 30, 30]));
            }
        }
        let m = measure(&png(&img)).expect("measure");
        assert_eq!((m.edge, m.edge_off, m.around_off, m.fill()), (3996, 0, 0, 500));
        let file = |img: &RgbImage| Rendered {
            bytes: png(img),
            width: img.width(),
            height: img.height(),
            media_type: "image/png",
            ext: "png",
            sha256: String::new(),
            quality: None,
        };
        let found = problems(&amazon, &file(&img), "it");
        assert_eq!(found.len(), 1, "{found:?}");
        let said = crate::domain::words::english(&found[0].message);
        assert!(said.contains("fills 50 %"), "{said}");
        // A light grey edge (a generated "white"), and a grey speck far from the product.
        for x in 0..1000 {
            img.put_pixel(x, 0, image::Rgb([250, 250, 250]));
        }
        img.put_pixel(100, 900, image::Rgb([254, 254, 254]));
        let m = measure(&png(&img)).expect("measure");
        assert_eq!((m.edge_off, m.around_off), (1000, 1001));
        let found = problems(&amazon, &file(&img), "it");
        assert!(
            found.iter().any(|p| crate::domain::words::english(&p.message).contains("1,000 of 3,996 edge pixels")),
            "{found:?}"
        );
    }

    fn png(img: &RgbImage) -> Vec<u8> {
        let mut out = std::io::Cursor::new(Vec::new());
        img.write_to(&mut out, image::ImageFormat::Png).expect("png");
        out.into_inner()
    }

    fn opaque_png() -> Vec<u8> {
        png(&RgbImage::from_pixel(1200, 1200, image::Rgb([10, 200, 10])))
    }

    #[test]
    fn numbers_read_as_the_owner_writes_them() {
        assert_eq!(group(3196), "3,196");
        assert_eq!(group(212), "212");
        assert_eq!(group(1_000_000), "1,000,000");
        assert_eq!(percent(849), "84");
        assert_eq!(percent(850), "85");
    }
}
