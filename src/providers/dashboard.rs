//! Where the owner looks for a request at the provider when tally cannot prove what happened
//! to it (an `unknown` job): the provider's own page for its kind, what that page shows, and
//! whether a single request can be found there. The task JSON's `where_to_look` is built from
//! this plus the details of the request (time sent, model, prompt, the provider's id for it).
//!
//! The addresses were checked against the providers' documentation and common use (December
//! 2026); a provider that moves its page only makes the link land on its sign-in or home
//! page, and the details to match by stay right.

use crate::domain::Lang;
use crate::domain::words::t;
use serde::Serialize;
use utoipa::ToSchema;

/// A provider's page for finding one request, in plain words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Dashboard {
    /// Which page this is (each provider kind's own, `demo`, `none`): the web
    /// page shows `label` and `how` in its own language from its catalogue (`where.label.ID`,
    /// `where.how.ID` in `web/assets/messages.json`, whose English matches the words here).
    pub page: String,
    /// The page to open, signed in to the provider's account; `null` when the provider kind
    /// offers no page that shows requests or charges.
    pub url: Option<String>,
    /// The page's name for people ("the provider's list of requests").
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
        Dashboard { page: "demo".into(), ..Dashboard::none(&t(Lang::En, "where.how.demo")) }
    }

    /// The console the owner configured for this provider (`dashboard_url`): an
    /// OpenAI-compatible gateway's, say, where the kind's own page would be the wrong account.
    pub fn configured(url: &str) -> Dashboard {
        Dashboard {
            page: "configured".into(),
            url: Some(url.to_string()),
            label: t(Lang::En, "where.label.configured"),
            how: t(Lang::En, "where.how.configured"),
            lists_requests: false,
            model: None,
        }
    }

    /// A gateway that speaks another provider's API, with no console configured: the kind's
    /// own page would be another account, so none is linked.
    pub fn gateway() -> Dashboard {
        Dashboard {
            page: "gateway".into(),
            ..Dashboard::none(
                "This provider is a gateway (its base_url is not the API's own host), and no dashboard_url is set: \
                 look in the gateway's own console for a request at the time this one was sent.",
            )
        }
    }

    /// The model to match by.
    pub fn with_model(mut self, model: Option<&str>) -> Dashboard {
        self.model = model.map(str::to_string);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::kinds::KINDS;
    use crate::providers::settings::ProviderConfig;

    #[test]
    fn every_kind_has_a_page_in_both_languages() {
        // The page words these from its catalogue: the English there is the same as here.
        let c: serde_json::Value =
            serde_json::from_str(include_str!("../web/assets/messages.json")).expect("messages.json");
        let mut pages: Vec<Dashboard> = vec![Dashboard::gateway(), Dashboard::configured("https://gw.example/console")];
        for k in KINDS {
            // At the kind's own documented host (a gateway elsewhere is `gateway`, checked below).
            let base = k.hosts_without_idempotency.first().map(|h| format!("https://{h}"));
            for batch in [false, true] {
                let cfg = ProviderConfig { batch, base_url: base.clone(), ..ProviderConfig::demo() };
                let d = (k.dashboard)(&cfg);
                if k.bills {
                    assert!(d.url.as_deref().is_some_and(|u| u.starts_with("https://")), "{}: {d:?}", k.name);
                }
                pages.push(d);
            }
        }
        for d in pages {
            assert!(!d.label.is_empty() && !d.how.is_empty());
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
