//! One budget for image work in the whole daemon: every decode of an image's pixels
//! (thumbnails, profile checks, renders for zips and deliveries, the demo provider's edits and
//! cutouts) goes through [`decode`], which reads the image's size from its header first,
//! works out how much memory the whole piece of work will take at its peak (from its [`Size`]), and
//! only then allocates, under a ticket from the daemon's budget.
//!
//! Invariants kept here:
//! - The bytes held by live [`Ticket`]s never exceed the budget ([`configure`]; 384 MiB unless
//!   `[engine] image_memory_mb` says otherwise), and at most [`Budget::parallel`] tickets are
//!   live at once. A piece of work that needs more than the whole budget is refused with the
//!   reason before any pixel buffer is allocated; one that fits waits (on a blocking thread)
//!   until enough is free.
//! - A caller holds at most one ticket at a time (a second `decode` while holding one could wait
//!   for itself); each caller's doc says so where it decodes.
//! - Metadata a decoder inflates (a PNG's ICC profile or text) is bounded by
//!   [`METADATA_BYTES`], whatever the file says.
//!
//! The estimate is the caller's: each says, from the header's [`Size`], the most its work holds
//! at once (the decoder's buffer, an RGBA copy, a flattened RGB copy, a scaler's intermediate,
//! the output), erring high. The ceiling this gives for the whole daemon is documented in ARCHITECTURE.md
//! ("Memory") and tested by `tests/it/memory.rs` under a 1 GiB address-space limit.

use std::io::Cursor;
use std::sync::{Condvar, Mutex, OnceLock};

use image::{DynamicImage, ImageDecoder, ImageFormat};

/// The budget unless configured: 384 MiB of decoded pixels in flight.
pub const DEFAULT_BYTES: u64 = 384 * 1024 * 1024;
/// The largest image side decoded at all.
pub const MAX_SIDE: u32 = 16_384;
/// The most a decoder may allocate for an image's metadata (ICC profile, text chunks).
pub const METADATA_BYTES: u64 = 16 * 1024 * 1024;
/// How many decodes may hold pixels at once (the machine's cores are for the engine first).
const PARALLEL: usize = 2;

/// The daemon's image budget: bytes and decodes in flight.
pub struct Budget {
    limit: u64,
    parallel: usize,
    state: Mutex<InFlight>,
    freed: Condvar,
    /// Gives kept data back ([`Budget::set_reclaimer`]).
    reclaim: OnceLock<fn()>,
}

#[derive(Default)]
struct InFlight {
    bytes: u64,
    tickets: usize,
    /// The part of `bytes` held by [`Hold`]s.
    held: u64,
}

impl Budget {
    /// A budget of `limit` bytes and `parallel` decodes at once.
    pub fn new(limit: u64, parallel: usize) -> Budget {
        Budget {
            limit,
            parallel: parallel.max(1),
            state: Mutex::default(),
            freed: Condvar::new(),
            reclaim: OnceLock::new(),
        }
    }

    /// The budget in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// How many decodes may hold pixels at once.
    pub fn parallel(&self) -> usize {
        self.parallel
    }

    /// The bytes held by live tickets now.
    pub fn in_flight(&self) -> u64 {
        self.state.lock().map(|s| s.bytes).unwrap_or(0)
    }

    /// A ticket for `bytes`, waiting (blocking this thread) until they are free; `Err` with the
    /// reason when `bytes` is more than the whole budget (waiting would never end).
    pub fn admit(&self, bytes: u64) -> Result<Ticket<'_>, Refused> {
        if bytes > self.limit {
            return Err(Refused { need: bytes, limit: self.limit });
        }
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut reclaimed = false;
        while s.tickets >= self.parallel || s.bytes + bytes > self.limit {
            // Kept data gives way to a decode that needs its bytes (once per admit; the
            // reclaimer is called without the lock, since dropping a hold takes it).
            if !reclaimed
                && s.held > 0
                && s.bytes + bytes > self.limit
                && let Some(reclaim) = self.reclaim.get()
            {
                reclaimed = true;
                drop(s);
                reclaim();
                s = self.state.lock().unwrap_or_else(|p| p.into_inner());
                continue;
            }
            s = self.freed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.bytes += bytes;
        s.tickets += 1;
        Ok(Ticket { budget: self, bytes })
    }
}

