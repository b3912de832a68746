//! The one message catalogue of tally's plain words, in the owner's language (English or
//! Simplified Chinese): the page's words, the task JSON's sentences, the CLI's (which prints
//! what the API answers) and the history lines. It is `web/assets/messages.json`, embedded;
//! the page reads the same file (`web::i18n`). Every key exists in both languages with the
//! same `{parameters}`: `web::i18n`'s tests check it.
//!
//! Two ways a message comes out of it:
//! - made in a language now: [`t`] and [`tf`] (a key, and its parameters by name);
//! - said now and shown later, in whatever language the reader asks for: [`say`] and
//!   [`say_with`] make a *said line* — the key of a `say.` template and its parameters,
//!   encoded in the text the store keeps (reasons, history lines, waits, refusals) — and
//!   [`render`] makes it in a language when it is shown ([`english`] for logs, files and the
//!   API's English fields). A parameter may itself be a said line (the reason inside a retry's
//!   line), rendered in the same language. Nothing is ever matched back from English: text
//!   that is not a said line (a provider's own words, a line an older version stored in
//!   English) is shown as it is.
//!
//! The encoding: [`OPEN`], the key, then — when there are parameters — [`SEP`] and a JSON
//! object of them (strings), then [`CLOSE`]. A stored text may hold several said lines and
//! plain text around them. JSON escapes control characters inside strings, so a said line
//! nested in a parameter never shows a raw [`CLOSE`] to the scan of the outer one.
//!
//! Pure: the catalogue is compiled in, and nothing here does I/O.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use super::Lang;

/// The catalogue, embedded. It lives with the page's assets because the page serves it too.
const MESSAGES: &str = include_str!("../web/assets/messages.json");

/// The prefix of the keys of the templates said lines are made from ([`say`]).
pub const SAID: &str = "say.";

/// Opens a said line in stored text ([`say`]): STX, a character no sentence contains.
pub const OPEN: char = '\u{2}';
/// Parts a said line's key from its parameters: the unit separator.
pub const SEP: char = '\u{1f}';
/// Closes a said line: ETX.
pub const CLOSE: char = '\u{3}';

/// How deep said lines nest through their parameters before the rest is shown without its
/// markers: a bound on the work for a text nobody here wrote; real lines nest three or four
/// deep (a set's line, a list, its items). Each level's JSON escapes the one inside it again,
/// so a nested line's quotes and markers cost twice as many characters per level.
const MAX_DEPTH: u8 = 16;

/// Language tag → key → message.
pub type Catalogue = BTreeMap<String, BTreeMap<String, String>>;

/// The parsed catalogue (`{}` if the embedded file were broken; the tests make sure it is not).
pub fn catalogue() -> &'static Catalogue {
    static C: OnceLock<Catalogue> = OnceLock::new();
    C.get_or_init(|| serde_json::from_str(MESSAGES).unwrap_or_default())
}

/// One message in `lang` (English, then the key itself, when missing).
pub fn t(lang: Lang, key: &str) -> String {
    let c = catalogue();
    c.get(lang.tag())
        .and_then(|m| m.get(key))
        .or_else(|| c.get("en").and_then(|m| m.get(key)))
        .cloned()
        .unwrap_or_else(|| key.to_string())
}

/// Whether the catalogue has `key`.
pub fn has(key: &str) -> bool {
    catalogue().get("en").is_some_and(|m| m.contains_key(key))
}

/// One message in `lang` with its `{name}` parameters filled in.
pub fn tf(lang: Lang, key: &str, params: &[(&str, &str)]) -> String {
    fill(&t(lang, key), |name| params.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string()))
}

/// A line the daemon stores to show later (a reason, a history line, a wait, a refusal): the
/// catalogue's `say.` template `key`, encoded, rendered in the reader's language by [`render`].
/// Write stored lines through this, never as English text (a unit test checks that every key
/// named this way exists in both languages).
pub fn say(key: &str) -> String {
    format!("{OPEN}{key}{CLOSE}")
}

