//! The owner's words drawn by tally onto a selling-point image (image models warp text, so
//! tally never asks one to write): a template ([`templates`]) puts one to a few lines of white
//! text on a solid dark area of the frame (a band across the bottom, a panel down the left, a
//! badge in the top-left corner), in one bundled font: Noto Sans CJK SC Bold, subset to Latin,
//! punctuation and the Chinese characters of GB 2312 (`assets/fonts/README.md`).
//!
//! The layout is worked out in units relative to the frame (its shorter side is 1), so whether
//! words fit depends on the frame's shape only: [`check`] knows it without an image, and
//! [`draw`] agrees with it. The text size starts at a share of the shorter side and shrinks in
//! steps down to a minimum; Latin wraps at spaces, Chinese between any two characters (closing
//! punctuation stays with the character before it). [`draw`] is deterministic: the same input
//! gives the same pixels.
//!
//! Invariant: the words come only from the owner: nothing here reads the image's content;
//! text never shrinks below the minimum nor is cut: it blocks instead
//! ([`OverlayError::DoesNotFit`]), and a character the font cannot draw blocks too
//! ([`OverlayError::MissingGlyphs`]): never a box in its place.

use std::fmt;
use std::sync::OnceLock;

use ab_glyph::{Font, FontRef, PxScale, point};
use image::{Rgb, RgbImage};
use serde::Serialize;

use crate::domain::Lang;
/// One overlay as a shot carries it: a template's name and the owner's lines (defined in
/// `domain::overlay`, so that a draft's shot, a set's shot and a delivery item carry one).
pub use crate::domain::overlay::Overlay;
use crate::domain::words::{say_with, t};

/// The font (Noto Sans CJK SC Bold, subset; SIL OFL 1.1: `assets/fonts/OFL.txt`).
const FONT_BYTES: &[u8] = include_bytes!("../../assets/fonts/NotoSansSC-Bold-subset.otf");

/// The solid colour of a template's area: a dark, brand-neutral grey.
pub const PANEL: Rgb<u8> = Rgb([28, 30, 34]);
/// The colour of the words.
pub const INK: Rgb<u8> = Rgb([255, 255, 255]);

/// The smallest text size, in thousandths of the frame's shorter side: text never gets smaller.
pub const MIN_SIZE: u32 = 32;
/// How much the text size shrinks per step, in thousandths of the shorter side.
const STEP: u32 = 4;
/// A line's height, in ems.
const LINE_HEIGHT: f32 = 1.3;
/// The room around the words inside a template's area, in ems (sides, top and bottom).
const PAD_X: f32 = 0.8;
const PAD_Y: f32 = 0.5;
/// Where the top of the ideographic em box is above the baseline, in ems (the font's design:
/// the em box runs from -0.12 to 0.88), so that a line's em box is centred in its line.
const EM_TOP: f32 = 0.88;
/// The badge's distance from the frame's top and left edges, in shorter sides.
const BADGE_MARGIN: f32 = 0.03;
/// Most characters a [`OverlayError::MissingGlyphs`] names.
const NAMED_MAX: usize = 12;

/// Where a template puts its area.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Across the full width at the bottom, as high as its lines (at most 30 % of the height).
    Band,
    /// Down the left 40 % of the width, the full height; the words left-aligned, centred
    /// vertically.
    Panel,
    /// In the top-left corner, as big as its lines (within the top-left 50 % × 25 %).
    Badge,
}

/// One template: its name, most lines (the owner's and after wrapping), first text size.
struct Template {
    name: &'static str,
    max_lines: usize,
    start: u32,
    kind: Kind,
}

const TEMPLATES: [Template; 3] = [
    Template { name: "headline_band", max_lines: 2, start: 70, kind: Kind::Band },
    Template { name: "side_panel", max_lines: 6, start: 60, kind: Kind::Panel },
    Template { name: "badge", max_lines: 2, start: 60, kind: Kind::Badge },
];