impl Budget {
    /// Hold `bytes` of the budget for data kept between two pieces of work (the files a
    /// delivery's check rendered, kept for its render: `delivery::kept`), at once or not at
    /// all: `None` when they are not free now. A hold never waits and takes no decode's place
    /// (it does not count towards [`Budget::parallel`]). A decode that needs its bytes first
    /// asks the [`Budget::set_reclaimer`]'s function to give holds back, then waits.
    pub fn try_hold(&self, bytes: u64) -> Option<Hold<'_>> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.bytes.saturating_add(bytes) > self.limit {
            return None;
        }
        s.bytes += bytes;
        s.held += bytes;
        Some(Hold { budget: self, bytes })
    }
}

impl Budget {
    /// Name the function that gives kept data (its [`Hold`]s) back to this budget when a
    /// decode must otherwise wait for bytes (set once; `delivery::kept` sets the daemon's the
    /// first time it keeps a file).
    pub fn set_reclaimer(&self, reclaim: fn()) {
        let _ = self.reclaim.set(reclaim);
    }
}

/// Bytes of the budget held by kept data ([`Budget::try_hold`]); given back on drop.
#[must_use = "the bytes are given back when the hold is dropped"]
pub struct Hold<'a> {
    budget: &'a Budget,
    bytes: u64,
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        let mut s = self.budget.state.lock().unwrap_or_else(|p| p.into_inner());
        s.bytes -= self.bytes;
        s.held -= self.bytes;
        drop(s);
        self.budget.freed.notify_all();
    }
}

/// Bytes of the budget held while pixels are alive; given back on drop.
#[must_use = "the bytes are given back when the ticket is dropped"]
pub struct Ticket<'a> {
    budget: &'a Budget,
    bytes: u64,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let mut s = self.budget.state.lock().unwrap_or_else(|p| p.into_inner());
        s.bytes -= self.bytes;
        s.tickets -= 1;
        drop(s);
        self.budget.freed.notify_all();
    }
}

/// A piece of image work larger than the whole budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    /// What it would take, in bytes.
    pub need: u64,
    /// The whole budget, in bytes.
    pub limit: u64,
}

/// The daemon's budget: [`configure`]d at start-up, else [`DEFAULT_BYTES`].
pub fn budget() -> &'static Budget {
    BUDGET.get_or_init(|| Budget::new(DEFAULT_BYTES, PARALLEL))
}

static BUDGET: OnceLock<Budget> = OnceLock::new();

/// Set the daemon's budget to `bytes` (once, at start-up, before any image work; a later call
/// changes nothing and says so).
pub fn configure(bytes: u64) -> bool {
    BUDGET.set(Budget::new(bytes, PARALLEL)).is_ok()
}

/// An image's size as its header gives it, before any pixel is decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Size {
    /// Width and height as stored (before the EXIF orientation).
    pub width: u32,
    pub height: u32,
    /// The decoder's own buffer for all its pixels, in bytes.
    pub decoded: u64,
}

impl Size {
    /// Width × height.
    pub fn pixels(&self) -> u64 {
        u64::from(self.width) * u64::from(self.height)
    }
}

/// The peak of a piece of work that keeps the decoder's buffer and `per_pixel` more bytes per
/// source pixel alive together, plus `fixed` bytes.
pub fn decoded_plus(per_pixel: u64, fixed: u64) -> impl Fn(Size) -> u64 {
    move |s: Size| s.decoded.saturating_add(s.pixels().saturating_mul(per_pixel)).saturating_add(fixed)
}

