//! Delivery profiles: what file a marketplace wants made from a chosen image (pixel size, fit,
//! background, format, byte limit, file-name pattern), the built-in ones, and the checks a
//! configured one must pass. Making the file is [`super::render`]; naming it is
//! [`super::names`].
//!
//! A profile is plain data, validated once when it is built ([`Profile::custom`]): the
//! renderer and the namer trust it. The built-ins are [`builtins`]; `original` delivers the
//! bytes as generated, untouched.

use std::fmt;

/// The default `file_name` pattern: the product, the shot's role, its number in the set and
/// the profile, so two shots with the same role never share a name.
pub const DEFAULT_FILE_NAME: &str = "{product}_{role}_{index}_{profile}.{ext}";

/// The JPEG quality used when a profile gives none.
pub const DEFAULT_QUALITY: u8 = 85;

/// The lowest JPEG quality the renderer steps down to when meeting `max_bytes`; below this a
/// product photo shows visible blocks, so a file that still does not fit is refused instead.
pub const MIN_QUALITY: u8 = 40;

/// The largest `width`/`height` a profile may ask for (keeps one render's memory bounded:
/// 10000×10000 RGBA is 400 MB).
pub const MAX_SIDE: u32 = 10_000;

/// The name of the built-in profile that delivers the bytes as generated.
pub const ORIGINAL: &str = "original";

/// One delivery profile (`[[delivery.profiles]]` or a built-in).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// `name`: what a delivery names (`"profile": "amazon"`).
    pub name: String,
    /// How the file is made; `None` for `original` (the bytes as generated, untouched).
    pub render: Option<Render>,
    /// `max_bytes`: the largest file the marketplace takes; `None`: no limit.
    pub max_bytes: Option<u64>,
    /// `min_source`: the smallest source side (width or height, in pixels) that meets the
    /// profile; a smaller chosen image is reported by [`super::render::check`].
    pub min_source: Option<u32>,
    /// `file_name`: a pattern over `{product}`, `{role}`, `{index}`, `{profile}`, `{ext}`
    /// (see [`super::names`]).
    pub file_name: String,
    /// `background_rule`: what every pixel around the product must be in the file made
    /// (measured on the encoded file by [`super::rules`]); `None`: no rule.
    pub background_rule: Option<BackgroundRule>,
    /// `fill` (0.5–1.0), in thousandths: the product's box must cover at least this share of
    /// the frame's width or height (measured on the file made); `None`: no rule. A `main_white`
    /// shot is composed to meet it (0.85 when the profile has none).
    pub fill: Option<u16>,
    /// `no_alpha`: the file made has no alpha channel (every rendered profile writes opaque
    /// RGB; the rule is checked on the file, so a configured PNG cannot slip one in).
    pub no_alpha: bool,
}

/// `background_rule`: what the frame around the product must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackgroundRule {
    /// `"pure_white"`: every pixel of the file's outer edge, and every pixel clear of the
    /// product's box, is exactly RGB 255,255,255 after encoding.
    PureWhite,
}

impl BackgroundRule {
    /// The name as the config writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            BackgroundRule::PureWhite => "pure_white",
        }
    }
}

/// The share of the frame a `main_white` shot's product is composed to fill when the profile
/// sets no `fill`: Amazon's 85 %, in thousandths.
pub const DEFAULT_FILL: u16 = 850;

/// How a rendered profile makes its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Render {
    /// `width`: the output's width in pixels (exact).
    pub width: u32,
    /// `height`: the output's height in pixels (exact).
    pub height: u32,
    /// `fit`: how the source is brought to `width`×`height`.
    pub fit: Fit,
    /// `background`: the colour of the padding and of any transparency (flattened onto it).
    pub background: Rgb,
    /// `format`: the output's encoding.
    pub format: Format,
    /// `quality` (1–100): the JPEG quality to start at. The renderer steps it down by 5 (to
    /// [`MIN_QUALITY`]) until `max_bytes` is met. PNG and WebP are written lossless here (the
    /// `image` crate's WebP encoder is lossless only), so `quality` does not apply to them and
    /// configuring it with them is an error rather than silently ignored.
    pub quality: u8,
}