/// A template as `GET /v1/overlays` lists it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct TemplateInfo {
    /// The name a shot's overlay gives (`template`).
    pub name: &'static str,
    /// The most lines it draws: the owner's lines, and the lines after wrapping.
    pub max_lines: usize,
    /// What it looks like, in English.
    pub description: String,
    /// What it looks like, in Simplified Chinese.
    pub description_zh: String,
}

/// Every template tally draws with: `headline_band`, `side_panel`, `badge`.
pub fn templates() -> Vec<TemplateInfo> {
    TEMPLATES
        .iter()
        .map(|tp| {
            let key = format!("overlay.{}", tp.name);
            TemplateInfo {
                name: tp.name,
                max_lines: tp.max_lines,
                description: t(Lang::En, &key),
                description_zh: t(Lang::ZhCn, &key),
            }
        })
        .collect()
}

/// Why an overlay cannot be drawn; its `Display` is one plain English sentence from the
/// catalogue ([`OverlayError::key_and_params`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OverlayError {
    /// The template named is not one of [`templates`].
    UnknownTemplate {
        /// The name given.
        name: String,
    },
    /// The overlay has no lines.
    NoLines,
    /// Line `line` (1-based) is empty or only spaces.
    EmptyLine {
        /// Which line, from 1.
        line: usize,
    },
    /// More lines than the template draws.
    TooManyLines {
        /// The template's name.
        template: String,
        /// The most it draws.
        max: usize,
        /// How many were given.
        got: usize,
    },
    /// Characters the font cannot draw (whitespace excepted), named in order of appearance,
    /// `, `-separated (an invisible one as `U+XXXX`).
    MissingGlyphs {
        /// The characters, e.g. `𠀋, ☃`.
        chars: String,
    },
    /// The words do not fit the template even at the smallest text size: from owner line
    /// `line` (1-based) on, all the lines need `needs` lines where the template holds `holds`.
    DoesNotFit {
        /// The template's name.
        template: String,
        /// The owner's line (from 1) where the words first overflow.
        line: usize,
        /// How many lines all the words take at the smallest size.
        needs: usize,
        /// How many lines the template holds at that size (0: a character is wider than it).
        holds: usize,
    },
    /// The frame has no pixels.
    NoFrame {
        /// Its width.
        width: u32,
        /// Its height.
        height: u32,
    },
    /// The bundled font could not be read (a broken build; the tests make sure it is not).
    FontUnreadable,
}

impl OverlayError {
    /// The catalogue key of this error's sentence (`say.overlay_…`) and its parameters.
    pub fn key_and_params(&self) -> (&'static str, Vec<(&'static str, String)>) {
        match self {
            Self::UnknownTemplate { name } => {
                let names: Vec<&str> = TEMPLATES.iter().map(|tp| tp.name).collect();
                ("say.overlay_unknown_template", vec![("name", name.clone()), ("names", names.join(", "))])
            }
            Self::NoLines => ("say.overlay_no_lines", vec![]),
            Self::EmptyLine { line } => ("say.overlay_empty_line", vec![("line", line.to_string())]),
            Self::TooManyLines { template, max, got } => (
                "say.overlay_too_many_lines",
                vec![("template", template.clone()), ("max", max.to_string()), ("got", got.to_string())],
            ),
            Self::MissingGlyphs { chars } => ("say.overlay_missing_glyphs", vec![("chars", chars.clone())]),
            Self::DoesNotFit { template, line, needs, holds } => (
                "say.overlay_does_not_fit",
                vec![
                    ("template", template.clone()),
                    ("line", line.to_string()),
                    ("needs", needs.to_string()),
                    ("holds", holds.to_string()),
                ],
            ),
            Self::NoFrame { width, height } => {
                ("say.overlay_no_frame", vec![("width", width.to_string()), ("height", height.to_string())])
            }
            Self::FontUnreadable => ("say.overlay_font_unreadable", vec![]),
        }
    }
}

