//! Operation kinds: what one paid call makes. Every rule of the protocol (outbox, lease and
//! execution token, `calling` before the request leaves, fenced finishes, `unknown` when nothing
//! proves what happened, budgets, the spend ledger) is about the call, not about what it makes,
//! so an operation kind only declares, once, here:
//!
//! - its inputs and how they are checked before anything is recorded or sent
//!   ([`OperationSpec::prompt`], [`OperationSpec::image`]);
//! - its result and how it is verified before the finish commits it ([`ResultKind`]);
//! - its price model ([`PriceModel`]).
//!
//! Which providers offer it is the provider kind's declaration (`providers::kinds`), narrowed
//! by a provider's `operations` key. Adding an operation kind is a row of [`SPECS`], a variant
//! of [`Operation`], the adapters that offer it and its words in the catalogue.

use serde::{Deserialize, Serialize};

/// One kind of paid call. Its names in the API are the variants' in snake case (checked
/// against [`SPECS`] by a unit test).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    /// A prompt (and the set's reference photos) → one image. The default.
    #[default]
    Generate,
    /// An image and an instruction (`prompt`) → one image made from it.
    Edit,
    /// An image → the same image with its background removed (a PNG with alpha).
    Cutout,
    /// A product's photos and facts → a plan of shots and listing copy (`domain::draft`): JSON
    /// validated against tally's schema, never an action. The photos travel as the call's
    /// references; the prompt is the drafting instructions with the owner's input as data.
    Draft,
}

/// Whether an operation takes a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptRule {
    /// Not blank.
    Required,
    /// Must be absent or blank: the operation has nothing to say to the model.
    None,
}

/// What an operation's answer must be before its finish may commit it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum ResultKind {
    /// An image tally can store (PNG, JPEG or WebP by its bytes); its sha256 is recorded with
    /// it. `alpha`: the image must be a PNG whose colour type carries transparency.
    Image { alpha: bool },
    /// A JSON answer (`domain::draft::Answer`): the model's text and its usage, validated
    /// against the draft schema before the finish commits it; stored in `answers`.
    Json,
}

/// How an operation is priced, from the provider's configured prices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PriceModel {
    /// The provider's `price_per_size` for the size sent, else `price_per_image`: one image
    /// per call.
    PerImage,
    /// The provider's `price_per_million_input_tokens` and `price_per_million_output_tokens`:
    /// estimated before the call with `max_output_tokens` as the ceiling of the answer, and
    /// recorded from the answer's `usage` when it arrives.
    PerToken,
}

/// An operation kind's declaration.
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct OperationSpec {
    pub op: Operation,
    /// Its name in the API, the CLI, the config and the database.
    pub name: &'static str,
    pub prompt: PromptRule,
    /// Whether it needs a source image (`image` in the API).
    pub image: bool,
    pub result: ResultKind,
    pub price: PriceModel,
}

/// Every operation kind, once.
pub const SPECS: &[OperationSpec] = &[
    OperationSpec {
        op: Operation::Generate,
        name: "generate",
        prompt: PromptRule::Required,
        image: false,
        result: ResultKind::Image { alpha: false },
        price: PriceModel::PerImage,
    },
    OperationSpec {
        op: Operation::Edit,
        name: "edit",
        prompt: PromptRule::Required,
        image: true,
        result: ResultKind::Image { alpha: false },
        price: PriceModel::PerImage,
    },
    OperationSpec {
        op: Operation::Cutout,
        name: "cutout",
        prompt: PromptRule::None,
        image: true,
        result: ResultKind::Image { alpha: true },
        price: PriceModel::PerImage,
    },
    OperationSpec {
        op: Operation::Draft,
        name: "draft",
        prompt: PromptRule::Required,
        image: false,
        result: ResultKind::Json,
        price: PriceModel::PerToken,
    },
];