/// `fit`: how a source of another shape is brought to the profile's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// `"pad"` (the default): scale to fit inside and fill the rest with `background`; the
    /// product is never cropped.
    Pad,
    /// `"crop"`: scale to cover and cut the overflow equally from both sides.
    Crop,
}

/// `format`: the output's encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Baseline JPEG, lossy, `quality` applies.
    Jpeg,
    /// PNG, lossless, 8-bit RGB.
    Png,
    /// WebP, lossless (see [`Render::quality`]).
    Webp,
}

impl Format {
    /// Parse a `format` value.
    pub fn parse(text: &str) -> Option<Format> {
        match text.trim().to_ascii_lowercase().as_str() {
            "jpeg" | "jpg" => Some(Format::Jpeg),
            "png" => Some(Format::Png),
            "webp" => Some(Format::Webp),
            _ => None,
        }
    }

    /// The file extension (`{ext}`), without the dot.
    pub fn ext(self) -> &'static str {
        match self {
            Format::Jpeg => "jpg",
            Format::Png => "png",
            Format::Webp => "webp",
        }
    }

    /// The media type.
    pub fn media_type(self) -> &'static str {
        match self {
            Format::Jpeg => "image/jpeg",
            Format::Png => "image/png",
            Format::Webp => "image/webp",
        }
    }

    /// The name as the config writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Jpeg => "jpeg",
            Format::Png => "png",
            Format::Webp => "webp",
        }
    }
}

/// An 8-bit sRGB colour (`background = "#ffffff"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rgb(pub [u8; 3]);

impl Rgb {
    /// White, `#ffffff` (the default background).
    pub const WHITE: Rgb = Rgb([255, 255, 255]);

