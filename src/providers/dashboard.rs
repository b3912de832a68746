//! Where the owner looks for a request at the provider when tally cannot prove what happened
//! to it (an `unknown` job): the provider's own page for its kind, what that page shows, and
//! whether a single request can be found there. The task JSON's `where_to_look` is built from
//! this plus the details of the request (time sent, model, prompt, the provider's id for it).
//!
//! The addresses were checked against the providers' documentation and common use (December
//! 2026); a provider that moves its page only makes the link land on its sign-in or home
//! page, and the details to match by stay right.

use serde::Serialize;
use utoipa::ToSchema;

/// A provider's page for finding one request, in plain words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Dashboard {
    /// Which page this is (`openai_usage`, `replicate_predictions`, `fal_requests`,
    /// `model_studio`, `ai_studio`, `ai_studio_batch`, `bfl_dashboard`, `demo`, `none`): the web
    /// page shows `label` and `how` in its own language from its catalogue (`where.label.ID`,
    /// `where.how.ID` in `web/assets/messages.json`, whose English matches the words here).
    pub page: String,
    /// The page to open, signed in to the provider's account; `null` when the provider kind
    /// offers no page that shows requests or charges.
    pub url: Option<String>,
    /// The page's name for people ("Replicate's list of predictions").
    pub label: String,
    /// What to look for there and what it can show, in plain words.
    pub how: String,
    /// True when the page lists single requests (so one can be matched); false when it shows
    /// only totals per model and time, or when there is no page.
    pub lists_requests: bool,
    /// The model the provider was asked for, as configured (`null` when it has none).
    pub model: Option<String>,
}

impl Dashboard {
    /// No page: `why` says so in plain words.
    pub fn none(why: &str) -> Dashboard {
        Dashboard {
            page: "none".into(),
            url: None,
            label: "no dashboard".into(),
            how: why.into(),
            lists_requests: false,
            model: None,
        }
    }

    /// The demo provider: no dashboard, and nothing to pay.
    pub fn demo() -> Dashboard {
        Dashboard {
            page: "demo".into(),
            ..Dashboard::none(
                "The demo provider runs inside tally and never charges: there is no dashboard to look in.",
            )
        }
    }

    /// The model to match by.
    pub fn with_model(mut self, model: Option<&str>) -> Dashboard {
        self.model = model.map(str::to_string);
        self
    }

    /// OpenAI's usage page: images per model and time (UTC), not single requests.
    pub fn openai() -> Dashboard {
        Dashboard {
            page: "openai_usage".into(),
            url: Some("https://platform.openai.com/usage".into()),
            label: "OpenAI's usage page".into(),
            how: "It counts images per model and time (in UTC), not single requests: look for an image of this \
                  model at the time it was sent. Only the organization's owners (or people given usage access) \
                  can see it."
                .into(),
            lists_requests: false,
            model: None,
        }
    }

    /// Replicate's list of the account's predictions.
    pub fn replicate() -> Dashboard {
        Dashboard {
            page: "replicate_predictions".into(),
            url: Some("https://replicate.com/predictions".into()),
            label: "Replicate's list of predictions".into(),
            how: "Every prediction of the account is listed with its model, time and status; open the one sent \
                  at this time with this prompt (or with the prediction id below) to see whether it succeeded."
                .into(),
            lists_requests: true,
            model: None,
        }
    }

    /// fal's request history.
    pub fn fal() -> Dashboard {
        Dashboard {
            page: "fal_requests".into(),
            url: Some("https://fal.ai/dashboard/requests".into()),
            label: "fal's request history".into(),
            how: "Requests are listed by endpoint and time with their status; find the one with the request id \
                  below, or the one sent at this time."
                .into(),
            lists_requests: true,
            model: None,
        }
    }

    /// Alibaba Cloud Model Studio (DashScope): the international console for the `-intl`
    /// endpoint, the mainland one otherwise.
    pub fn dashscope(base_url: Option<&str>) -> Dashboard {
        let intl = base_url.is_some_and(|u| u.contains("dashscope-intl"));
        Dashboard {
            page: "model_studio".into(),
            url: Some(if intl {
                "https://modelstudio.console.alibabacloud.com/".into()
            } else {
                "https://bailian.console.aliyun.com/".into()
            }),
            label: "Alibaba Cloud Model Studio console".into(),
            how: "Model Telemetry (模型观测) lists the calls per model with their time and status; bills show what \
                  was charged. Match the task id below, or the model and the time it was sent."
                .into(),
            lists_requests: true,
            model: None,
        }
    }

    /// Google AI Studio: usage per model, and the logs of a project that turned them on.
    pub fn gemini(batch: bool) -> Dashboard {
        Dashboard {
            page: if batch { "ai_studio_batch" } else { "ai_studio" }.into(),
            url: Some("https://aistudio.google.com/usage".into()),
            label: "Google AI Studio's usage page".into(),
            how: if batch {
                "It shows requests per model and day; tally sent this one as a batch job, whose name is below. \
                 A blocked or failed request can still be charged for its prompt."
            } else {
                "It shows requests per model and day; single requests appear under Logs only when logging is \
                 turned on for the project. A blocked request can still be charged for its prompt."
            }
            .into(),
            lists_requests: batch,
            model: None,
        }
    }

    /// Black Forest Labs' dashboard: credits and usage per project.
    pub fn bfl() -> Dashboard {
        Dashboard {
            page: "bfl_dashboard".into(),
            url: Some("https://dashboard.bfl.ai/".into()),
            label: "the BFL dashboard".into(),
            how: "It shows the credits used per project over time, not single requests: look for credits used \
                  at the time it was sent."
                .into(),
            lists_requests: false,
            model: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_page_is_https_or_says_there_is_none() {
        for d in [
            Dashboard::openai(),
            Dashboard::replicate(),
            Dashboard::fal(),
            Dashboard::dashscope(None),
            Dashboard::dashscope(Some("https://dashscope-intl.aliyuncs.com/api/v1")),
            Dashboard::gemini(false),
            Dashboard::gemini(true),
            Dashboard::bfl(),
        ] {
            assert!(d.url.as_deref().is_some_and(|u| u.starts_with("https://")), "{d:?}");
            assert!(!d.label.is_empty() && !d.how.is_empty());
        }
        assert!(
            Dashboard::dashscope(Some("https://dashscope-intl.aliyuncs.com"))
                .url
                .unwrap_or_default()
                .contains("alibabacloud")
        );
        // The page words these from its catalogue: the English there is the same as here.
        let c: serde_json::Value =
            serde_json::from_str(include_str!("../web/assets/messages.json")).expect("messages.json");
        for d in [
            Dashboard::openai(),
            Dashboard::replicate(),
            Dashboard::fal(),
            Dashboard::dashscope(None),
            Dashboard::gemini(false),
            Dashboard::gemini(true),
            Dashboard::bfl(),
            Dashboard::demo(),
        ] {
            for (what, text) in [("label", &d.label), ("how", &d.how)] {
                let key = format!("where.{what}.{}", d.page);
                assert_eq!(c["en"][&key].as_str(), Some(text.as_str()), "{key} in messages.json");
                assert!(c["zh-CN"][&key].as_str().is_some_and(|z| !z.is_empty()), "{key} in Chinese");
            }
        }
        let none = Dashboard::none("The demo provider runs inside tally; it has no dashboard.");
        assert_eq!(none.url, None);
        assert!(!none.lists_requests);
    }
}
