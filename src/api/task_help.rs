//! What the owner can do about a job, beyond its status: where to look at the provider for a
//! job whose outcome is unknown (`where_to_look`), and, for a job refused before anything was
//! sent (`refused_before_sending`), what was wrong and the fix, and whether retrying unchanged
//! can help. Both are derived from what the task JSON already has (the provider's dashboard,
//! the stored reason, the history); nothing here changes a task. Their words are in the
//! answer's language, from the one catalogue (`domain::words`: `where.*`, `match.*`, `fix.*`);
//! `problem` stays in the adapter's or tally's recorded words.

use serde::Serialize;
use utoipa::ToSchema;

use crate::clock::rfc3339;
use crate::domain::words::{self, has, said_key, said_param, t as word, tf};
use crate::domain::{Charge, Lang, TaskStatus};
use crate::engine::Engine;
use crate::store::{EventView, TaskView};

/// Where to look for an unknown job at the provider, and what to match it by.
#[derive(Debug, Serialize, ToSchema)]
pub struct WhereToLookJson {
    /// Which page (each provider kind's own id, `demo`, `none`), for surfaces that word
    /// `label` and `how` in another language.
    pub page: String,
    /// The provider's page (open it signed in to the provider's account); `null` when this
    /// provider kind offers no such page (`how` then says so).
    pub url: Option<String>,
    /// The page's name for people.
    pub label: String,
    /// What the page shows and how to find the request there, in plain words.
    pub how: String,
    /// True when the page lists single requests; false when it shows only totals (or there
    /// is no page).
    pub lists_requests: bool,
    /// The details to match the request by, most telling first: `request_id` (the provider's
    /// id, when it gave one), `sent_at` (when tally sent it, RFC 3339 UTC), `model`, `prompt`.
    /// `sent_at` and `request_id` come from the job's history and are filled in by the answers
    /// about one job (`GET /v1/tasks/{id}` and the actions on it), not in lists.
    pub match_by: Vec<MatchByJson>,
}

/// One detail to match a request by.
#[derive(Debug, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct MatchByJson {
    /// `request_id`, `sent_at`, `model` or `prompt`.
    pub what: String,
    /// Its name for people ("Time sent").
    pub label: String,
    pub value: String,
}

/// A job refused before anything was sent, and what fixes it.
#[derive(Debug, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct RefusedBeforeSendingJson {
    /// `too_many_references` (the model takes fewer reference photos than the job has),
    /// `needs_references` (the model edits photos and the job has none), `settings` (tally's
    /// configuration for the provider), or `request` (something else about the request).
    pub kind: String,
    /// What was wrong, in the provider adapter's or tally's words.
    pub problem: String,
    /// What fixes it, in plain words.
    pub fix: String,
    /// False when retrying the job unchanged is refused the same way (the fix is a different
    /// request or provider); true when the fix is in tally's settings and a retry after it can
    /// succeed, or when the shot's set now has a number of reference photos the model takes
    /// (judged against the set as it is now, on every read).
    pub retry_helps: bool,
    /// The reference photos the model takes at most, and the job has (reference refusals only).
    pub references_taken: Option<u32>,
    pub references_given: Option<u32>,
    /// For a shot of a set (reference refusals only): how many reference photos the set has
    /// now. A retry sends these, so when they are a number the model takes, `retry_helps` is
    /// true and `fix` says the photos were changed.
    pub references_now: Option<u32>,
}

/// `where_to_look` for an unknown job (null otherwise), its words in `lang`.
pub fn where_to_look(engine: &Engine, t: &TaskView, lang: Lang) -> Option<WhereToLookJson> {
    if t.status != TaskStatus::Unknown {
        return None;
    }
    let d = engine.dashboard(&t.provider)?;
    // The catalogue's words for a page it knows (the page uses the same keys); the
    // provider kind's own (English) words otherwise.
    let known = |kind: &str, own: String| {
        let key = format!("where.{kind}.{}", d.page);
        if lang != Lang::En && has(&key) { word(lang, &key) } else { own }
    };
    let (label, how) = (known("label", d.label.clone()), known("how", d.how.clone()));
    let mut match_by = Vec::new();
    if let Some(model) = d.model.as_deref().filter(|m| !m.is_empty()) {
        match_by.push(detail("model", &label_of(lang, "match.model", "Model"), model));
    }
    match_by.push(detail("prompt", &label_of(lang, "match.prompt", "Prompt"), &t.prompt));
    Some(WhereToLookJson { page: d.page, url: d.url, label, how, lists_requests: d.lists_requests, match_by })
}