    /// Parse `#rrggbb` or `#rgb` (case-insensitive).
    pub fn parse(text: &str) -> Result<Rgb, String> {
        let bad = || format!("`{text}` is not a colour like \"#ffffff\" (# and 6 or 3 hex digits)");
        let hex = text.trim().strip_prefix('#').ok_or_else(bad)?;
        if !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let digit = |i: usize, n: usize| u8::from_str_radix(&hex[i..i + n], 16).map_err(|_| bad());
        match hex.len() {
            6 => Ok(Rgb([digit(0, 2)?, digit(2, 2)?, digit(4, 2)?])),
            3 => Ok(Rgb([digit(0, 1)? * 17, digit(1, 1)? * 17, digit(2, 1)? * 17])),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for Rgb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{:02x}{:02x}{:02x}", self.0[0], self.0[1], self.0[2])
    }
}

/// The keys of a configured profile before they are checked (what `[[delivery.profiles]]`
/// holds; `None` where the key is absent).
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct ProfileSpec {
    pub name: Option<String>,
    pub width: Option<i64>,
    pub height: Option<i64>,
    pub fit: Option<String>,
    pub background: Option<String>,
    pub format: Option<String>,
    pub quality: Option<i64>,
    pub max_bytes: Option<i64>,
    pub min_source: Option<i64>,
    pub file_name: Option<String>,
    pub background_rule: Option<String>,
    pub fill: Option<f64>,
    pub no_alpha: Option<bool>,
}

/// Why a configured profile is refused: the key and the reason in plain words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("key `{key}`: {reason}")]
#[allow(missing_docs)]
pub struct ProfileError {
    /// The profile's key at fault (`width`, `background`, …).
    pub key: &'static str,
    pub reason: String,
}

impl Profile {
    /// Build and check a configured profile. Refuses: a missing or badly formed name, a name
    /// of a built-in, zero or oversized `width`/`height`, an unknown `fit` or `format`, a bad
    /// `background`, `quality` outside 1–100 or given for a lossless format, a zero
    /// `max_bytes` or `min_source`, and a `file_name` pattern [`super::names::check_pattern`]
    /// refuses.
    pub fn custom(spec: ProfileSpec) -> Result<Profile, ProfileError> {
        let err = |key: &'static str, reason: String| ProfileError { key, reason };
        let name = spec.name.ok_or_else(|| err("name", "is required".into()))?;
        check_name(&name).map_err(|r| err("name", r))?;
        if builtins().iter().any(|b| b.name == name) {
            return Err(err(
                "name",
                format!(
                    "`{name}` is a built-in profile (amazon, shopify, etsy, taobao, original); choose another name"
                ),
            ));
        }
        let side = |key: &'static str, v: Option<i64>| -> Result<u32, ProfileError> {
            match v {
                None => Err(err(key, "is required (the output's pixels)".into())),
                Some(n) if (1..=i64::from(MAX_SIDE)).contains(&n) => Ok(n as u32),
                Some(n) => Err(err(key, format!("{n} must be between 1 and {MAX_SIDE} pixels"))),
            }
        };
        let width = side("width", spec.width)?;
        let height = side("height", spec.height)?;
        let fit = match spec.fit.as_deref().map(str::trim) {
            None | Some("pad") => Fit::Pad,
            Some("crop") => Fit::Crop,
            Some(o) => return Err(err("fit", format!("`{o}` must be \"pad\" or \"crop\""))),
        };
        let background = match spec.background.as_deref() {
            None => Rgb::WHITE,
            Some(t) => Rgb::parse(t).map_err(|r| err("background", r))?,
        };
        let format = match spec.format.as_deref() {
            None => Format::Jpeg,
            Some(t) => {
                Format::parse(t).ok_or_else(|| err("format", format!("`{t}` must be \"jpeg\", \"png\" or \"webp\"")))?
            }
        };
        let quality = match (spec.quality, format) {
            (None, _) => DEFAULT_QUALITY,
            (Some(q), Format::Jpeg) if (1..=100).contains(&q) => q as u8,
            (Some(q), Format::Jpeg) => return Err(err("quality", format!("{q} must be between 1 and 100"))),
            (Some(_), f) => {
                return Err(err(
                    "quality",
                    format!("applies only to jpeg; {} is written lossless here, so leave quality out", f.as_str()),
                ));
            }
        };
        let positive = |key: &'static str, v: Option<i64>| -> Result<Option<i64>, ProfileError> {
            match v {
                None => Ok(None),
                Some(n) if n >= 1 => Ok(Some(n)),
                Some(n) => Err(err(key, format!("{n} must be at least 1"))),
            }
        };
        let max_bytes = positive("max_bytes", spec.max_bytes)?.map(|n| n as u64);
        let min_source = match positive("min_source", spec.min_source)? {
            Some(n) if n > i64::from(u32::MAX) => return Err(err("min_source", format!("{n} is too large"))),
            v => v.map(|n| n as u32),
        };
        let file_name = spec.file_name.unwrap_or_else(|| DEFAULT_FILE_NAME.into());
        super::names::check_pattern(&file_name).map_err(|r| err("file_name", r))?;
        let background_rule = match spec.background_rule.as_deref().map(str::trim) {
            None => None,
            Some("pure_white") if background == Rgb::WHITE => Some(BackgroundRule::PureWhite),
            Some("pure_white") => {
                return Err(err(
                    "background_rule",
                    format!("\"pure_white\" needs background = \"#ffffff\", not \"{background}\""),
                ));
            }
            Some(o) => return Err(err("background_rule", format!("`{o}` must be \"pure_white\""))),
        };
        let fill = match spec.fill {
            None => None,
            Some(f) if (0.5..=1.0).contains(&f) => Some((f * 1000.0).round() as u16),
            Some(f) => return Err(err("fill", format!("{f} must be between 0.5 and 1.0 (a share of the frame)"))),
        };
        Ok(Profile {
            name,
            render: Some(Render { width, height, fit, background, format, quality }),
            max_bytes,
            min_source,
            file_name,
            background_rule,
            fill,
            no_alpha: spec.no_alpha.unwrap_or(false),
        })
    }

    /// Whether this is `original` (the bytes as generated).
    pub fn is_original(&self) -> bool {
        self.render.is_none()
    }
}

/// A profile or target name: 1 to 64 letters, digits, '-', '_' or '.', not starting with '.'.
pub fn check_name(n: &str) -> Result<(), String> {
    if n.is_empty()
        || n.len() > 64
        || n.starts_with('.')
        || !n.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(format!("`{n}` must be 1 to 64 letters, digits, '-', '_' or '.' (not starting with '.')"));
    }
    Ok(())
}