impl OverlayError {
    /// The error as a said line (`domain::words::say_with`), for what is stored or answered
    /// and shown later in the owner's language.
    pub fn said(&self) -> String {
        let (key, params) = self.key_and_params();
        let params: Vec<(&str, &str)> = params.iter().map(|(n, v)| (*n, v.as_str())).collect();
        say_with(key, &params)
    }
}

/// In English (logs, tests); [`OverlayError::said`] for the owner.
impl fmt::Display for OverlayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::domain::words::english(&self.said()))
    }
}

/// Everything that can be known without an image: the template is known, there are
/// 1..=max_lines lines and none is blank, the font draws every character (whitespace
/// excepted), and the words fit a frame of aspect `width`:`height` (the layout is relative to
/// the frame, so the fit does not depend on its pixel size). [`draw`] agrees with it.
pub fn check(overlay: &Overlay, width: u32, height: u32) -> Result<(), OverlayError> {
    layout(overlay, width, height).map(|_| ())
}

/// Draws `overlay` onto `img`, at its final size (tally draws after resizing to the
/// marketplace profile). Deterministic: the same image and overlay give the same pixels. The
/// same errors as [`check`]; on an error the image is left untouched.
pub fn draw(img: &mut RgbImage, overlay: &Overlay) -> Result<(), OverlayError> {
    let plan = layout(overlay, img.width(), img.height())?;
    paint(img, &plan);
    Ok(())
}

/// A rectangle in units of the frame's shorter side: left, top, right, bottom.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Rel {
    x0: f32,
    y0: f32,
    x1: f32,
    y1: f32,
}

/// An overlay laid out on a frame: what [`draw`] paints.
#[derive(Debug, Clone, PartialEq)]
struct Plan {
    /// The frame's shorter side in pixels (the unit of every relative length here).
    unit: f32,
    /// The text size (the em), relative.
    size: f32,
    /// The template's area, relative.
    area: Rel,
    /// The lines as drawn: the text, where it starts (left edge of its first glyph's advance)
    /// and its baseline, relative.
    lines: Vec<(String, f32, f32)>,
}

impl Plan {
    /// The area in pixels, clamped to the frame: left, top, right, bottom (exclusive).
    fn area_px(&self, width: u32, height: u32) -> [u32; 4] {
        let px = |v: f32, max: u32| ((v * self.unit).round().max(0.0) as u32).min(max);
        [px(self.area.x0, width), px(self.area.y0, height), px(self.area.x1, width), px(self.area.y1, height)]
    }
}

/// The parsed font and the measures the layout needs.
struct Face {
    font: FontRef<'static>,
    /// Font units per em.
    upem: f32,
    /// Ascent minus descent in font units (ab_glyph's `PxScale` is this many pixels).
    height: f32,
}

impl Face {
    /// A character's advance, in ems (every whitespace as a space).
    fn advance(&self, c: char) -> f32 {
        let c = if c.is_whitespace() { ' ' } else { c };
        self.font.h_advance_unscaled(self.font.glyph_id(c)) / self.upem
    }

    /// The blank after `c`'s ink within its advance, in ems (wide after `，` or `！`): left out
    /// when a line is centred, so that a line ending in punctuation looks centred.
    fn trailing_blank(&self, c: char) -> f32 {
        let id = self.font.glyph_id(c);
        let advance = self.font.h_advance_unscaled(id);
        let right = self.font.outline(id).map_or(advance, |o| o.bounds.max.x);
        ((advance - right) / self.upem).max(0.0)
    }

    /// Whether the font has a glyph for `c`.
    fn draws(&self, c: char) -> bool {
        self.font.glyph_id(c).0 != 0
    }
}

/// The font, parsed once.
fn face() -> Result<&'static Face, OverlayError> {
    static FACE: OnceLock<Option<Face>> = OnceLock::new();
    FACE.get_or_init(|| {
        let font = FontRef::try_from_slice(FONT_BYTES).ok()?;
        let upem = font.units_per_em()?;
        let height = font.height_unscaled();
        (upem > 0.0 && height > 0.0).then_some(Face { font, upem, height })
    })
    .as_ref()
    .ok_or(OverlayError::FontUnreadable)
}

