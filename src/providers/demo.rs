//! The built-in `demo` provider: renders a placeholder PNG locally, at no cost.
//!
//! It lets a new user watch the whole path (submit, dispatch, claim, `calling`, artifact,
//! `succeeded`) without an account or network. Rendering is deterministic and free, so a
//! resend is harmless: it declares an idempotent create.

use std::time::Duration;

use super::{BoxFuture, CallError, CallRequest, Capabilities, Image, Provider, Submitted};

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
    fn dashboard(&self) -> crate::providers::dashboard::Dashboard {
        crate::providers::dashboard::Dashboard::demo()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { idempotent_create: true, lookup: false }
    }

    fn billing_note(&self) -> &str {
        "The demo provider runs on this machine and never charges."
    }

    fn submit<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Submitted, CallError>> {
        Box::pin(async move {
            if !self.delay.is_zero() {
                tokio::time::sleep(self.delay).await;
            }
            // Each candidate of a shot gets its own colours, so choosing can be tried for free.
            let bytes = if req.candidate == 0 {
                crate::render::placeholder_png(&req.prompt, self.size)
            } else {
                crate::render::placeholder_png(&format!("{} (candidate {})", req.prompt, req.candidate + 1), self.size)
            };
            Ok(Submitted::Done(Image { bytes, media_type: "image/png".into() }))
        })
    }
}
