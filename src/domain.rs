//! The vocabulary of tally: statuses, phases, plain-words messages, the retry policy and the
//! recovery decision table. Pure: nothing here does I/O, and time is always passed in.
//! Past 600 lines because this is the shared vocabulary, each part short and read with the
//! others; the larger parts (words, operations, drafts, overlays, the zone) have their modules.
//! The words themselves, in English and Simplified Chinese, come from one catalogue
//! ([`words`]).

pub mod csv;
pub mod draft;
pub mod operation;
pub mod overlay;
pub mod words;
pub mod zone;

use serde::Serialize;
use std::fmt;
use std::time::Duration;

/// The currency of prices and budgets when none is configured.
pub const DEFAULT_CURRENCY: &str = "USD";
use sha2::{Digest, Sha256};

/// Milliseconds since the Unix epoch, UTC: the one way tally stores time.
pub type Millis = i64;

macro_rules! string_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name { $($(#[$vdoc])* $variant),+ }

        impl $name {
            /// The name stored in the database and shown in the API.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }

            /// Parse a stored name.
            pub fn parse(s: &str) -> Option<Self> {
                match s { $($text => Some($name::$variant),)+ _ => None }
            }

            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

string_enum! {
    /// A task's status: the only status a user sees. Derived from the task row alone.
    #[derive(utoipa::ToSchema)]
    TaskStatus {
        /// Submitted, not yet started. Moved out by a worker's claim or by cancel.
        Queued = "queued",
        /// Waiting for a retry, a free provider slot, or a paused provider. Moved out by the
        /// dispatcher (when due) and a worker's claim, or by cancel.
        Waiting = "waiting",
        /// A worker holds it. Moved out by the worker's fenced finish, or by the reconciler.
        Running = "running",
        /// Done, with its image (or answer) stored. Terminal.
        Succeeded = "succeeded",
        /// Ended without a result, and the evidence proves why. Terminal (a retry is a new task).
        Failed = "failed",
        /// The outcome cannot be proven. Moved out only by a late result of the same
        /// execution or by an operator.
        Unknown = "unknown",
        /// Canceled by its owner before a result. Terminal.
        Canceled = "canceled",
    }
}

impl TaskStatus {
    /// Terminal or unknown: nothing automatic will happen to the task any more.
    pub fn is_settled(self) -> bool {
        matches!(self, TaskStatus::Succeeded | TaskStatus::Failed | TaskStatus::Canceled | TaskStatus::Unknown)
    }
}

string_enum! {
    /// Where an execution is relative to the paid call.
    Phase {
        /// Claimed; nothing sent yet.
        Claimed = "claimed",
        /// Durably recorded "about to call": from here a resend may be charged.
        Calling = "calling",
        /// The provider accepted the job and its id is persisted: recover by polling.
        Accepted = "accepted",
    }
}

string_enum! {
    /// What the evidence says about money for one request (an execution), and, taken over
    /// all of a task's requests, for the task. Ordered by weight: a task's state is the
    /// heaviest of its requests'. Every surface derives its money wording from this, never
    /// from a phase or a status alone.
    #[derive(utoipa::ToSchema)]
    Charge {
        /// Nothing reached the provider (a local check failed, the connection was never
        /// made, canceled before sending), or the provider never bills (`demo`).
        None = "none",
        /// The provider gave a definite refusal (400/401/403/404/422, or a 429/503 "not
        /// now"): not charged by the provider's own rules.
        Refused = "refused",
        /// A request left and its outcome cannot be proven (lost answer, a 5xx, a crash
        /// mid-call, or still in flight). Counts against budgets, as it may have cost money.
        Possible = "possible",
        /// A result was delivered (or the provider reported the job done): charged.
        Charged = "charged",
    }
}

// `string_enum!` does not derive `Default`; nothing is what an execution starts with.
#[allow(clippy::derivable_impls)]
impl Default for Charge {
    fn default() -> Self {
        Charge::None
    }
}

impl Charge {
    /// Whether a retry of a task whose requests reached this state must acknowledge that it
    /// may be charged again (and whether the request counts as spend).
    pub fn may_cost(self) -> bool {
        matches!(self, Charge::Possible | Charge::Charged)
    }

    /// The weight used to combine several requests: `charged > possible > refused > none`.
    fn weight(self) -> u8 {
        match self {
            Charge::None => 0,
            Charge::Refused => 1,
            Charge::Possible => 2,
            Charge::Charged => 3,
        }
    }

    /// The heavier of two states.
    pub fn max(self, other: Charge) -> Charge {
        if other.weight() > self.weight() { other } else { self }
    }
}

/// An amount of money in millionths of the currency unit: budgets and spend add up in
/// integers, so `3 × 0.04` is exactly `0.12`.
pub type Micros = i64;

/// A price from the configuration (a decimal number of currency units) in [`Micros`].
pub fn to_micros(amount: f64) -> Micros {
    (amount * 1_000_000.0).round() as Micros
}

/// [`Micros`] as a decimal number of currency units, for JSON.
pub fn from_micros(m: Micros) -> f64 {
    m as f64 / 1_000_000.0
}

/// An amount for people: `$0.04`, `€1.50`, or `0.04 CHF` for other currencies. At least two
/// decimals; more only when the amount has them (`$0.0125`).
pub fn money(m: Micros, currency: &str) -> String {
    let mut digits = format!("{:.6}", from_micros(m));
    while digits.ends_with('0') && digits.len() > digits.find('.').map_or(0, |i| i + 3) {
        digits.pop();
    }
    match currency {
        "USD" => format!("${digits}"),
        "EUR" => format!("€{digits}"),
        "GBP" => format!("£{digits}"),
        other => format!("{digits} {other}"),
    }
}

string_enum! {
    /// Why a task failed.
    FailureKind {
        /// The provider refused the request (its content, its parameters).
        Rejected = "rejected",
        /// tally's setup or the provider account stopped it (a key, a credit, a setting).
        Configuration = "configuration",
        /// The request never reached the provider, every attempt.
        NotSent = "not_sent",
        /// The provider kept asking tally to wait until the attempts were used up.
        RateLimited = "rate_limited",
        /// No worker ever took it (each dispatch lost before anything was sent).
        Undeliverable = "undeliverable",
        /// Its result expired at the provider before tally could fetch it.
        Expired = "expired",
        /// An operator resolved it as failed.
        Operator = "operator",
        /// The provider answered, but not with something tally can use.
        InvalidResult = "invalid_result",
    }
}

/// Who wrote an event to a task's timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Actor {
    /// A request to the API (the page, the CLI).
    Api,
    /// The dispatcher, handing work to the workers.
    Dispatcher,
    /// The worker that ran an attempt.
    Worker,
    /// The reconciler, settling what a stopped worker left.
    Reconciler,
    /// An operator resolving a task by hand.
    Operator,
}

impl Actor {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Actor::Api => "api",
            Actor::Dispatcher => "dispatcher",
            Actor::Worker => "worker",
            Actor::Reconciler => "reconciler",
            Actor::Operator => "operator",
        }
    }
}

/// The honest wording for `unknown` (DESIGN §4) when no cause was recorded.
pub const UNKNOWN_MESSAGE: &str = "The result cannot be confirmed: the request may have reached the provider, and \
     nothing can prove what happened to it. Automatic retries have stopped. Generating again is a new operation that may \
     be charged again.";

/// A plain-words message for a task's status, for a shop owner, in English (the words the
/// tests and scripts read): [`status_message_in`] with [`Lang::En`].
pub fn status_message(status: TaskStatus, reason: Option<&str>, cancel_requested: bool, charge: Charge) -> String {
    status_message_in(Lang::En, status, reason, cancel_requested, charge)
}

/// A plain-words message for a task's status, for a shop owner, in `lang`. `reason` is the
/// stored detail (why it failed, what it waits for, why its outcome is unknown), a said line
/// rendered here ([`words::render`]); `charge` is what the evidence says
/// about money, so the wording never claims a charge that cannot be.
pub fn status_message_in(
    lang: Lang,
    status: TaskStatus,
    reason: Option<&str>,
    cancel_requested: bool,
    charge: Charge,
) -> String {
    use words::{full_stop, t, tf};
    // The stored reason (a said line) in the language.
    let reason = words::render_opt(lang, reason).filter(|r| !r.trim().is_empty());
    let reason = reason.as_deref();
    // The reason as a sentence of its own (English: capitalized, as said otherwise), and as
    // a clause inside another sentence (no full stop).
    let sentence = |r: &str| match lang {
        Lang::En => capitalized(r),
        Lang::ZhCn => full_stop(lang, r),
    };
    let as_is = |r: &str| match lang {
        Lang::En => r.to_string(),
        Lang::ZhCn => full_stop(lang, r),
    };
    let clause = |r: &str| r.trim_end_matches(['.', '。']).to_string();
    let with = |key: &str, base: &str, r: Option<&str>| match r {
        Some(r) => tf(lang, key, &[("reason", &as_is(r))]),
        None => t(lang, base),
    };
    match status {
        TaskStatus::Queued => match reason {
            Some(r) => tf(lang, "status.queued_because", &[("reason", &sentence(r))]),
            None => t(lang, "status.queued"),
        },
        // The reason says what it waits for (a retry, a slot, the budget); it is not always a
        // second try, so no prefix claims one.
        TaskStatus::Waiting => match reason {
            Some(r) => sentence(r),
            None => t(lang, "status.waiting"),
        },
        TaskStatus::Running if cancel_requested && charge.may_cost() => t(lang, "status.running_cancel_charged"),
        TaskStatus::Running if cancel_requested => t(lang, "status.running_cancel"),
        TaskStatus::Running => t(lang, "status.running"),
        TaskStatus::Succeeded => with("status.succeeded_because", "status.succeeded", reason),
        TaskStatus::Failed => with("status.failed_because", "status.failed", reason),
        TaskStatus::Unknown => match reason {
            Some(r) => tf(lang, "status.unknown_because", &[("reason", &clause(r))]),
            None => t(lang, "status.unknown"),
        },
        TaskStatus::Canceled => with("status.canceled_because", "status.canceled", reason),
    }
}

/// A status's name for people in `lang` ("queued", "排队中").
pub fn status_name(lang: Lang, status: TaskStatus) -> String {
    words::t(lang, &format!("state.{}", status.as_str()))
}

/// `text` with its first letter in upper case.
fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// The fingerprint of a request, to tell a replay (same key, same request) from a conflict.
pub fn request_hash(provider: &str, prompt: &str, params: &serde_json::Value, extra: &str) -> String {
    let mut h = Sha256::new();
    for part in [provider, prompt, &params.to_string(), extra] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    hex(&h.finalize())
}

/// Lower-case hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    use fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The delay before retry number `attempt` (1-based): exponential from `base`, capped at
/// `max`, with full jitter over the upper half so that retries of many tasks spread out
/// instead of arriving together and prolonging an outage. `jitter` is in `[0, 1)`.
pub fn backoff(attempt: u32, base: Duration, max: Duration, jitter: f64) -> Duration {
    let exp = base.saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
    let capped = exp.min(max);
    capped.mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0))
}