/// A decoded image and the ticket that pays for it; the pixels must not outlive the ticket
/// (drop the image first, or both together).
pub struct Decoded {
    /// The pixels as the file stores them (not yet oriented or converted).
    pub image: DynamicImage,
    /// The embedded ICC profile, if any (bounded by [`METADATA_BYTES`]).
    pub icc: Option<Vec<u8>>,
    /// The EXIF orientation (upright when absent or unreadable).
    pub orientation: image::metadata::Orientation,
    /// The budget's bytes for this work.
    pub ticket: Ticket<'static>,
}

/// Why an image was not decoded, in words for the owner.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[allow(missing_docs)]
pub enum DecodeError {
    /// Not a PNG, JPEG or WebP, damaged, or over [`MAX_SIDE`].
    #[error("{0}")]
    Unreadable(String),
    /// Decoding it (and the work after) would take more memory than the daemon's budget.
    #[error(
        "it is {width}×{height} px ({megapixels} megapixels), too large to work on: that would take about {need_mb} MB of memory and tally keeps image work within {limit_mb} MB (`[engine] image_memory_mb`)"
    )]
    TooLarge { width: u32, height: u32, megapixels: u64, need_mb: u64, limit_mb: u64 },
}

/// The format of `source` if it is one tally decodes (PNG, JPEG or WebP).
fn reader(source: &[u8]) -> Result<image::ImageReader<Cursor<&[u8]>>, DecodeError> {
    let mut reader = image::ImageReader::new(Cursor::new(source))
        .with_guessed_format()
        .map_err(|e| DecodeError::Unreadable(e.to_string()))?;
    if !matches!(reader.format(), Some(ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP)) {
        return Err(DecodeError::Unreadable("it is not a PNG, JPEG or WebP image".into()));
    }
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    // Passed on to the PNG decoder as its bound for what it allocates itself (ICC, text); the
    // pixel buffer is paid for by the ticket, not by this.
    limits.max_alloc = Some(METADATA_BYTES);
    reader.limits(limits);
    Ok(reader)
}

/// Decode `source` under the daemon's budget: the header is read first, `peak` says how many
/// bytes the whole piece of work holds at once at most for an image of that [`Size`], and
/// the pixels are decoded only once a ticket for that (plus [`METADATA_BYTES`]) is held,
/// waiting for one on this thread: call from a blocking thread.
pub fn decode(source: &[u8], peak: impl Fn(Size) -> u64) -> Result<Decoded, DecodeError> {
    decode_in(budget(), source, peak)
}

