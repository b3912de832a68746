//! The built-in `demo` provider: renders a placeholder PNG locally (a "product" on a plain
//! background, `render::product_png`), at no cost, and does each
//! operation kind for real on this machine: an `edit` tints the source image by its
//! instruction, a `cutout` removes a plain background (the colour of the image's border,
//! flooded in from the edges) into a PNG with alpha.
//!
//! It lets a new user watch the whole path (submit, dispatch, claim, `calling`, artifact,
//! `succeeded`) without an account or network. Rendering is deterministic and free, so a
//! resend is harmless: it declares an idempotent create.

use std::time::Duration;

use image::{ImageFormat, Rgba, RgbaImage};

use super::{BoxFuture, CallError, CallRequest, Capabilities, Image, Provider, Submitted};
use crate::domain::operation::Operation;

/// The longest side the demo's edits and cutouts come back with.
const MAX_SIDE: u32 = 2048;
/// How far (per channel) a pixel may be from the border's colour and still count as
/// background.
const BACKGROUND_TOLERANCE: i32 = 40;

/// The side of the demo's square placeholder from its `size` (`"1024x1024"`, the default, as
/// the image models it stands in for make): the larger of the two numbers, 64 to 1024 px
/// (1024 when it cannot be read).
pub fn side(size: &str) -> u32 {
    let parts: Vec<u32> = size.split(['x', 'X', '*']).filter_map(|n| n.trim().parse().ok()).collect();
    match parts.as_slice() {
        [w, h] => (*w).max(*h).clamp(64, 1024),
        _ => 1024,
    }
}

/// Renders a placeholder image from the prompt after an optional delay.
#[derive(Debug, Clone)]
pub struct Demo {
    delay: Duration,
    size: u32,
}

impl Demo {
    /// A demo provider that waits `delay` (to make progress visible) and renders `size` px.
    pub fn new(delay: Duration, size: u32) -> Self {
        Demo { delay, size }
    }
}

impl Provider for Demo {
    fn capabilities(&self) -> Capabilities {
        Capabilities { idempotent_create: true, lookup: false }
    }

    fn billing_note(&self) -> String {
        crate::domain::words::say("say.bills_demo")
    }

    fn submit<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Submitted, CallError>> {
        Box::pin(async move {
            if !self.delay.is_zero() {
                tokio::time::sleep(self.delay).await;
            }
            if req.operation == Operation::Draft {
                // A plan made here from the facts it is given, for free (`demo_draft`).
                let input: crate::domain::draft::DraftInput =
                    req.params.get("draft").and_then(|d| serde_json::from_value(d.clone()).ok()).ok_or_else(|| {
                        CallError::Rejected { message: "the demo provider got no draft input".into(), config: false }
                    })?;
                return Ok(Submitted::Done(super::answer_image(&super::demo_draft::answer(&input))));
            }
            if req.operation != Operation::Generate {
                let source = req.references.first().cloned().ok_or_else(|| CallError::Rejected {
                    message: "the demo provider got no image to work on".into(),
                    config: false,
                })?;
                let (op, prompt) = (req.operation, req.prompt.clone());
                let bytes = tokio::task::spawn_blocking(move || match op {
                    Operation::Cutout => cutout(&source.bytes),
                    _ => edit(&source.bytes, &prompt),
                })
                .await
                .map_err(|e| CallError::Rejected { message: format!("the demo's render stopped: {e}"), config: false })?
                .map_err(|message| CallError::Rejected { message, config: false })?;
                return Ok(Submitted::Done(Image { bytes, media_type: "image/png".into() }));
            }
            // Each candidate of a shot gets its own colours, so choosing can be tried for free.
            let bytes = if req.candidate == 0 {
                crate::render::product_png(&req.prompt, self.size)
            } else {
                crate::render::product_png(&format!("{} (candidate {})", req.prompt, req.candidate + 1), self.size)
            };
            Ok(Submitted::Done(Image { bytes, media_type: "image/png".into() }))
        })
    }
}

/// Decode a source image under the daemon's image budget ([`crate::pixels`]: its size read
/// first, refused in words when too large) and bring it to at most [`MAX_SIDE`] px on its
/// longer side. The budget's ticket is given back before the (small) result is returned.
fn decode(bytes: &[u8]) -> Result<RgbaImage, String> {
    let small = 4 * u64::from(MAX_SIDE) * u64::from(MAX_SIDE);
    let d = crate::pixels::decode(bytes, crate::pixels::decoded_plus(0, 2 * small))
        .map_err(|e| format!("the image cannot be used: {e}"))?;
    let img = d.image;
    let img = if img.width().max(img.height()) > MAX_SIDE { img.thumbnail(MAX_SIDE, MAX_SIDE) } else { img };
    let rgba = img.to_rgba8();
    drop(d.ticket);
    Ok(rgba)
}

fn encode(img: &RgbaImage) -> Result<Vec<u8>, String> {
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, ImageFormat::Png).map_err(|e| format!("the result cannot be encoded: {e}"))?;
    Ok(out.into_inner())
}