/// What the reconciler found about one sent envelope whose deadline passed (or whose lease
/// belongs to an earlier run of the process).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Leftover {
    /// Sent without any running execution: only an older version's hand-off that was never
    /// claimed (today's dispatcher claims in the same statement that sends).
    Unclaimed { send_count: u32 },
    /// Claimed, but the worker stopped before recording `calling`: nothing was sent.
    /// `send_count` is how many dispatches of the envelope there were.
    BeforeCalling { send_count: u32 },
    /// The execution recorded `calling` (a request may have left).
    Calling,
    /// The provider accepted the job and its id is persisted.
    Accepted,
}

impl Leftover {
    /// Classify a leftover from its evidence: the task's running execution (if any) and its
    /// phase decide. A call that reached `calling` or `accepted` is decided from that phase
    /// alone, never counted as an undelivered dispatch, however often it was handed out: its
    /// request may already have been sent and charged.
    pub fn of(execution: Option<Phase>, send_count: u32) -> Leftover {
        match execution {
            None => Leftover::Unclaimed { send_count },
            Some(Phase::Claimed) => Leftover::BeforeCalling { send_count },
            Some(Phase::Calling) => Leftover::Calling,
            Some(Phase::Accepted) => Leftover::Accepted,
        }
    }
}

/// What the reconciler does with a leftover (DESIGN §6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Back to `pending`, due now: nothing was sent.
    Requeue,
    /// Too many dispatches lost before anything was sent (a crash every time): the envelope is
    /// `dead` and the task `failed`.
    GiveUp,
    /// Execution `abandoned`, envelope `pending`: nothing was sent.
    Abandon,
    /// Hand the same execution to a worker again: it replays with the same idempotency key
    /// or looks the job up, depending on what the provider can prove.
    Resume,
    /// Nothing can prove what happened: `unknown`, automatic retries stop.
    Unknown,
}