/// Whether a line may break on either side of `c` (Chinese, Japanese, Korean, fullwidth).
fn breaks_anywhere(c: char) -> bool {
    (c as u32) >= 0x2E80 && !c.is_whitespace()
}

/// Whether `c` may not start a line (closing punctuation): it stays with the character before.
fn no_line_start(c: char) -> bool {
    "，。、．：；！？）】」』》〉〕］｝”’…—～·,.:;!?)]}%％".contains(c)
}

/// A piece of an owner's line that stays together unless it is wider than a whole line: a
/// Latin word, or one Chinese character (with the closing punctuation after it).
struct Item {
    chars: Vec<(char, f32)>,
    width: f32,
    space_before: bool,
}

/// An owner's line cut into [`Item`]s, advances in ems.
fn items(face: &Face, line: &str) -> Vec<Item> {
    let mut out: Vec<Item> = Vec::new();
    let mut space = false;
    let mut open_word = false;
    for c in line.trim().chars() {
        if c.is_whitespace() {
            space = true;
            open_word = false;
            continue;
        }
        let w = face.advance(c);
        let joins = !space && out.last().is_some() && (no_line_start(c) || (open_word && !breaks_anywhere(c)));
        match out.last_mut() {
            Some(last) if joins => {
                last.chars.push((c, w));
                last.width += w;
            }
            _ => out.push(Item { chars: vec![(c, w)], width: w, space_before: space }),
        }
        open_word = !breaks_anywhere(c);
        space = false;
    }
    out
}

/// The greedy wrap of one owner line into lines at most `avail` ems wide: each line's text and
/// width in ems. A word wider than a line is broken between any two characters when `cut`,
/// else the wrap fails (`None`), as it does when a single character is wider than `avail`.
fn wrap(items: &[Item], avail: f32, space: f32, cut: bool) -> Option<Vec<(String, f32)>> {
    let mut out = Vec::new();
    let (mut cur, mut cur_w) = (String::new(), 0.0f32);
    for it in items {
        let glue = if !cur.is_empty() && it.space_before { space } else { 0.0 };
        if cur_w + glue + it.width <= avail {
            if glue > 0.0 {
                cur.push(' ');
            }
            cur.extend(it.chars.iter().map(|(c, _)| *c));
            cur_w += glue + it.width;
            continue;
        }
        if !cur.is_empty() {
            out.push((std::mem::take(&mut cur), cur_w));
            cur_w = 0.0;
        }
        if it.width <= avail {
            cur.extend(it.chars.iter().map(|(c, _)| *c));
            cur_w = it.width;
            continue;
        }
        // Wider than a whole line: broken between any two characters.
        if !cut {
            return None;
        }
        for &(c, w) in &it.chars {
            if w > avail {
                return None;
            }
            if cur_w + w > avail {
                out.push((std::mem::take(&mut cur), cur_w));
                cur_w = 0.0;
            }
            cur.push(c);
            cur_w += w;
        }
    }
    if !cur.is_empty() {
        out.push((cur, cur_w));
    }
    Some(out)
}

/// Why words did not fit at one size: the owner's line where they first overflow, the lines
/// they need and the lines the template holds.
struct Overflow {
    line: usize,
    needs: usize,
    holds: usize,
}