/// [`decode`] against a given budget (tests use their own).
pub fn decode_in(budget: &'static Budget, source: &[u8], peak: impl Fn(Size) -> u64) -> Result<Decoded, DecodeError> {
    let mut decoder = reader(source)?.into_decoder().map_err(|e| DecodeError::Unreadable(e.to_string()))?;
    let (w, h) = decoder.dimensions();
    let size = Size { width: w, height: h, decoded: decoder.total_bytes() };
    let pixels = size.pixels();
    let bytes = peak(size).max(size.decoded).saturating_add(METADATA_BYTES);
    let ticket = budget.admit(bytes).map_err(|r| DecodeError::TooLarge {
        width: w,
        height: h,
        megapixels: pixels.div_ceil(1_000_000),
        need_mb: r.need.div_ceil(1_000_000),
        limit_mb: r.limit / 1_000_000,
    })?;
    // A profile that cannot be read or an orientation that cannot be parsed is not worth
    // refusing the image for: the pixels are then taken as sRGB and upright.
    let icc = decoder.icc_profile().ok().flatten();
    let orientation = decoder.orientation().unwrap_or(image::metadata::Orientation::NoTransforms);
    let image = DynamicImage::from_decoder(decoder).map_err(|e| DecodeError::Unreadable(e.to_string()))?;
    Ok(Decoded { image, icc, orientation, ticket })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(w: u32, h: u32) -> Vec<u8> {
        let mut out = Vec::new();
        image::RgbImage::new(w, h).write_to(&mut Cursor::new(&mut out), ImageFormat::Png).expect("png");
        out
    }

    fn leak(b: Budget) -> &'static Budget {
        Box::leak(Box::new(b))
    }

    #[test]
    fn work_larger_than_the_whole_budget_is_refused_with_its_size() {
        let b = leak(Budget::new(METADATA_BYTES + 1_000_000, 2));
        let Err(e) = decode_in(b, &png(2000, 1000), decoded_plus(7, 0)) else {
            panic!("a 2 MP image with 10 bytes per pixel fits no 17 MB budget");
        };
        assert!(matches!(e, DecodeError::TooLarge { width: 2000, height: 1000, megapixels: 2, .. }), "{e:?}");
        assert!(e.to_string().contains("2000×1000 px"), "{e}");
        assert_eq!(b.in_flight(), 0);
    }

    #[test]
    fn a_hold_takes_bytes_at_once_or_not_at_all_and_gives_them_back() {
        let b = leak(Budget::new(1000, 1));
        let hold = b.try_hold(600).expect("free");
        assert_eq!(b.in_flight(), 600);
        assert!(b.try_hold(401).is_none(), "over the budget: not held, not waited for");
        let ticket = b.admit(400).expect("a hold takes no decode's place");
        drop((hold, ticket));
        assert_eq!(b.in_flight(), 0);
    }

    #[test]
    fn a_decode_that_needs_held_bytes_has_the_reclaimer_give_them_back() {
        static HELD: Mutex<Vec<Hold<'static>>> = Mutex::new(Vec::new());
        let b = leak(Budget::new(1000, 2));
        HELD.lock().expect("lock").push(b.try_hold(500).expect("free"));
        b.set_reclaimer(|| HELD.lock().map(|mut h| h.clear()).unwrap_or(()));
        let t = b.admit(800).expect("the hold gave way instead of a wait for ever");
        assert_eq!(b.in_flight(), 800);
        drop(t);
    }

    #[test]
    fn a_ticket_is_given_back_when_dropped() {
        let b = leak(Budget::new(DEFAULT_BYTES, 2));
        let d = decode_in(b, &png(10, 10), decoded_plus(0, 0)).expect("decodes");
        assert_eq!(b.in_flight(), 300 + METADATA_BYTES);
        drop(d);
        assert_eq!(b.in_flight(), 0);
    }

    #[test]
    fn a_decode_waits_until_enough_is_free() {
        let b = leak(Budget::new(100, 4));
        let first = b.admit(80).expect("fits");
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let t = b.admit(50).expect("fits once the first is back");
            tx.send(b.in_flight()).expect("send");
            drop(t);
        });
        // The waiter cannot be admitted while 80 of 100 are held: nothing arrives until then.
        assert!(rx.recv_timeout(std::time::Duration::from_millis(200)).is_err());
        drop(first);
        assert_eq!(rx.recv().expect("admitted after the drop"), 50);
        waiter.join().expect("join");
    }

    #[test]
    fn at_most_parallel_tickets_are_live() {
        let b = leak(Budget::new(1000, 1));
        let first = b.admit(1).expect("fits");
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let _t = b.admit(1).expect("fits");
            tx.send(()).expect("send");
        });
        assert!(rx.recv_timeout(std::time::Duration::from_millis(200)).is_err(), "a second ticket while one is live");
        drop(first);
        rx.recv().expect("admitted after the drop");
        waiter.join().expect("join");
    }

    #[test]
    fn something_that_is_not_an_image_is_unreadable() {
        assert!(matches!(decode(b"GIF89a....", decoded_plus(0, 0)), Err(DecodeError::Unreadable(_))));
    }
}