/// The recovery table of DESIGN §6 as a function. (An image the provider returned is never a
/// leftover: its bytes commit in the same transaction as `succeeded`, so a crash before that
/// commit leaves nothing saved, and the call is recovered like any other.)
pub fn decide(leftover: &Leftover, caps: Option<Capabilities>, max_sends: u32) -> Decision {
    match leftover {
        Leftover::Unclaimed { send_count } if *send_count >= max_sends => Decision::GiveUp,
        Leftover::Unclaimed { .. } => Decision::Requeue,
        Leftover::BeforeCalling { send_count } if *send_count >= max_sends => Decision::GiveUp,
        Leftover::BeforeCalling { .. } => Decision::Abandon,
        Leftover::Accepted if caps.is_some_and(|c| c.lookup) => Decision::Resume,
        Leftover::Calling if caps.is_some_and(|c| c.idempotent_create || c.lookup) => Decision::Resume,
        // An accepted job on a provider that is no longer configured, or a call that
        // nothing can prove: stop, and say so.
        Leftover::Calling | Leftover::Accepted => Decision::Unknown,
    }
}

/// What an adapter can prove after an ambiguous outcome (a lost answer, a crash mid-call).
///
/// The engine never calls the provider again for a task whose execution reached phase
/// `calling` unless one of these says it is safe (DESIGN §3, "no blind resend").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// The provider honours a client idempotency key: resending with the same key returns
    /// the original result and charges once.
    pub idempotent_create: bool,
    /// Submits return a job id that can be polled, and recent jobs can be listed to find one
    /// whose create answer was lost (matched by the marker the adapter sends).
    pub lookup: bool,
}