/// A built-in rendered profile: white padding, JPEG (every marketplace below takes JPEG and
/// it keeps photos small), no alpha, the default file-name pattern.
fn marketplace(name: &str, width: u32, height: u32, quality: u8, max_bytes: u64, min_source: Option<u32>) -> Profile {
    Profile {
        name: name.into(),
        render: Some(Render { width, height, fit: Fit::Pad, background: Rgb::WHITE, format: Format::Jpeg, quality }),
        max_bytes: Some(max_bytes),
        min_source,
        file_name: DEFAULT_FILE_NAME.into(),
        background_rule: None,
        fill: None,
        no_alpha: true,
    }
}

/// A built-in main image on pure white: [`marketplace`] with `background_rule = "pure_white"`
/// and `fill` (thousandths).
fn white_main(name: &str, width: u32, height: u32, max_bytes: u64, min_source: Option<u32>, fill: u16) -> Profile {
    Profile {
        background_rule: Some(BackgroundRule::PureWhite),
        fill: Some(fill),
        ..marketplace(name, width, height, 90, max_bytes, min_source)
    }
}

/// The built-in profiles, in the order the page lists them: `amazon`, `shopify`, `etsy`,
/// `taobao`, the marketplaces' own (`amazon_main`, `taobao_main`, `taobao_main_3x4`,
/// `taobao_white`, `tmall_main`, `jd_main`, `pinduoduo_carousel`), `original`. Each
/// marketplace's numbers come from its published image
/// requirements, cited next to them; all pad with white (never cropping the product) and write
/// an 8-bit sRGB JPEG without metadata.
pub fn builtins() -> Vec<Profile> {
    vec![
        // amazon (main image). Amazon Seller Central, "Product image requirements"
        // (https://sellercentral.amazon.com/help/hub/reference/external/G1881): the MAIN image
        // on pure white (RGB 255,255,255); at least 1000 px on the longest side for zoom (1600+
        // recommended, 10000 max); JPEG preferred (also TIFF, PNG, GIF); sRGB or CMYK; files
        // up to 10 MB. Square is recommended. So: 2000×2000 JPEG on white, quality 90, at most
        // 10 MB, a source of at least 1000 px. (Checked through the `search` tool against
        // summaries quoting that page, e.g. mercatuslab.com/blog/amazon-product-image-requirements
        // and changethisfile.com/blog/convert-images-for-amazon-seller-central.)
        marketplace("amazon", 2000, 2000, 90, 10_000_000, Some(1000)),
        // shopify. Shopify's product media guide
        // (https://shopify.dev/docs/apps/build/online-store/product-media, also
        // help.shopify.com/api/guides/media): images in PNG, GIF or JPG, at most 4472×4472 px
        // or 20 megapixels; "for square images, 2048 x 2048 px" is recommended; files up to
        // 20 MB (help.shopify.com, "Product media types"). No minimum is published, so no
        // min_source. So: 2048×2048 JPEG on white, quality 85, at most 20 MB.
        marketplace("shopify", 2048, 2048, 85, 20_000_000, None),
        // etsy. Etsy Help, "How to add photos to your listing"
        // (https://help.etsy.com/hc/en-us/articles/115015663347): the recommended listing
        // image is 3000×2250 px (4:3), at least 2000 px on the shortest side recommended;
        // photos from 635 px wide are accepted; JPG, PNG or GIF; up to 10 MB per photo. The
        // help page itself was not reachable from here; the numbers were checked against
        // summaries quoting it (hauld.app/blog/etsy-listing-photo-checklist,
        // dev.to/herofab "Check product photos against Amazon, Etsy…"). So: 3000×2250 JPEG on
        // white (the product padded, never cropped; Etsy's square thumbnails crop the sides,
        // where the padding is), quality 85, at most 10 MB, a source of at least 635 px.
        marketplace("etsy", 3000, 2250, 85, 10_000_000, Some(635)),
        // taobao (main image, 主图). Taobao's seller rules for item main pictures (淘宝规则,
        // 商品主图 / 白底图 requirements, https://rule.taobao.com and the 千牛 publishing
        // page's notes): square, 800×800 px recommended, pictures of 700×700 px or more get the
        // zoom (放大镜) on the item page; the white-background main picture (白底图) is 800×800 on
        // pure white; at most 3 MB; JPG or PNG. The `search` tool found no copy of those pages,
        // so these numbers are from the rules as published, not re-checked here. So: 800×800
        // JPEG on white, quality 90, at most 3 MB (3000000 bytes, under either reading of
        // "3M"), a source of at least 700 px.
        marketplace("taobao", 800, 800, 90, 3_000_000, Some(700)),
        // The marketplaces' own names for the shop's images (issue #37), from the market audit
        // (`market-2026-12.md`, its sources named there):
        // amazon_main: the MAIN image, as `amazon` (≥ 1000 px, JPEG, ≤ 10 MB), with its two
        // rules checked on the file: pure white (RGB 255,255,255) around the product, and the
        // product filling at least 85 % of the frame (Seller Central G1881).
        white_main("amazon_main", 2000, 2000, 10_000_000, Some(1000), 850),
        // taobao_main: as `taobao` (800×800, ≤ 3 MB, zoom from 700 px).
        marketplace("taobao_main", 800, 800, 90, 3_000_000, Some(700)),
        // taobao_main_3x4: the 3:4 main image (`is_rectangle` in `taobao.item.img.upload`, JPG or
        // PNG ≤ 3 MB); 1200×1600 as ProductFlow's preset for Taobao/Tmall.
        marketplace("taobao_main_3x4", 1200, 1600, 90, 3_000_000, Some(750)),
        // taobao_white: the white-background main picture (白底图): 800×800 JPG on white, 38–300 KB
        // (the lower bound is not enforced: a smaller file is not refused), a subject ≥ 300 px.
        // The official page was not found; the numbers are from copies of a 开淘 tutorial.
        // The white is checked on the file (pure white); the subject's share is not a published
        // number, so no `fill` rule (a `main_white` shot is still composed at 85 %).
        Profile { fill: None, ..white_main("taobao_white", 800, 800, 300_000, Some(300), 850) },
        // tmall_main: Tmall takes Taobao's main-image rules (the same upload API).
        marketplace("tmall_main", 800, 800, 90, 3_000_000, Some(700)),
        // jd_main: JD's rules were not found; 1:1 1200×1200 as ProductFlow's preset, ≤ 3 MB as
        // Taobao's, so the file is within what the neighbouring marketplaces take.
        marketplace("jd_main", 1200, 1200, 90, 3_000_000, Some(800)),
        // pinduoduo_carousel: `carousel_gallery` of `pdd.goods.add`: JPEG/PNG, 1:1, ≥ 480 px,
        // ≤ 1 MB.
        marketplace("pinduoduo_carousel", 800, 800, 85, 1_000_000, Some(480)),
        // original: the bytes exactly as the provider returned them (format, size, metadata).
        Profile {
            name: ORIGINAL.into(),
            render: None,
            max_bytes: None,
            min_source: None,
            file_name: DEFAULT_FILE_NAME.into(),
            background_rule: None,
            fill: None,
            no_alpha: false,
        },
    ]
}