impl Operation {
    /// This kind's declaration.
    pub fn spec(self) -> &'static OperationSpec {
        // SPECS has one row per variant, in variant order (checked by a unit test).
        &SPECS[self as usize]
    }

    /// Its name in the API, CLI, config and database.
    pub fn as_str(self) -> &'static str {
        self.spec().name
    }

    /// The operation named `s`, if tally has one by that name.
    pub fn parse(s: &str) -> Option<Operation> {
        SPECS.iter().find(|o| o.name == s).map(|o| o.op)
    }

    /// Every operation's name, for error messages and the OpenAPI document.
    pub fn names() -> Vec<&'static str> {
        SPECS.iter().map(|o| o.name).collect()
    }
}

/// Where the image an edit or cutout works on is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// An image a task made (`artifacts`).
    Artifact,
    /// A photo the owner uploaded (`uploads`).
    Upload,
}

impl SourceKind {
    /// Its name in the database and the API (`{"artifact": ID}`, `{"upload": ID}`).
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Artifact => "artifact",
            SourceKind::Upload => "upload",
        }
    }

    /// The kind named `s`.
    pub fn parse(s: &str) -> Option<SourceKind> {
        match s {
            "artifact" => Some(SourceKind::Artifact),
            "upload" => Some(SourceKind::Upload),
            _ => None,
        }
    }
}

/// The stored image an operation works on. Its bytes are the blob with the same id. Shown as
/// `{"artifact": ID}` or `{"upload": ID}`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Source {
    pub kind: SourceKind,
    pub id: String,
}

impl Serialize for Source {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(1))?;
        m.serialize_entry(self.kind.as_str(), &self.id)?;
        m.end()
    }
}

impl Source {
    /// `{"artifact": ID}` or `{"upload": ID}`, as the API shows it.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ self.kind.as_str(): self.id })
    }
}

/// Whether `bytes` is a PNG whose colour type carries transparency (grey+alpha, RGBA, or a
/// `tRNS` chunk before the image data): what a cutout's answer must be.
pub fn png_has_alpha(bytes: &[u8]) -> bool {
    const SIG: &[u8] = b"\x89PNG\r\n\x1a\n";
    if bytes.len() < 33 || !bytes.starts_with(SIG) || &bytes[12..16] != b"IHDR" {
        return false;
    }
    if matches!(bytes[25], 4 | 6) {
        return true;
    }
    // Walk the chunks up to the first IDAT looking for tRNS.
    let mut at = 8;
    while at + 8 <= bytes.len() {
        let len = u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]) as usize;
        let kind = &bytes[at + 4..at + 8];
        if kind == b"tRNS" {
            return true;
        }
        if kind == b"IDAT" {
            return false;
        }
        at = at.saturating_add(12).saturating_add(len);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_spec_per_variant_in_order() {
        for (i, s) in SPECS.iter().enumerate() {
            assert_eq!(s.op as usize, i, "{}", s.name);
            assert_eq!(Operation::parse(s.name), Some(s.op));
        }
        assert_eq!(Operation::parse("teleport"), None);
        for s in SPECS {
            assert_eq!(serde_json::to_value(s.op).expect("json"), serde_json::json!(s.name));
        }
        assert_eq!(Operation::default(), Operation::Generate);
    }

    #[test]
    fn alpha_is_read_from_the_png_header() {
        let png = |color: png::ColorType, data: &[u8]| {
            let mut buf = Vec::new();
            {
                let mut enc = png::Encoder::new(&mut buf, 1, 1);
                enc.set_color(color);
                enc.set_depth(png::BitDepth::Eight);
                let mut w = enc.write_header().expect("header");
                w.write_image_data(data).expect("data");
            }
            buf
        };
        assert!(!png_has_alpha(&png(png::ColorType::Rgb, &[1, 2, 3])));
        assert!(!png_has_alpha(b"not a png"));
        assert!(png_has_alpha(&png(png::ColorType::Rgba, &[0, 0, 0, 0])));
    }
}
