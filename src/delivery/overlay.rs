//! TEMPORARY stub of the overlay renderer (replaced by the helper's module at merge).
use serde::Serialize;

pub use crate::domain::overlay::Overlay;

/// A template as GET /v1/overlays lists it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct TemplateInfo {
    pub name: &'static str,
    pub max_lines: usize,
    pub description: String,
    pub description_zh: String,
}

/// The templates.
pub fn templates() -> Vec<TemplateInfo> {
    vec![TemplateInfo { name: "headline_band", max_lines: 2, description: "x".into(), description_zh: "x".into() }]
}

/// Why an overlay cannot be drawn.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OverlayError {
    #[error("the words do not fit")]
    DoesNotFit,
}

/// Check.
pub fn check(overlay: &Overlay, _width: u32, _height: u32) -> Result<(), OverlayError> {
    if overlay.lines.iter().map(|l| l.chars().count()).sum::<usize>() > 60 {
        Err(OverlayError::DoesNotFit)
    } else {
        Ok(())
    }
}

/// Draw.
pub fn draw(img: &mut image::RgbImage, overlay: &Overlay) -> Result<(), OverlayError> {
    check(overlay, img.width(), img.height())?;
    let h = img.height();
    for y in h * 4 / 5..h {
        for x in 0..img.width() {
            img.put_pixel(x, y, image::Rgb([40, 40, 40]));
        }
    }
    Ok(())
}
