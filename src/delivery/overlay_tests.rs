//! Tests of the overlay renderer: every template draws only inside its area and the words are
//! there, drawing is deterministic, words that do not fit or that the font cannot draw block
//! (and leave the image untouched), the owner's lines are checked, and `check` agrees with
//! `draw` on every frame shape.

use super::*;
use crate::domain::words::tf;

const GREY: Rgb<u8> = Rgb([128, 128, 128]);

fn overlay(template: &str, lines: &[&str]) -> Overlay {
    Overlay { template: template.to_string(), lines: lines.iter().map(|l| l.to_string()).collect() }
}

fn grey(w: u32, h: u32) -> RgbImage {
    RgbImage::from_pixel(w, h, GREY)
}

/// The most a template's area may cover, as fractions of the frame: left, top, right, bottom.
fn max_region(template: &str) -> [f32; 4] {
    match template {
        "headline_band" => [0.0, 0.70, 1.0, 1.0],
        "side_panel" => [0.0, 0.0, 0.40, 1.0],
        "badge" => [0.0, 0.0, 0.50, 0.25],
        other => panic!("no template {other}"),
    }
}

fn near_white(p: &Rgb<u8>) -> bool {
    p.0.iter().all(|&v| v >= 240)
}

#[test]
fn the_font_is_read_and_draws_latin_chinese_punctuation_and_the_promised_signs() {
    let face = face().expect("the bundled font parses");
    let text = "Handmade ÀÉÎõü 0123456789 的一是了我不在人有这手工青花瓷 ，。！？：；（）「」、 ¥€℃×÷·•★✓ —…“”";
    for c in text.chars().filter(|c| !c.is_whitespace()) {
        assert!(face.draws(c), "the font draws {c} (U+{:04X})", c as u32);
    }
    assert!(!face.draws('☃') && !face.draws('\u{2000B}'));
    assert!(FONT_BYTES.len() < 4_000_000, "the subset stays small ({} bytes)", FONT_BYTES.len());
}

#[test]
fn the_templates_are_listed_with_words_in_both_languages() {
    let ts = templates();
    let names: Vec<&str> = ts.iter().map(|t| t.name).collect();
    assert_eq!(names, ["headline_band", "side_panel", "badge"]);
    for t in &ts {
        assert!(t.max_lines >= 2, "{}", t.name);
        assert!(!t.description.starts_with("overlay.") && !t.description_zh.starts_with("overlay."), "{}", t.name);
        assert_ne!(t.description, t.description_zh);
        assert!(t.description.contains(&t.max_lines.to_string()), "{}: {}", t.name, t.description);
    }
}

/// Every template, on a square and on a tall frame: the pixels change only inside the
/// template's area (which lies within its region), the area is the panel colour where no
/// glyph is, and the words are drawn (near-white pixels inside the area).
#[test]
fn every_template_draws_only_inside_its_area_and_the_words_are_there() {
    for t in templates() {
        for (w, h) in [(800, 800), (1200, 1600)] {
            let o = overlay(t.name, &["手工青花 Handmade"]);
            let mut img = grey(w, h);
            draw(&mut img, &o).expect("draws");
            let plan = layout(&o, w, h).expect("lays out");
            let [x0, y0, x1, y1] = plan.area_px(w, h);
            let [rx0, ry0, rx1, ry1] = max_region(t.name);
            let (fw, fh) = (w as f32, h as f32);
            assert!(x0 as f32 >= rx0 * fw - 1.0 && (x1 as f32) <= rx1 * fw + 1.0, "{}: x {x0}..{x1}", t.name);
            assert!(y0 as f32 >= ry0 * fh - 1.0 && (y1 as f32) <= ry1 * fh + 1.0, "{}: y {y0}..{y1}", t.name);
            assert!(x1 > x0 + 10 && y1 > y0 + 10, "{}: a real area", t.name);
            let (mut white, mut changed_outside) = (0usize, 0usize);
            for (x, y, p) in img.enumerate_pixels() {
                let inside = x >= x0 && x < x1 && y >= y0 && y < y1;
                if !inside && *p != GREY {
                    changed_outside += 1;
                }
                if inside && near_white(p) {
                    white += 1;
                }
            }
            assert_eq!(changed_outside, 0, "{} on {w}×{h}: pixels changed outside the area", t.name);
            let em_px = plan.size * plan.unit;
            assert!(
                white as f32 > em_px * em_px * 0.5,
                "{} on {w}×{h}: the words are drawn ({white} white pixels)",
                t.name
            );
            for (x, y) in [(x0, y0), (x1 - 1, y0), (x0, y1 - 1), (x1 - 1, y1 - 1)] {
                assert_eq!(*img.get_pixel(x, y), PANEL, "{}: the area's corner ({x}, {y}) is solid", t.name);
            }
            assert!(plan.size >= MIN_SIZE as f32 / 1000.0);
            // No word is cut when a smaller size keeps it whole.
            let words: Vec<&str> = plan.lines.iter().flat_map(|(l, _, _)| l.split(' ')).collect();
            assert_eq!(words, ["手工青花", "Handmade"], "{}: {:?}", t.name, plan.lines);
        }
    }
}