/// [`say`] with its `{name}` parameters. A value may be a said line itself, or hold some: it
/// is rendered in the same language as the line around it.
pub fn say_with(key: &str, params: &[(&str, &str)]) -> String {
    if params.is_empty() {
        return say(key);
    }
    let map: serde_json::Map<String, serde_json::Value> =
        params.iter().map(|(n, v)| ((*n).to_string(), serde_json::Value::String((*v).to_string()))).collect();
    format!("{OPEN}{key}{SEP}{}{CLOSE}", serde_json::Value::Object(map))
}

/// Whether `text` holds a said line.
pub fn is_said(text: &str) -> bool {
    text.contains(OPEN)
}

/// `text` in `lang`: each said line in it made from its template in that language (its
/// parameters rendered in turn), the text around them as it is. A text with no said line (a
/// provider's words, a line an older version stored in English) comes back unchanged.
pub fn render(lang: Lang, text: &str) -> String {
    render_at(lang, text, 0)
}

/// [`render`] in English: for logs, files, and the API's English fields.
pub fn english(text: &str) -> String {
    render(Lang::En, text)
}

/// [`render`] of an optional text.
pub fn render_opt(lang: Lang, text: Option<&str>) -> Option<String> {
    text.map(|t| render(lang, t))
}

fn render_at(lang: Lang, text: &str, depth: u8) -> String {
    if !is_said(text) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    for part in parts(text) {
        match part {
            Part::Text(t) => out.push_str(t),
            Part::Said(key, params) if depth < MAX_DEPTH && has(key) => {
                out.push_str(&fill(&t(lang, key), |name| {
                    params.get(name).and_then(|v| v.as_str()).map(|v| render_at(lang, v, depth + 1))
                }));
            }
            // A key this version does not have (written by a newer one), or nesting past the
            // bound: its parameters' words, so nothing said is lost.
            Part::Said(key, params) => {
                let values: Vec<String> = params
                    .values()
                    .filter_map(|v| v.as_str())
                    .map(|v| if depth < MAX_DEPTH { render_at(lang, v, depth + 1) } else { strip(v) })
                    .collect();
                out.push_str(&if values.is_empty() {
                    key.to_string()
                } else {
                    format!("{key}: {}", values.join("; "))
                });
            }
        }
    }
    out
}

/// `text` without said lines' markers (its keys and JSON left as they are).
fn strip(text: &str) -> String {
    text.chars().filter(|c| ![OPEN, SEP, CLOSE].contains(c)).collect()
}

/// One part of a stored text: plain text, or a said line (its key and parameters).
enum Part<'a> {
    Text(&'a str),
    Said(&'a str, serde_json::Map<String, serde_json::Value>),
}

/// A stored text's parts in order. A said line cut short (no [`CLOSE`]) or with parameters
/// that do not parse is shown as text, without its markers.
fn parts(text: &str) -> Vec<Part<'_>> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(OPEN) {
        if i > 0 {
            out.push(Part::Text(&rest[..i]));
        }
        let after = &rest[i + OPEN.len_utf8()..];
        let Some(j) = after.find(CLOSE) else {
            out.push(Part::Text(after));
            return out;
        };
        let body = &after[..j];
        let (key, params) = body.split_once(SEP).unwrap_or((body, ""));
        let params = if params.is_empty() {
            Some(serde_json::Map::new())
        } else {
            serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(params).ok()
        };
        match params {
            Some(p) => out.push(Part::Said(key, p)),
            None => out.push(Part::Text(body)),
        }
        rest = &after[j + CLOSE.len_utf8()..];
    }
    if !rest.is_empty() {
        out.push(Part::Text(rest));
    }
    out
}

/// `text` with `f` applied to its own words — the text around its said lines and every
/// parameter value, at every depth — while the said lines themselves are kept, so a cleaning
/// step (a length bound, a redaction, no control characters) never cuts one apart.
pub fn map_words(text: &str, f: &dyn Fn(&str) -> String) -> String {
    map_at(text, f, 0)
}