/// Whether `bytes` are an HEIC/HEIF photo (an iPhone's usual format, not decoded: refused).
pub fn is_heic(bytes: &[u8]) -> bool {
    bytes.len() >= 12
        && &bytes[4..8] == b"ftyp"
        && matches!(&bytes[8..12], b"heic" | b"heix" | b"hevc" | b"hevx" | b"heim" | b"heis" | b"mif1" | b"msf1")
}

/// Sniff the media type of image bytes from their magic numbers; `None` if they are not a
/// PNG, JPEG or WebP image.
pub fn sniff_image(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(&[0xff, 0xd8, 0xff]) {
        Some("image/jpeg")
    } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

/// The file extension tally uses for a media type.
pub fn extension(media_type: &str) -> &'static str {
    match media_type {
        "image/jpeg" => "jpg",
        "image/webp" => "webp",
        _ => "png",
    }
}

/// How the dispatcher orders ready envelopes of one provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DispatchOrder {
    /// Lanes interleaved by weight, fairness keys by stride scheduling, the recovery lane capped
    /// by the reserve and by the slow start after a circuit closed.
    #[default]
    Fair,
    /// By due time only (the order before lanes existed; kept as the benchmarks' baseline).
    Fifo,
}

/// A language of the page and of the plain-words messages (the owner's language).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Lang {
    En,
    ZhCn,
}