/// The built-in profile called `name`, if there is one.
pub fn builtin(name: &str) -> Option<Profile> {
    builtins().into_iter().find(|p| p.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str) -> ProfileSpec {
        ProfileSpec { name: Some(name.into()), width: Some(600), height: Some(800), ..ProfileSpec::default() }
    }

    #[test]
    fn colours_parse_and_print() {
        assert_eq!(Rgb::parse("#ffffff"), Ok(Rgb::WHITE));
        assert_eq!(Rgb::parse("#FfA000"), Ok(Rgb([255, 160, 0])));
        assert_eq!(Rgb::parse("#0f0"), Ok(Rgb([0, 255, 0])));
        assert_eq!(Rgb([1, 2, 255]).to_string(), "#0102ff");
        for bad in ["ffffff", "#fffff", "#gggggg", "#ffffff00", "", "#", "white", "#ff ff ff", "#+f+f+f"] {
            let e = Rgb::parse(bad).expect_err(bad);
            assert!(e.contains("is not a colour"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_custom_profile_gets_defaults() {
        let p = Profile::custom(spec("tall600")).expect("valid");
        let r = p.render.expect("rendered");
        assert_eq!(
            (r.width, r.height, r.fit, r.background, r.format, r.quality),
            (600, 800, Fit::Pad, Rgb::WHITE, Format::Jpeg, DEFAULT_QUALITY)
        );
        assert_eq!(p.file_name, DEFAULT_FILE_NAME);
        assert_eq!((p.max_bytes, p.min_source), (None, None));
    }

    #[test]
    fn bad_custom_profiles_say_which_key_and_why() {
        let cases: Vec<(ProfileSpec, &str, &str)> = vec![
            (ProfileSpec { width: Some(0), ..spec("a") }, "width", "between 1 and"),
            (ProfileSpec { height: None, ..spec("a") }, "height", "is required"),
            (ProfileSpec { width: Some(20_000), ..spec("a") }, "width", "between 1 and"),
            (ProfileSpec { fit: Some("stretch".into()), ..spec("a") }, "fit", "\"pad\" or \"crop\""),
            (ProfileSpec { background: Some("white".into()), ..spec("a") }, "background", "not a colour"),
            (ProfileSpec { format: Some("gif".into()), ..spec("a") }, "format", "\"jpeg\", \"png\" or \"webp\""),
            (ProfileSpec { quality: Some(0), ..spec("a") }, "quality", "between 1 and 100"),
            (
                ProfileSpec { format: Some("webp".into()), quality: Some(80), ..spec("a") },
                "quality",
                "webp is written lossless",
            ),
            (ProfileSpec { max_bytes: Some(0), ..spec("a") }, "max_bytes", "at least 1"),
            (ProfileSpec { min_source: Some(-5), ..spec("a") }, "min_source", "at least 1"),
            (ProfileSpec { file_name: Some("{product}/{role}.{ext}".into()), ..spec("a") }, "file_name", "/"),
            (spec("amazon"), "name", "built-in"),
            (spec("original"), "name", "built-in"),
            (spec("has space"), "name", "letters, digits"),
            (ProfileSpec { name: None, ..spec("a") }, "name", "required"),
        ];
        for (s, key, words) in cases {
            let e = Profile::custom(s.clone()).expect_err(&format!("{s:?}"));
            assert_eq!(e.key, key, "{s:?}: {e}");
            assert!(e.reason.contains(words), "{s:?}: {e}");
        }
    }

    #[test]
    fn builtins_are_the_issue_s_five_and_well_formed() {
        let names: Vec<String> = builtins().into_iter().map(|p| p.name).collect();
        assert_eq!(
            names,
            [
                "amazon",
                "shopify",
                "etsy",
                "taobao",
                "amazon_main",
                "taobao_main",
                "taobao_main_3x4",
                "taobao_white",
                "tmall_main",
                "jd_main",
                "pinduoduo_carousel",
                "original"
            ]
        );
        let rule = |n: &str| builtin(n).map(|p| (p.render.map(|r| (r.width, r.height)), p.max_bytes, p.min_source));
        assert_eq!(rule("pinduoduo_carousel"), Some((Some((800, 800)), Some(1_000_000), Some(480))), "1:1, ≤ 1 MB");
        assert_eq!(rule("taobao_main_3x4"), Some((Some((1200, 1600)), Some(3_000_000), Some(750))), "3:4");
        assert_eq!(rule("taobao_white").and_then(|r| r.1), Some(300_000), "≤ 300 KB");
        for p in builtins() {
            super::super::names::check_pattern(&p.file_name).expect("pattern");
            if let Some(r) = p.render {
                assert_eq!((r.fit, r.background, r.format), (Fit::Pad, Rgb::WHITE, Format::Jpeg), "{}", p.name);
                assert!(p.max_bytes.is_some(), "{}", p.name);
            }
        }
        assert!(builtin("original").expect("there").is_original());
        assert!(builtin("nope").is_none());
    }
}