fn detail(what: &str, label: &str, value: &str) -> MatchByJson {
    MatchByJson { what: what.into(), label: label.into(), value: value.into() }
}

/// A detail's name: the API's English words (as before the catalogue had them), or the
/// catalogue's in another language.
fn label_of(lang: Lang, key: &str, english: &str) -> String {
    if lang == Lang::En { english.to_string() } else { word(lang, key) }
}

/// Add the time the request was last sent and the provider's id for it, from the job's
/// history (its said lines), in front of the other details, named in the language
/// of the answer being made (`api::lang`).
pub fn add_request_details(w: &mut WhereToLookJson, events: &[EventView]) {
    let lang = super::lang::request_lang();
    let sent = events.iter().rev().find(|e| e.kind == "calling").map(|e| rfc3339(e.at));
    let id = events
        .iter()
        .rev()
        .find_map(|e| (e.kind == "accepted").then(|| said_param(&e.message, "say.accepted", "job"))?)
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    let mut front = Vec::new();
    if let Some(id) = id {
        front.push(detail("request_id", &word(lang, "match.request_id"), &id));
    }
    if let Some(at) = sent {
        front.push(detail("sent_at", &word(lang, "match.sent_at_utc"), &at));
    }
    w.match_by.splice(0..0, front);
}

/// `refused_before_sending` for a failed job that a check before sending stopped (nothing
/// was sent or charged): the adapter's preflight, or tally's own checks (an API key, a size).
/// In English: [`refused_before_sending_in`] with [`Lang::En`].
pub fn refused_before_sending(t: &TaskView) -> Option<RefusedBeforeSendingJson> {
    refused_before_sending_in(t, Lang::En)
}

/// `refused_before_sending`, its `fix` in `lang`.
pub fn refused_before_sending_in(t: &TaskView, lang: Lang) -> Option<RefusedBeforeSendingJson> {
    if t.status != TaskStatus::Failed || t.charge.state != Charge::None {
        return None;
    }
    let reason = t.reason.as_deref()?;
    let kind = t.failure_kind.as_deref()?;
    // The worker's line for an adapter's preflight refusal (`engine::worker`), and for a
    // refusal of tally's own: read from the keys they were said with (a line an older
    // version stored in English gets no such help).
    let (said, adapter) = match said_key(reason) {
        Some("say.refused_before") => (said_param(reason, "say.refused_before", "message")?, true),
        Some("say.preflight_unsent") if kind == "configuration" => {
            (said_param(reason, "say.preflight_unsent", "message")?, false)
        }
        // tally's own checks before sending (`engine::money`'s preflight).
        Some("say.api_key_missing" | "say.api_key_bad_chars" | "say.size_not_a_size") if kind == "configuration" => {
            (reason.to_string(), false)
        }
        _ => return None,
    };
    // The problem is the adapter's or the check's own words, read in English.
    let problem = words::english(&said);
    let problem = problem.as_str();
    if !matches!(kind, "rejected" | "configuration") {
        return None;
    }
    // tally's own check of the request's parameters (`params.size`) is filed as configuration,
    // but the fix is in the request, not in the settings.
    let settings = kind == "configuration" && !problem.starts_with("params.");
    let given = count_after(problem, "this shot has ").or_else(|| count_after(problem, "this shot's "));
    let taken = references_taken(problem);
    let provider = &t.provider;
    let (what, fix, helps) = match (adapter, taken, given) {
        (true, Some(max), Some(n)) if n > max && problem.contains("reference_input") => {
            ("too_many_references", tf(lang, "fix.reference_input", &[("provider", provider)]), true)
        }
        (true, Some(0), Some(_)) => ("too_many_references", word(lang, "fix.takes_none"), false),
        (true, Some(1), Some(n)) if n > 1 => {
            ("too_many_references", tf(lang, "fix.takes_one", &[("n", &(n - 1).to_string())]), false)
        }
        (true, Some(max), Some(n)) if n > max => (
            "too_many_references",
            tf(lang, "fix.takes_max", &[("max", &max.to_string()), ("n", &(n - max).to_string())]),
            false,
        ),
        (true, _, Some(0)) if problem.contains(" edits ") => ("needs_references", word(lang, "fix.needs"), false),
        _ if settings => ("settings", tf(lang, "fix.settings", &[("provider", provider)]), true),
        _ => ("request", word(lang, "fix.request"), false),
    };
    let refs = what.ends_with("references");
    // A shot sends its set's reference photos as they are at each claim: once the owner
    // changed them to a number the model takes, a retry is no longer refused the same way.
    let now = if refs { t.set_references } else { None };
    let fixed = match (what, now, taken) {
        ("too_many_references", Some(n), Some(max)) => !helps && n <= max,
        ("needs_references", Some(n), max) => n > 0 && max.is_none_or(|m| n <= m),
        _ => false,
    };
    let (fix, helps) = match now {
        Some(n) if fixed => (tf(lang, "fix.fixed_references", &[("n", &n.to_string())]), true),
        _ => (fix, helps),
    };
    Some(RefusedBeforeSendingJson {
        kind: what.into(),
        problem: words::render(lang, &said),
        fix,
        retry_helps: helps,
        references_taken: if refs { taken } else { None },
        references_given: if refs { given } else { None },
        references_now: now,
    })
}