#[test]
fn drawing_is_deterministic() {
    for t in templates() {
        let o = overlay(t.name, &["手工青花 Handmade", "¥99 包邮"]);
        let (mut a, mut b) = (grey(900, 700), grey(900, 700));
        draw(&mut a, &o).expect("draws");
        draw(&mut b, &o).expect("draws");
        assert!(a.as_raw() == b.as_raw(), "{}: two draws give the same bytes", t.name);
        assert!(a.as_raw() != grey(900, 700).as_raw());
    }
}

#[test]
fn text_shrinks_for_longer_words_but_never_below_the_minimum() {
    let short = layout(&overlay("side_panel", &["青花"]), 1000, 1000).expect("fits");
    let long = layout(&overlay("side_panel", &[&"青花瓷".repeat(16)]), 1000, 1000).expect("fits");
    assert!(long.size < short.size, "{} < {}", long.size, short.size);
    assert!((short.size - 0.060).abs() < 1e-6);
    assert!(long.size >= MIN_SIZE as f32 / 1000.0);
    // Latin wraps at spaces: no word is cut when the words fit a line each.
    let latin = layout(&overlay("side_panel", &["Hand painted blue and white porcelain"]), 1000, 1000).expect("fits");
    for (text, _, _) in &latin.lines {
        for word in text.split(' ') {
            assert!(
                ["Hand", "painted", "blue", "and", "white", "porcelain"].contains(&word),
                "{word:?} in {:?}",
                latin.lines
            );
        }
    }
    // Words wrap whole before the size shrinks further, and a Latin word is not cut while a
    // smaller size keeps it whole.
    let two = layout(&overlay("side_panel", &["手工青花 Handmade"]), 800, 800).expect("fits");
    let texts: Vec<&str> = two.lines.iter().map(|(l, _, _)| l.as_str()).collect();
    assert_eq!(texts, ["手工青花", "Handmade"]);
    // A word wider than a line at the smallest size is cut between characters, never lost.
    let word = "Supercalifragilisticexpialidocious".repeat(2);
    let cut = layout(&overlay("side_panel", &[&word]), 1000, 1000).expect("fits when cut");
    assert!(cut.lines.len() > 1, "{:?}", cut.lines);
    assert_eq!(cut.lines.iter().map(|(l, _, _)| l.as_str()).collect::<String>(), word);
    // Closing punctuation never starts a line.
    let zh = layout(&overlay("side_panel", &[&"青花瓷，".repeat(12)]), 1000, 1000).expect("fits");
    assert!(zh.lines.iter().all(|(l, _, _)| !l.starts_with('，')), "{:?}", zh.lines);
}

#[test]
fn words_that_do_not_fit_block_from_check_and_draw_and_leave_the_image_untouched() {
    let line = "青".repeat(420);
    for t in templates() {
        let o = overlay(t.name, &[&line]);
        let err = check(&o, 800, 800).expect_err("does not fit");
        assert!(
            matches!(&err, OverlayError::DoesNotFit { template, line: 1, needs, holds } if template == t.name && needs > holds),
            "{err:?}"
        );
        let mut img = grey(800, 800);
        assert_eq!(draw(&mut img, &o), Err(err.clone()));
        assert!(img.as_raw() == grey(800, 800).as_raw(), "{}: untouched", t.name);
        let said = err.to_string();
        assert!(said.contains(t.name) && said.contains("smallest"), "{said}");
    }
    // The overflow is named at the owner's line where it starts.
    let err = check(&overlay("side_panel", &["青花", &line]), 800, 800).expect_err("does not fit");
    assert!(matches!(err, OverlayError::DoesNotFit { line: 2, .. }), "{err:?}");
}