fn map_at(text: &str, f: &dyn Fn(&str) -> String, depth: u8) -> String {
    if !is_said(text) {
        return f(text);
    }
    let mut out = String::with_capacity(text.len());
    for part in parts(text) {
        match part {
            Part::Text(t) => out.push_str(&f(&strip(t))),
            Part::Said(key, params) => {
                let values: Vec<(String, String)> = params
                    .iter()
                    .filter_map(|(n, v)| v.as_str().map(|v| (n.clone(), v)))
                    .map(|(n, v)| (n, if depth < MAX_DEPTH { map_at(v, f, depth + 1) } else { f(&strip(v)) }))
                    .collect();
                let values: Vec<(&str, &str)> = values.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
                out.push_str(&say_with(key, &values));
            }
        }
    }
    out
}

/// The key of the said line `text` is, when it is exactly one (nothing around it).
pub fn said_key(text: &str) -> Option<&str> {
    match parts(text).as_slice() {
        [Part::Said(key, _)] => Some(key),
        _ => None,
    }
}

/// Parameter `name` of the first said line of `key` in `text` (not looking inside
/// parameters), as stored: a said line itself, possibly.
pub fn said_param(text: &str, key: &str, name: &str) -> Option<String> {
    parts(text).into_iter().find_map(|p| match p {
        Part::Said(k, params) if k == key => params.get(name).and_then(|v| v.as_str()).map(str::to_string),
        _ => None,
    })
}

/// A sentence in `lang` ends with its full stop: Chinese text gets "。" unless it already
/// ends a sentence; English is left as it is (its sentences carry their own).
pub fn full_stop(lang: Lang, text: &str) -> String {
    match lang {
        Lang::En => text.to_string(),
        Lang::ZhCn => {
            let t = text.trim_end().trim_end_matches('.');
            if t.ends_with(['。', '！', '？', '!', '?']) || t.is_empty() { t.to_string() } else { format!("{t}。") }
        }
    }
}

/// One piece of a template: literal text, or a named parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Piece {
    Text(String),
    Param(String),
}

/// A template's pieces: `{name}` (lower-case letters, digits, `_`) is a parameter; any other
/// brace is text.
pub fn pieces(template: &str) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut rest = template;
    while let Some(i) = rest.find('{') {
        let after = &rest[i + 1..];
        let name_len = after
            .find('}')
            .filter(|&j| j > 0 && after[..j].chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'));
        match name_len {
            Some(j) => {
                text.push_str(&rest[..i]);
                if !text.is_empty() {
                    out.push(Piece::Text(std::mem::take(&mut text)));
                }
                out.push(Piece::Param(after[..j].to_string()));
                rest = &after[j + 1..];
            }
            None => {
                text.push_str(&rest[..=i]);
                rest = after;
            }
        }
    }
    text.push_str(rest);
    if !text.is_empty() {
        out.push(Piece::Text(text));
    }
    out
}

