//! Photoroom's remove-background API (`POST {base_url}/v1/segment`): a multipart form with the
//! image in `image_file`, the key in the `x-api-key` header, and a synchronous answer with the
//! cut-out as a PNG with alpha. Billed per image; it takes no idempotency key and offers
//! nothing to look up after a lost answer, so such an answer is an honest `unknown`.
//!
//! Checked against Photoroom's published API reference (docs.photoroom.com: "Remove
//! Background (Basic plan)", `POST https://sdk.photoroom.com/v1/segment`); the mock provider
//! serves the same route, as strict.

use std::time::Duration;

use reqwest::Method;
use reqwest::multipart::{Form, Part};

use crate::providers::dashboard::Dashboard;
use crate::providers::http::client::{AuthScheme, HttpClient, image_from_bytes};
use crate::providers::{
    BoxFuture, CallError, CallRequest, Capabilities, Provider, ProviderConfig, Submitted, extension,
};

/// The API's documented host.
pub const DEFAULT_BASE_URL: &str = "https://sdk.photoroom.com";

/// The remove-background adapter.
pub struct Photoroom {
    http: HttpClient,
}

impl Photoroom {
    /// Build the adapter from its configuration.
    pub fn new(cfg: &ProviderConfig) -> Result<Self, String> {
        Ok(Photoroom { http: HttpClient::new(cfg, AuthScheme::Header("x-api-key"))? })
    }
}

/// Photoroom's dashboard: API usage per day, not single requests.
pub fn dashboard(_cfg: &ProviderConfig) -> Dashboard {
    Dashboard {
        page: "photoroom_dashboard".into(),
        url: Some("https://app.photoroom.com/api-dashboard".into()),
        label: "Photoroom's API dashboard".into(),
        how: "It shows the API calls used per day, not single requests: look for a call at the time this one \
              was sent."
            .into(),
        lists_requests: false,
        model: None,
    }
}

impl Provider for Photoroom {
    fn capabilities(&self) -> Capabilities {
        Capabilities { idempotent_create: false, lookup: false }
    }

    fn billing_note(&self) -> String {
        crate::domain::words::say("say.bills_photoroom")
    }

    fn rate_limit_hold(&self) -> Option<Duration> {
        self.http.rate_limit_hold()
    }

    fn preflight<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<(), CallError>> {
        Box::pin(async move {
            self.http.check_key()?;
            if req.references.len() != 1 {
                return Err(CallError::Rejected {
                    message: format!(
                        "Photoroom removes the background of exactly one image; this request has {}",
                        req.references.len()
                    ),
                    config: false,
                });
            }
            Ok(())
        })
    }

    fn submit<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Submitted, CallError>> {
        Box::pin(async move {
            let image = req.references.first().ok_or_else(|| CallError::NotSent("no image to cut out".into()))?;
            let part = Part::bytes(image.bytes.clone())
                .file_name(format!("image.{}", extension(&image.media_type)))
                .mime_str(&image.media_type)
                .map_err(|e| CallError::NotSent(format!("the image: {e}")))?;
            let form = Form::new().part("image_file", part);
            let url = format!("{}/v1/segment", self.http.base_url());
            let rb = self.http.request(Method::POST, &url, None)?.multipart(form);
            let bytes = self.http.send_bytes(rb).await?;
            Ok(Submitted::Done(image_from_bytes(bytes)?))
        })
    }
}