/// The owner's lines laid out at text size `size` on a frame `fw`×`fh` (relative); words
/// wider than a line are broken only when `cut`.
fn fit_at(
    tp: &Template,
    items: &[Vec<Item>],
    face: &Face,
    (fw, fh): (f32, f32),
    size: f32,
    cut: bool,
) -> Result<Plan, Overflow> {
    let lh = LINE_HEIGHT * size;
    let (pad_x, pad_y) = (PAD_X * size, PAD_Y * size);
    let (avail_w, avail_h) = match tp.kind {
        Kind::Band => (fw - 2.0 * pad_x, 0.30 * fh - 2.0 * pad_y),
        Kind::Panel => (0.40 * fw - 2.0 * pad_x, fh - 2.0 * pad_y),
        Kind::Badge => (0.50 * fw - BADGE_MARGIN - 2.0 * pad_x, 0.25 * fh - BADGE_MARGIN - 2.0 * pad_y),
    };
    let by_height = if avail_h >= lh { (avail_h / lh).floor() as usize } else { 0 };
    let holds = if avail_w > 0.0 { tp.max_lines.min(by_height) } else { 0 };
    let mut lines: Vec<(String, f32)> = Vec::new();
    let mut first_over = None;
    for (i, its) in items.iter().enumerate() {
        match wrap(its, avail_w / size, face.advance(' '), cut) {
            Some(w) => lines.extend(w),
            None => return Err(Overflow { line: i + 1, needs: lines.len() + 1, holds: 0 }),
        }
        if lines.len() > holds && first_over.is_none() {
            first_over = Some(i + 1);
        }
    }
    if let Some(line) = first_over {
        return Err(Overflow { line, needs: lines.len(), holds });
    }
    let n = lines.len() as f32;
    // Each line's width to its last ink (what centring and the badge's width use), in ems.
    let inked: Vec<f32> =
        lines.iter().map(|(text, w)| w - text.chars().last().map_or(0.0, |c| face.trailing_blank(c))).collect();
    let widest = inked.iter().copied().fold(0.0f32, f32::max) * size;
    let (area, text_top) = match tp.kind {
        Kind::Band => {
            let top = fh - (n * lh + 2.0 * pad_y);
            (Rel { x0: 0.0, y0: top, x1: fw, y1: fh }, top + pad_y)
        }
        Kind::Panel => (Rel { x0: 0.0, y0: 0.0, x1: 0.40 * fw, y1: fh }, (fh - n * lh) / 2.0),
        Kind::Badge => {
            let (x1, y1) = (BADGE_MARGIN + widest + 2.0 * pad_x, BADGE_MARGIN + n * lh + 2.0 * pad_y);
            (Rel { x0: BADGE_MARGIN, y0: BADGE_MARGIN, x1, y1 }, BADGE_MARGIN + pad_y)
        }
    };
    let placed = lines
        .into_iter()
        .zip(inked)
        .enumerate()
        .map(|(i, ((text, _), w))| {
            let x = match tp.kind {
                Kind::Panel => pad_x,
                Kind::Band | Kind::Badge => area.x0 + (area.x1 - area.x0 - w * size) / 2.0,
            };
            let baseline = text_top + i as f32 * lh + (lh - size) / 2.0 + EM_TOP * size;
            (text, x, baseline)
        })
        .collect();
    Ok(Plan { unit: 0.0, size, area, lines: placed })
}

/// The characters of `lines` the font cannot draw, named for [`OverlayError::MissingGlyphs`].
fn missing(face: &Face, lines: &[String]) -> Option<String> {
    let mut seen: Vec<char> = Vec::new();
    for c in lines.iter().flat_map(|l| l.chars()) {
        if !c.is_whitespace() && !face.draws(c) && !seen.contains(&c) {
            seen.push(c);
        }
    }
    if seen.is_empty() {
        return None;
    }
    let invisible = |c: char| {
        c.is_control()
            || matches!(c as u32, 0x0300..=0x036F | 0x200B..=0x200F | 0x2028..=0x202E | 0x2060..=0x206F | 0xFE00..=0xFE0F | 0xFEFF)
    };
    let mut named: Vec<String> = seen
        .iter()
        .take(NAMED_MAX)
        .map(|&c| if invisible(c) { format!("U+{:04X}", c as u32) } else { c.to_string() })
        .collect();
    if seen.len() > NAMED_MAX {
        named.push("…".to_string());
    }
    Some(named.join(", "))
}