#[test]
fn characters_the_font_cannot_draw_block_and_are_named() {
    for (text, named) in [
        ("青花 \u{2000B}", "\u{2000B}"),
        ("snow ☃ ☃ and 𠀋", "☃, 𠀋"),
        ("a\u{200B}b", "U+200B"),
        ("✓\u{FE0F} 🔥", "U+FE0F, 🔥"),
    ] {
        let o = overlay("headline_band", &[text]);
        let err = check(&o, 800, 800).expect_err("missing glyph");
        assert_eq!(err, OverlayError::MissingGlyphs { chars: named.to_string() });
        let mut img = grey(400, 400);
        assert_eq!(draw(&mut img, &o), Err(err.clone()));
        assert!(img.as_raw() == grey(400, 400).as_raw());
        assert!(err.to_string().starts_with(&format!("tally's font cannot draw {named}:")), "{err}");
    }
    // Whitespace of any kind is not a missing glyph.
    check(&overlay("headline_band", &["青花\u{3000}瓷\tmug\u{A0}!"]), 800, 800).expect("fits");
}

#[test]
fn the_owners_lines_are_checked() {
    let err = |o: Overlay| check(&o, 800, 800).expect_err("refused");
    let unknown = err(overlay("banner", &["x"]));
    assert_eq!(unknown, OverlayError::UnknownTemplate { name: "banner".into() });
    assert_eq!(
        unknown.to_string(),
        "there is no overlay template `banner`; the templates are: headline_band, side_panel, badge"
    );
    assert_eq!(err(overlay("badge", &[])), OverlayError::NoLines);
    assert_eq!(err(overlay("side_panel", &["青花", "  \u{3000}", "x"])), OverlayError::EmptyLine { line: 2 });
    assert_eq!(err(overlay("side_panel", &[""])), OverlayError::EmptyLine { line: 1 });
    assert_eq!(
        err(overlay("headline_band", &["a", "b", "c"])),
        OverlayError::TooManyLines { template: "headline_band".into(), max: 2, got: 3 }
    );
    assert!(check(&overlay("side_panel", &["1", "2", "3", "4", "5", "6"]), 800, 800).is_ok());
    assert!(matches!(
        err(overlay("side_panel", &["1", "2", "3", "4", "5", "6", "7"])),
        OverlayError::TooManyLines { .. }
    ));
    assert_eq!(check(&overlay("badge", &["x"]), 0, 800), Err(OverlayError::NoFrame { width: 0, height: 800 }));
}

/// Every error's sentence comes from the catalogue in both languages, its parameters filled.
#[test]
fn every_error_is_a_sentence_in_both_languages() {
    let errors = [
        OverlayError::UnknownTemplate { name: "x".into() },
        OverlayError::NoLines,
        OverlayError::EmptyLine { line: 2 },
        OverlayError::TooManyLines { template: "badge".into(), max: 2, got: 3 },
        OverlayError::MissingGlyphs { chars: "☃".into() },
        OverlayError::DoesNotFit { template: "badge".into(), line: 1, needs: 9, holds: 2 },
        OverlayError::NoFrame { width: 0, height: 1 },
        OverlayError::FontUnreadable,
    ];
    for e in errors {
        let (key, params) = e.key_and_params();
        let params: Vec<(&str, &str)> = params.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let (en, zh) = (tf(Lang::En, key, &params), tf(Lang::ZhCn, key, &params));
        assert!(crate::domain::words::has(key), "{key} is in the catalogue");
        assert_eq!(e.to_string(), en);
        for s in [&en, &zh] {
            assert!(!s.contains('{') && !s.starts_with("say."), "{key}: {s}");
        }
        assert_ne!(en, zh, "{key} has its own Chinese");
        assert!(zh.chars().any(|c| ('\u{4E00}'..='\u{9FFF}').contains(&c)), "{key}: {zh}");
    }
}

/// `check` on one size of a frame shape and `draw` on another size of the same shape agree,
/// for words on both sides of the limit.
#[test]
fn check_agrees_with_draw_on_every_frame_shape() {
    for t in templates() {
        for (w, h) in [(1, 1), (3, 4), (4, 3), (16, 9), (9, 16), (1, 2)] {
            let (mut fits, mut blocks) = (0, 0);
            for n in (4..=160).step_by(12) {
                let line = "手工青花瓷 Handmade ".repeat(n / 4);
                let o = overlay(t.name, &[line.trim()]);
                let checked = check(&o, w * 250, h * 250);
                let mut img = grey(w * 60, h * 60);
                let drawn = draw(&mut img, &o);
                assert_eq!(checked, drawn, "{} {w}:{h} n={n}", t.name);
                match checked {
                    Ok(()) => fits += 1,
                    Err(_) => blocks += 1,
                }
            }
            assert!(fits > 0 && blocks > 0, "{} {w}:{h}: words on both sides of the limit ({fits}, {blocks})", t.name);
        }
    }
}