/// `template` with each parameter replaced by `value(name)` (left as `{name}` when `None`).
fn fill(template: &str, value: impl Fn(&str) -> Option<String>) -> String {
    pieces(template)
        .into_iter()
        .map(|p| match p {
            Piece::Text(t) => t,
            Piece::Param(n) => value(&n).unwrap_or_else(|| format!("{{{n}}}")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `.rs` file under `src/`.
    fn rust_sources() -> Vec<std::path::PathBuf> {
        fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for e in std::fs::read_dir(dir).expect("src").flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    out.push(p);
                }
            }
        }
        let mut files = Vec::new();
        // Every room's sources: this crate (`crates/tally-base`) compiles from the project's
        // `src/`, beside the `tally` crate's.
        walk(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../src"), &mut files);
        files
    }

    /// Every line written through [`say`] or [`say_with`] names a `say.` key the catalogue has
    /// in both languages, with the same parameters the call fills (a literal key; a key built
    /// at run time is checked by the test of its own module).
    #[test]
    fn every_key_said_exists_in_both_languages() {
        let files = rust_sources();
        let c = catalogue();
        let mut used = 0;
        for f in files {
            let text = std::fs::read_to_string(&f).expect("read a source file");
            for open in ["say(\"", "say_with(\""] {
                for (i, _) in text.match_indices(open) {
                    if text[..i].ends_with(|ch: char| ch.is_alphanumeric() || ch == '_') {
                        continue;
                    }
                    let after = &text[i + open.len()..];
                    let key = &after[..after.find('"').expect("a closing quote")];
                    for lang in ["en", "zh-CN"] {
                        assert!(c[lang].contains_key(key), "{}: `{key}` is not in the catalogue ({lang})", f.display());
                    }
                    assert!(key.starts_with(SAID), "{}: `{key}` is not a said line (`say.`)", f.display());
                    used += 1;
                }
            }
        }
        assert!(used > 60, "stored lines are made from the catalogue ({used} found)");
    }

    /// Every sentence is written once, in the catalogue: no string literal of the Rust sources
    /// (six words or more) is also a message's text, where the two could drift apart.
    #[test]
    fn no_sentence_is_written_both_in_rust_and_in_the_catalogue() {
        let files = rust_sources();
        let messages: Vec<&String> = catalogue().values().flat_map(|m| m.values()).collect();
        let mut twice = Vec::new();
        for f in files {
            let text = std::fs::read_to_string(&f).expect("read a source file");
            for literal in text.split('"').skip(1).step_by(2) {
                let s = literal.trim();
                let plain = !s.contains(['{', '}', '\\', '\n']) && s.starts_with(|c: char| c.is_ascii_alphabetic());
                if plain && s.len() >= 30 && s.split_whitespace().count() >= 6 && messages.iter().any(|m| m.contains(s))
                {
                    twice.push(format!("{}: {s}", f.display()));
                }
            }
        }
        assert!(twice.is_empty(), "written both in Rust and in the catalogue: {twice:#?}");
    }

    #[test]
    fn templates_split_into_text_and_parameters() {
        assert_eq!(
            pieces("attempt {n}: {\"json\"} {x"),
            vec![Piece::Text("attempt ".into()), Piece::Param("n".into()), Piece::Text(": {\"json\"} {x".into())]
        );
        assert_eq!(tf(Lang::En, "say.accepted", &[("job", "j-1")]), "the provider accepted the job as j-1");
        assert_eq!(english(&say_with("say.accepted", &[("job", "j-1")])), "the provider accepted the job as j-1");
    }

    /// Said lines, nested reasons and money included, come back in each language from their
    /// keys; text around them, and text that is not a said line, is kept as it is.
    #[test]
    fn said_lines_render_in_the_readers_language() {
        let (zh, en) = (|s: &str| render(Lang::ZhCn, s), |s: &str| render(Lang::En, s));
        let calling = say_with("say.calling_price", &[("n", "2"), ("amount", "$0.04")]);
        assert_eq!(zh(&calling), "第 2 次尝试：正在把请求发给服务商（价格约 $0.04）");
        assert_eq!(en(&calling), "attempt 2: sending the request to the provider (its price: about $0.04)");
        // A reason inside a retry's line: each level in the language.
        let never = say_with("say.never_reached", &[("message", "timed out")]);
        let retry = say_with("say.retry_in", &[("n", "1"), ("reason", &never), ("secs", "2.5")]);
        assert_eq!(zh(&retry), "第 1 次尝试没有成功（请求没有到达服务商：timed out）；2.5 秒后再试");
        assert_eq!(
            en(&retry),
            "attempt 1 did not go through (the request never reached the provider: timed out); trying again in 2.5 s"
        );
        let lost = say_with("say.answer_lost", &[("message", "connection reset")]);
        let stopped = say_with("say.retries_stopped", &[("reason", &lost)]);
        assert_eq!(zh(&stopped), "请求已经到达服务商，但它的回复丢失了（connection reset）；自动重试已停止");
        let held = say_with(
            "say.budget_held",
            &[
                ("this", &say("say.period_todays")),
                ("limit", "$0.40"),
                ("when", &say("say.period_tomorrow")),
                ("spent", "$0.40"),
                ("now", &say("say.period_today")),
                ("cost", "$0.04"),
            ],
        );
        assert_eq!(
            zh(&held),
            "已暂停：今天的预算 $0.40 已经用完——提高预算，或者等到明天（UTC 00:00）。今天已花费或可能已花费 $0.40，\
             这次请求大约要 $0.04；什么都没有发送。"
        );
        // A list of said lines through a joiner, each item in the language.
        let (p, r) = (
            say_with("say.set_edited_prompt", &[("shot", "1"), ("role", &say("say.role_main"))]),
            say_with("say.set_edited_role", &[("shot", "2"), ("role", &say("say.role_scene"))]),
        );
        let what = say_with("say.join.semicolon", &[("a", &p), ("b", &r)]);
        let edited = say_with("say.set_edited", &[("what", &what)]);
        assert_eq!(zh(&edited), "发送前修改了：镜头 1（主图）的提示词；镜头 2（场景图）的类型");
        // Text that is not a said line, and text around one, stays as it is.
        assert_eq!(zh("a provider said: something new"), "a provider said: something new");
        assert_eq!(zh(&format!("before {} after", say("say.period_today"))), "before 今天 after");
        // A provider's words holding the markers' characters cannot break out of a parameter
        // (an opening one with no end is dropped there).
        let odd = say_with("say.rejected", &[("message", "x\u{3} y \u{2}z")]);
        assert_eq!(en(&format!("{odd}!")), "the provider rejected the request: x\u{3} y z!");
    }

    /// A said line cut short, with parameters that do not parse, with a key this version does
    /// not have, or nested without end shows its words without markers, and never panics.
    #[test]
    fn damaged_or_unknown_said_lines_show_their_words() {
        assert_eq!(render(Lang::En, "\u{2}say.rejected\u{1f}{\"message\":\"x"), "say.rejected\u{1f}{\"message\":\"x");
        assert_eq!(render(Lang::En, "a \u{2}say.rejected\u{1f}not json\u{3} b"), "a say.rejected\u{1f}not json b");
        let key = ["say.", "from_a_newer_version"].concat();
        let newer = say_with(&key, &[("what", "the file")]);
        assert_eq!(render(Lang::ZhCn, &newer), "say.from_a_newer_version: the file");
        let mut deep = say_with("say.rejected", &[("message", "bottom")]);
        // (Each level escapes the one inside it again, so the text doubles in its escapes per
        // level: real lines nest three or four deep; this goes just past the bound.)
        for _ in 0..MAX_DEPTH + 2 {
            deep = say_with("say.rejected", &[("message", &deep)]);
        }
        let out = render(Lang::En, &deep);
        assert!(out.starts_with("the provider rejected the request: the provider rejected"), "{out}");
        assert!(!out.contains(OPEN) && !out.contains(CLOSE), "{out}");
        assert_eq!(said_key(&say("say.period_today")), Some("say.period_today"));
        assert_eq!(said_key("today"), None);
        let accepted = say_with("say.accepted", &[("job", "j-7")]);
        assert_eq!(said_param(&accepted, "say.accepted", "job").as_deref(), Some("j-7"));
    }

    /// A cleaning step sees only the words: the said lines around them stay whole.
    #[test]
    fn map_words_cleans_the_words_and_keeps_the_said_lines() {
        let line = format!("{}\n tail", say_with("say.rejected", &[("message", "a\nb")]));
        let clean = map_words(&line, &|p: &str| p.replace('\n', " "));
        assert_eq!(english(&clean), "the provider rejected the request: a b  tail");
        assert_eq!(
            said_key(&map_words(&say("say.period_today"), &|p: &str| p.to_uppercase())),
            Some("say.period_today")
        );
        assert_eq!(map_words("plain\n", &|p: &str| p.trim().to_string()), "plain");
    }

    #[test]
    fn full_stops_are_added_only_in_chinese() {
        assert_eq!(full_stop(Lang::ZhCn, "已收费"), "已收费。");
        assert_eq!(full_stop(Lang::ZhCn, "已收费。"), "已收费。");
        assert_eq!(full_stop(Lang::ZhCn, "done."), "done。");
        assert_eq!(full_stop(Lang::En, "charged"), "charged");
    }
}