/// The demo's edit: the source tinted towards a colour named by the instruction (a hash of
/// it), a third of the way, so each instruction gives its own visible result.
fn edit(bytes: &[u8], instruction: &str) -> Result<Vec<u8>, String> {
    let mut img = decode(bytes)?;
    let h =
        instruction.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let tint = [(h & 0xff) as u16, ((h >> 8) & 0xff) as u16, ((h >> 16) & 0xff) as u16];
    for p in img.pixels_mut() {
        for (channel, t) in p.0.iter_mut().zip(tint) {
            *channel = ((u16::from(*channel) * 2 + t) / 3) as u8;
        }
    }
    encode(&img)
}

/// The demo's cutout: the border's common colours (each a tenth of it or more: one for a plain
/// backdrop, a few for a pattern) are the background; every pixel within
/// [`BACKGROUND_TOLERANCE`] of one of them that is connected to the border becomes transparent. An
/// image with nothing left, or with no background found, is refused in plain words.
fn cutout(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let mut img = decode(bytes)?;
    let (w, h) = img.dimensions();
    let mut border = Vec::new();
    for x in 0..w {
        border.push((x, 0));
        border.push((x, h - 1));
    }
    for y in 0..h {
        border.push((0, y));
        border.push((w - 1, y));
    }
    let mut counts = std::collections::HashMap::new();
    for &(x, y) in &border {
        let p = img.get_pixel(x, y).0;
        // Quantized, so noise around one colour counts as that colour.
        *counts.entry([p[0] / 16, p[1] / 16, p[2] / 16]).or_insert(0u32) += 1;
    }
    // The background: the border's colours that each cover at least a tenth of it (a plain
    // backdrop has one; a pattern, a few), at most four, the most common first.
    let edge = border.len() as u32;
    let mut common: Vec<([u8; 3], u32)> = counts.into_iter().collect();
    common.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let buckets: Vec<[u8; 3]> = common.iter().filter(|(_, n)| n * 10 >= edge).take(4).map(|(b, _)| *b).collect();
    if buckets.is_empty() {
        return Err("no background was found around the product: the photo's edges share no colour".into());
    }
    let near = |p: &Rgba<u8>| {
        buckets.iter().any(|bucket| {
            (0..3).all(|c| (i32::from(p.0[c]) - i32::from(bucket[c]) * 16 - 8).abs() <= BACKGROUND_TOLERANCE)
        })
    };
    let mut seen = vec![false; (w as usize) * (h as usize)];
    let mut stack: Vec<(u32, u32)> = border.into_iter().filter(|&(x, y)| near(img.get_pixel(x, y))).collect();
    let mut cleared = 0u64;
    while let Some((x, y)) = stack.pop() {
        let i = (y as usize) * (w as usize) + x as usize;
        if seen[i] || !near(img.get_pixel(x, y)) {
            continue;
        }
        seen[i] = true;
        img.get_pixel_mut(x, y).0[3] = 0;
        cleared += 1;
        if x > 0 {
            stack.push((x - 1, y));
        }
        if y > 0 {
            stack.push((x, y - 1));
        }
        if x + 1 < w {
            stack.push((x + 1, y));
        }
        if y + 1 < h {
            stack.push((x, y + 1));
        }
    }
    let total = u64::from(w) * u64::from(h);
    if cleared == 0 {
        return Err(
            "no plain background was found around the product (the demo removes only a plain or simply patterned one)"
                .into(),
        );
    }
    if cleared == total {
        return Err("nothing but background was found: the image shows no product to cut out".into());
    }
    encode(&img)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn product_on(bg: [u8; 3]) -> Vec<u8> {
        let mut img = RgbaImage::from_pixel(40, 30, Rgba([bg[0], bg[1], bg[2], 255]));
        for y in 10..20 {
            for x in 15..25 {
                img.put_pixel(x, y, Rgba([200, 30, 30, 255]));
            }
        }
        encode(&img).expect("encode")
    }

    #[test]
    fn cutout_clears_a_plain_background_and_keeps_the_product() {
        for bg in [[255, 255, 255], [40, 120, 200], [238, 236, 230]] {
            let out = image::load_from_memory(&cutout(&product_on(bg)).expect("cutout")).expect("png").to_rgba8();
            assert_eq!(out.get_pixel(0, 0).0[3], 0, "{bg:?}");
            assert_eq!(out.get_pixel(39, 29).0[3], 0);
            assert_eq!(out.get_pixel(20, 15).0, [200, 30, 30, 255]);
            let clear = out.pixels().filter(|p| p.0[3] == 0).count();
            assert_eq!(clear, 40 * 30 - 100, "{bg:?}");
        }
        let plain = encode(&RgbaImage::from_pixel(8, 8, Rgba([9, 9, 9, 255]))).expect("encode");
        assert!(cutout(&plain).unwrap_err().contains("no product"));
    }

    #[test]
    fn edit_changes_the_image_by_its_instruction() {
        let src = product_on([255, 255, 255]);
        let a = edit(&src, "make it marble").expect("edit");
        let b = edit(&src, "make it wood").expect("edit");
        assert_ne!(a, b);
        assert_ne!(image::load_from_memory(&a).expect("png").to_rgba8().get_pixel(0, 0).0, [255, 255, 255, 255]);
    }
}