/// The number right after `marker` in `text` ("this shot has 2" → 2).
fn count_after(text: &str, marker: &str) -> Option<u32> {
    let at = text.find(marker)? + marker.len();
    let digits: String = text[at..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// How many reference photos the model takes, from the adapters' refusals (`providers::http`).
fn references_taken(text: &str) -> Option<u32> {
    if text.contains("takes no reference") || text.contains("takes no input image") {
        return Some(0);
    }
    if text.contains("has no reference_input configured") {
        return Some(0);
    }
    if text.contains("takes one reference") || text.contains("edits exactly one reference") {
        return Some(1);
    }
    if let Some(n) = count_after(text, "takes at most ") {
        return Some(n);
    }
    if text.contains("edits 1 to 3 reference") {
        return Some(3);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ChargeSummary;

    /// A failed task whose reason is `reason`, said as the worker says it: the two refusals
    /// before sending are written here in English for reading and made into their said lines.
    fn failed(kind: &str, reason: &str) -> TaskView {
        // The two lines' English around their message, from the catalogue.
        let refused = tf(Lang::En, "say.refused_before", &[("message", "")]);
        let unsent = tf(Lang::En, "say.preflight_unsent", &[("message", "")]);
        let reason = if let Some(m) = reason.strip_prefix(refused.as_str()) {
            crate::domain::words::say_with("say.refused_before", &[("message", m)])
        } else if let Some(m) = reason.strip_suffix(unsent.as_str()) {
            crate::domain::words::say_with("say.preflight_unsent", &[("message", m)])
        } else {
            reason.to_string()
        };
        TaskView {
            id: "t".into(),
            status: TaskStatus::Failed,
            reason: Some(reason),
            failure_kind: Some(kind.into()),
            attempts: 0,
            charge: ChargeSummary::default(),
            retried_as: None,
            cancel_requested: false,
            provider: "flux".into(),
            prompt: "a mug".into(),
            params: serde_json::json!({}),
            idempotency_key: None,
            retry_of: None,
            set_id: None,
            set_position: None,
            set_references: None,
            shot_role: None,
            candidate: 0,
            created_at: 0,
            updated_at: 0,
            artifacts: Vec::new(),
            group: None,
            waiting_for: None,
            held: None,
            budget_hold: false,
            operation: Default::default(),
            source: None,
            derived: Vec::new(),
            source_task: None,
        }
    }

    #[test]
    fn reference_refusals_name_the_fix_and_say_retry_cannot_help() {
        let t = failed(
            "rejected",
            "refused before sending anything (nothing was charged): the model `black-forest-labs/flux` takes one \
             reference image (`input_image`); this shot has 2",
        );
        let r = refused_before_sending(&t).expect("a refusal");
        assert_eq!(r.kind, "too_many_references");
        assert_eq!((r.references_taken, r.references_given), (Some(1), Some(2)));
        assert!(r.fix.contains("one reference photo") && r.fix.contains("remove 1"), "{}", r.fix);
        assert!(!r.retry_helps);
        let zh = refused_before_sending_in(&t, Lang::ZhCn).expect("a refusal");
        assert_eq!(zh.fix, "这个模型只接受一张参考照片：请删除其中 1 张，或者换一个服务商。");
        assert_eq!(zh.problem, r.problem, "the problem stays in the adapter's words");

        let t = failed(
            "rejected",
            "refused before sending anything (nothing was charged): this shot has 5 reference photos, but the provider's \
             flux-kontext-pro takes at most 4; nothing was sent",
        );
        let r = refused_before_sending(&t).expect("a refusal");
        assert_eq!((r.references_taken, r.references_given), (Some(4), Some(5)));
        assert!(r.fix.contains("at most 4") && r.fix.contains("remove 1"), "{}", r.fix);

        let t = failed(
            "rejected",
            "refused before sending anything (nothing was charged): the model `wan2.5-i2i-preview` edits 1 to 3 \
             reference photos; this shot has 0",
        );
        assert_eq!(refused_before_sending(&t).expect("a refusal").kind, "needs_references");
    }

    #[test]
    fn a_reference_refusal_can_be_retried_once_the_set_has_a_number_the_model_takes() {
        let mut t = failed(
            "rejected",
            "refused before sending anything (nothing was charged): the model `black-forest-labs/flux` takes one \
             reference image (`input_image`); this shot has 2",
        );
        t.set_id = Some("s".into());
        t.set_references = Some(2);
        let r = refused_before_sending(&t).expect("a refusal");
        assert!(!r.retry_helps, "the set still has both photos");
        assert_eq!(r.references_now, Some(2));
        t.set_references = Some(1);
        let r = refused_before_sending(&t).expect("a refusal");
        assert!(r.retry_helps, "one photo now: a retry sends that one");
        assert_eq!((r.references_given, r.references_now), (Some(2), Some(1)), "the record stays");
        assert!(r.fix.contains("now has 1 reference photo"), "{}", r.fix);
        assert!(refused_before_sending_in(&t, Lang::ZhCn).expect("a refusal").fix.contains('1'));
        let mut t = failed(
            "rejected",
            "refused before sending anything (nothing was charged): the model `wan2.5-i2i-preview` edits 1 to 3 \
             reference photos; this shot has 0",
        );
        t.set_references = Some(0);
        assert!(!refused_before_sending(&t).expect("a refusal").retry_helps);
        t.set_references = Some(4);
        assert!(!refused_before_sending(&t).expect("a refusal").retry_helps, "more than the model takes");
        t.set_references = Some(2);
        assert!(refused_before_sending(&t).expect("a refusal").retry_helps);
    }

    #[test]
    fn settings_refusals_can_be_retried_after_the_fix_and_other_failures_are_not_refusals() {
        let missing = crate::domain::words::say_with("say.api_key_missing", &[("var", "K"), ("provider", "flux")]);
        let t = failed("configuration", &missing);
        let r = refused_before_sending(&t).expect("a refusal");
        assert_eq!(r.kind, "settings");
        assert!(r.retry_helps);
        let t = failed(
            "configuration",
            "refused before sending anything (nothing was charged): this shot has 2 reference photo(s), but \
             provider model `fal-ai/x` has no reference_input configured (the name of the model's image input, \
             e.g. image_urls), so they would be dropped; nothing was sent",
        );
        let r = refused_before_sending(&t).expect("a refusal");
        assert!(r.retry_helps && r.fix.contains("reference_input"), "{}", r.fix);
        let t = failed(
            "configuration",
            "params.size \"huge\" is not a size like \"1024x1024\"; nothing was sent to the provider",
        );
        let r = refused_before_sending(&t).expect("a refusal");
        assert_eq!(r.kind, "request");
        assert!(!r.retry_helps);
        // The provider refused a request it received: not a refusal before sending.
        assert!(refused_before_sending(&failed("rejected", "the provider refused: 400 bad prompt")).is_none());
    }

    #[test]
    fn the_request_details_come_from_the_history() {
        let ev = |kind: &str, at: i64, message: &str| EventView {
            id: at,
            at,
            actor: "worker".into(),
            kind: kind.into(),
            message: message.into(),
            execution_token: None,
        };
        let mut w = WhereToLookJson {
            page: "none".into(),
            url: None,
            label: String::new(),
            how: String::new(),
            lists_requests: true,
            match_by: vec![detail("prompt", "Prompt", "a mug")],
        };
        add_request_details(
            &mut w,
            &[
                ev("calling", 1_000, "sent"),
                ev("accepted", 2_000, &crate::domain::words::say_with("say.accepted", &[("job", "abc123")])),
            ],
        );
        let what: Vec<&str> = w.match_by.iter().map(|m| m.what.as_str()).collect();
        assert_eq!(what, ["request_id", "sent_at", "prompt"]);
        assert_eq!(w.match_by[0].value, "abc123");
        assert_eq!(w.match_by[1].value, rfc3339(1_000));
    }
}