/// The checks of [`check`], in order, and the layout [`draw`] paints.
fn layout(overlay: &Overlay, width: u32, height: u32) -> Result<Plan, OverlayError> {
    let tp = TEMPLATES
        .iter()
        .find(|tp| tp.name == overlay.template)
        .ok_or_else(|| OverlayError::UnknownTemplate { name: overlay.template.clone() })?;
    if overlay.lines.is_empty() {
        return Err(OverlayError::NoLines);
    }
    if overlay.lines.len() > tp.max_lines {
        return Err(OverlayError::TooManyLines {
            template: tp.name.to_string(),
            max: tp.max_lines,
            got: overlay.lines.len(),
        });
    }
    if let Some(i) = overlay.lines.iter().position(|l| l.trim().is_empty()) {
        return Err(OverlayError::EmptyLine { line: i + 1 });
    }
    let face = face()?;
    if let Some(chars) = missing(face, &overlay.lines) {
        return Err(OverlayError::MissingGlyphs { chars });
    }
    if width == 0 || height == 0 {
        return Err(OverlayError::NoFrame { width, height });
    }
    let unit = width.min(height) as f32;
    let (fw, fh) = (width as f32 / unit, height as f32 / unit);
    let items: Vec<Vec<Item>> = overlay.lines.iter().map(|l| items(face, l)).collect();
    // Every size with whole words first; a word is cut only when no size keeps them whole.
    let mut last = Overflow { line: 1, needs: 0, holds: 0 };
    for cut in [false, true] {
        let mut size = tp.start.max(MIN_SIZE);
        loop {
            match fit_at(tp, &items, face, (fw, fh), size as f32 / 1000.0, cut) {
                Ok(plan) => return Ok(Plan { unit, ..plan }),
                Err(o) => last = o,
            }
            if size == MIN_SIZE {
                break;
            }
            size = size.saturating_sub(STEP).max(MIN_SIZE);
        }
    }
    Err(OverlayError::DoesNotFit {
        template: tp.name.to_string(),
        line: last.line,
        needs: last.needs,
        holds: last.holds,
    })
}

/// Paints a laid-out overlay: the area in [`PANEL`], then each glyph in [`INK`], its coverage
/// blended over the panel and clipped to the area.
fn paint(img: &mut RgbImage, plan: &Plan) {
    let Ok(face) = face() else { return };
    let [x0, y0, x1, y1] = plan.area_px(img.width(), img.height());
    for y in y0..y1 {
        for x in x0..x1 {
            img.put_pixel(x, y, PANEL);
        }
    }
    let em_px = plan.size * plan.unit;
    let scale = PxScale::from(em_px * face.height / face.upem);
    for (text, x, baseline) in &plan.lines {
        let mut pen = x * plan.unit;
        let base = baseline * plan.unit;
        for c in text.chars() {
            if !c.is_whitespace() {
                let glyph = face.font.glyph_id(c).with_scale_and_position(scale, point(pen, base));
                if let Some(outlined) = face.font.outline_glyph(glyph) {
                    let b = outlined.px_bounds();
                    outlined.draw(|gx, gy, cov| {
                        let (px, py) = (b.min.x as i64 + i64::from(gx), b.min.y as i64 + i64::from(gy));
                        let inside =
                            px >= i64::from(x0) && px < i64::from(x1) && py >= i64::from(y0) && py < i64::from(y1);
                        if inside {
                            let p = img.get_pixel_mut(px as u32, py as u32);
                            let a = cov.clamp(0.0, 1.0);
                            for k in 0..3 {
                                let (old, ink) = (f32::from(p.0[k]), f32::from(INK.0[k]));
                                p.0[k] = (old + (ink - old) * a).round() as u8;
                            }
                        }
                    });
                }
            }
            pen += face.advance(c) * em_px;
        }
    }
}

#[cfg(test)]
#[path = "overlay_tests.rs"]
mod tests;
