//! Placeholder image rendering: a small, real PNG derived from a prompt.
//!
//! Used by the `demo` provider (so a new user sees the whole path work with no account), by
//! the mock provider server and by the benchmark's instant provider. Deterministic: the same
//! prompt always gives the same bytes.

use sha2::{Digest, Sha256};

/// Render a `size`×`size` RGB PNG whose colours are derived from `prompt`.
pub fn placeholder_png(prompt: &str, size: u32) -> Vec<u8> {
    let digest = Sha256::digest(prompt.as_bytes());
    let (a, b) = ([digest[0], digest[1], digest[2]], [digest[3], digest[4], digest[5]]);
    let size = size.clamp(1, 1024);
    let mut pixels = Vec::with_capacity((size * size * 3) as usize);
    for y in 0..size {
        for x in 0..size {
            // A diagonal gradient between the two colours, with a stripe every 16 pixels.
            let t = (x + y) as f32 / (2 * size) as f32;
            let stripe = if (x / 16 + y / 16) % 2 == 0 { 1.0 } else { 0.85 };
            for c in 0..3 {
                let v = (a[c] as f32 * (1.0 - t) + b[c] as f32 * t) * stripe;
                pixels.push(v as u8);
            }
        }
    }
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, size, size);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    // Writing into a Vec cannot fail for a well-formed header, so these never error; map to an
    // empty result rather than panic if the png crate ever changes that.
    let ok = encoder.write_header().and_then(|mut w| w.write_image_data(&pixels).and_then(|_| w.finish()));
    if ok.is_err() {
        return Vec::new();
    }
    out
}

/// A `side`×`side` RGB PNG of one colour (black), written a row at a time: a few hundred KB
/// on disk however large `side` is (12,000 px: about 420 KB for 432 MB of pixels). The mock's
/// `giant_image_side` answers it, as a hostile provider might. Made once per side and kept.
pub fn flat_png(side: u32) -> Vec<u8> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static MADE: OnceLock<Mutex<HashMap<u32, Vec<u8>>>> = OnceLock::new();
    let made = MADE.get_or_init(Mutex::default);
    if let Some(b) = made.lock().ok().and_then(|m| m.get(&side).cloned()) {
        return b;
    }
    /// A writer the stream writer may own (`'static`) whose bytes stay reachable.
    #[derive(Clone, Default)]
    struct Shared(std::sync::Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().map_err(|_| std::io::Error::other("poisoned"))?.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let side = side.max(1);
    let sink = Shared::default();
    let mut encoder = png::Encoder::new(sink.clone(), side, side);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.set_compression(png::Compression::Fast);
    encoder.set_filter(png::Filter::NoFilter);
    let row = vec![0u8; side as usize * 3];
    let ok = encoder.write_header().and_then(|w| {
        let mut s = w.into_stream_writer()?;
        for _ in 0..side {
            std::io::Write::write_all(&mut s, &row)?;
        }
        s.finish()
    });
    let out = match (ok, sink.0.lock()) {
        (Ok(()), Ok(b)) => b.clone(),
        _ => return Vec::new(),
    };
    if let Ok(mut m) = made.lock() {
        m.insert(side, out.clone());
    }
    out
}

/// Render a `size`×`size` RGB PNG of a "product" on a plain background, both coloured from
/// `prompt`: an ellipse filling the middle ~60 % of the frame, striped like
/// [`placeholder_png`], on a light background of one colour. The demo provider draws these, so
/// its images can be cut out (its cutout removes a plain background) and edited visibly.
pub fn product_png(prompt: &str, size: u32) -> Vec<u8> {
    let digest = Sha256::digest(prompt.as_bytes());
    let (a, b) = ([digest[0], digest[1], digest[2]], [digest[3], digest[4], digest[5]]);
    // A light background: the second colour most of the way to white.
    let bg = b.map(|c| 255 - (255 - c) / 6);
    let size = size.clamp(1, 1024);
    let (c, r) = (size as f32 / 2.0, size as f32 * 0.3);
    let mut pixels = Vec::with_capacity((size * size * 3) as usize);
    for y in 0..size {
        for x in 0..size {
            let (dx, dy) = ((x as f32 + 0.5 - c) / r, (y as f32 + 0.5 - c) / (r * 1.25));
            if dx * dx + dy * dy <= 1.0 {
                let t = (x + y) as f32 / (2 * size) as f32;
                let stripe = if (x / 16 + y / 16) % 2 == 0 { 1.0 } else { 0.85 };
                // Dark enough to stand out from the light background.
                for ch in 0..3 {
                    let v = (a[ch] as f32 * (1.0 - t) + b[ch] as f32 * t) * stripe * 0.7;
                    pixels.push(v as u8);
                }
            } else {
                pixels.extend_from_slice(&bg);
            }
        }
    }
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, size, size);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let ok = encoder.write_header().and_then(|mut w| w.write_image_data(&pixels).and_then(|_| w.finish()));
    if ok.is_err() {
        return Vec::new();
    }
    out
}

/// A `width`×`height` RGB PNG that compresses like a photograph: a smooth gradient with
/// `noise_bits` of deterministic noise in every channel (xorshift from `seed`). The benchmark
/// uses it as a realistic large image (896×896 with 4 noise bits is about 1.5 MB).
pub fn photo_like_png(width: u32, height: u32, noise_bits: u32, seed: u64) -> Vec<u8> {
    let (width, height) = (width.clamp(1, 8192), height.clamp(1, 8192));
    let mask = (1u32 << noise_bits.min(8)) - 1;
    let mut x = seed | 1;
    let mut pixels = Vec::with_capacity((width * height * 3) as usize);
    for row in 0..height {
        for col in 0..width {
            for c in 0..3u32 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let base = row * (60 + 40 * c) / height + col * (90 - 20 * c) / width + 40 * c;
                pixels.push(((base & !mask) | (x as u32 & mask)).min(255) as u8);
            }
        }
    }
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let ok = encoder.write_header().and_then(|mut w| w.write_image_data(&pixels).and_then(|_| w.finish()));
    if ok.is_err() {
        return Vec::new();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_png_deterministically() {
        let a = placeholder_png("red sneaker", 32);
        assert!(a.starts_with(b"\x89PNG\r\n\x1a\n"));
        assert_eq!(a, placeholder_png("red sneaker", 32));
        assert_ne!(a, placeholder_png("blue sneaker", 32));
    }

    #[test]
    fn a_photo_like_png_is_about_one_and_a_half_megabytes() {
        let png = photo_like_png(896, 896, 4, 7);
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
        assert!((1_200_000..1_900_000).contains(&png.len()), "{} bytes", png.len());
        assert_eq!(png, photo_like_png(896, 896, 4, 7), "deterministic");
    }
}