impl Lang {
    /// The BCP 47 tag (`en`, `zh-CN`): `<html lang>` and the catalogue's key.
    pub fn tag(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::ZhCn => "zh-CN",
        }
    }

    /// `en` / `zh-CN` (also `zh`, `zh-Hans`, any case); `None` for others.
    pub fn parse(s: &str) -> Option<Lang> {
        let s = s.trim().to_ascii_lowercase();
        if s == "en" || s.starts_with("en-") {
            Some(Lang::En)
        } else if s == "zh" || s.starts_with("zh-cn") || s.starts_with("zh-hans") || s == "zh-sg" {
            Some(Lang::ZhCn)
        } else {
            None
        }
    }
}

/// [`whole_number`] for a field that must be present.
pub fn whole<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    use serde::de::Error;
    whole_number(d)?.ok_or_else(|| D::Error::custom("expected a whole number, not null"))
}

/// An optional whole number in a request body, as JSON Schema's `integer` reads it: `2` and
/// `2.0` alike (a generated client may send either); `2.5` is refused in plain words.
pub fn whole_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    use serde::de::Error;
    let n: Option<serde_json::Number> = serde::Deserialize::deserialize(d)?;
    match n {
        None => Ok(None),
        Some(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Ok(Some(i)),
            (None, Some(f)) if f.fract() == 0.0 && f.abs() < 9.0e15 => Ok(Some(f as i64)),
            _ => Err(D::Error::custom(format!("{n} is not a whole number"))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heic_is_told_from_other_iso_media_files() {
        assert!(is_heic(b"\0\0\0\x18ftypheic\0\0\0\0") && is_heic(b"\0\0\0\x18ftypmif1\0\0\0\0"));
        assert!(!is_heic(b"\0\0\0\x18ftypisom\0\0\0\0") && !is_heic(b"\x89PNG\r\n\x1a\n\0\0\0\0"));
    }

    const NONE: Capabilities = Capabilities { idempotent_create: false, lookup: false };
    const IDEM: Capabilities = Capabilities { idempotent_create: true, lookup: false };
    const LOOKUP: Capabilities = Capabilities { idempotent_create: false, lookup: true };

    #[test]
    fn recovery_table() {
        use Decision::*;
        let cases = [
            (Leftover::Unclaimed { send_count: 1 }, Some(NONE), Requeue),
            (Leftover::Unclaimed { send_count: 10 }, Some(NONE), GiveUp),
            (Leftover::BeforeCalling { send_count: 1 }, Some(NONE), Abandon),
            (Leftover::BeforeCalling { send_count: 10 }, Some(NONE), GiveUp),
            (Leftover::Calling, Some(IDEM), Resume),
            (Leftover::Calling, Some(LOOKUP), Resume),
            (Leftover::Accepted, Some(LOOKUP), Resume),
            (Leftover::Calling, Some(NONE), Unknown),
            (Leftover::Calling, None, Unknown),
            (Leftover::Accepted, Some(NONE), Unknown),
        ];
        for (left, caps, want) in cases {
            assert_eq!(decide(&left, caps, 10), want, "{left:?} {caps:?}");
        }
    }

    /// A running execution decides, whatever the hand-off count: a resumed execution's lost
    /// hand-off is never "undeliverable".
    #[test]
    fn leftovers_are_classified_by_the_running_execution() {
        assert_eq!(Leftover::of(None, 3), Leftover::Unclaimed { send_count: 3 });
        assert_eq!(Leftover::of(Some(Phase::Claimed), 99), Leftover::BeforeCalling { send_count: 99 });
        assert_eq!(Leftover::of(Some(Phase::Calling), 99), Leftover::Calling);
        assert_eq!(Leftover::of(Some(Phase::Accepted), 99), Leftover::Accepted);
        assert_eq!(decide(&Leftover::of(Some(Phase::Accepted), 99), Some(LOOKUP), 1), Decision::Resume);
    }

    #[test]
    fn backoff_grows_caps_and_jitters() {
        let (b, m) = (Duration::from_millis(100), Duration::from_millis(1000));
        assert_eq!(backoff(1, b, m, 1.0), Duration::from_millis(100));
        assert_eq!(backoff(3, b, m, 1.0), Duration::from_millis(400));
        assert_eq!(backoff(30, b, m, 1.0), m);
        assert_eq!(backoff(3, b, m, 0.0), Duration::from_millis(200));
    }

    #[test]
    fn unknown_message_is_honest() {
        let m = status_message(TaskStatus::Unknown, None, false, Charge::Possible);
        assert!(m.contains("cannot be confirmed") && m.contains("retries have stopped") && m.contains("charged"));
        let m = status_message(TaskStatus::Unknown, Some("the answer was lost."), false, Charge::Possible);
        assert!(m.starts_with("The result cannot be confirmed: the answer was lost. Automatic"), "{m}");
    }

    #[test]
    fn charges_combine_by_weight_and_money_reads_plainly() {
        assert_eq!(Charge::None.max(Charge::Refused), Charge::Refused);
        assert_eq!(Charge::Charged.max(Charge::Possible), Charge::Charged);
        assert_eq!(Charge::Possible.max(Charge::Refused), Charge::Possible);
        assert!(Charge::Possible.may_cost() && Charge::Charged.may_cost());
        assert!(!Charge::None.may_cost() && !Charge::Refused.may_cost());
        assert_eq!(to_micros(0.04) * 3, to_micros(0.12), "integer sums are exact");
        assert_eq!(money(to_micros(5.0), "USD"), "$5.00");
        assert_eq!(money(to_micros(0.04), "USD"), "$0.04");
        assert_eq!(money(to_micros(0.0125), "EUR"), "€0.0125");
        assert_eq!(money(to_micros(1.5), "CHF"), "1.50 CHF");
    }

    /// The English words are the catalogue's, unchanged; the same states read in Chinese,
    /// their said reasons rendered in the language.
    #[test]
    fn status_messages_come_from_the_catalogue_in_both_languages() {
        assert_eq!(words::t(Lang::En, "status.unknown"), UNKNOWN_MESSAGE);
        let m = status_message(TaskStatus::Queued, Some("queued behind 2 earlier tasks."), false, Charge::None);
        assert_eq!(m, "Queued behind 2 earlier tasks. Nothing has been sent to the provider yet.");
        assert_eq!(status_message(TaskStatus::Failed, None, false, Charge::None), "Failed:");
        let zh = |s, r: &str| status_message_in(Lang::ZhCn, s, Some(r), false, Charge::Possible);
        let lost = words::say_with("say.answer_lost", &[("message", "reset")]);
        let behind = words::say_with("say.behind", &[("count", &words::say_with("say.earlier_tasks", &[("n", "2")]))]);
        let rejected = words::say_with("say.rejected", &[("message", "bad prompt")]);
        assert_eq!(
            zh(TaskStatus::Unknown, &lost),
            "无法确认结果：请求已经到达服务商，但它的回复丢失了（reset）。自动重试已经停止。再次生成是一次新的操作，可能会再次收费。"
        );
        assert_eq!(zh(TaskStatus::Queued, &behind), "排在前面 2 个任务后面。还没有向服务商发送任何东西。");
        assert_eq!(zh(TaskStatus::Failed, &rejected), "失败：服务商拒绝了这个请求：bad prompt。");
        assert_eq!(status_name(Lang::ZhCn, TaskStatus::Unknown), "结果未知");
    }

    #[test]
    fn a_running_cancel_claims_a_charge_only_when_one_may_exist() {
        let free = status_message(TaskStatus::Running, None, true, Charge::None);
        assert!(!free.contains("charged"), "{free}");
        let paid = status_message(TaskStatus::Running, None, true, Charge::Possible);
        assert!(paid.contains("may be charged"), "{paid}");
    }

    #[test]
    fn statuses_round_trip() {
        for s in TaskStatus::ALL {
            assert_eq!(TaskStatus::parse(s.as_str()), Some(*s));
        }
    }
}
