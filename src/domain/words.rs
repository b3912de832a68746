//! The one message catalogue of tally's plain words, in the owner's language (English or
//! Simplified Chinese): the page's words, the task JSON's sentences, the CLI's (which prints
//! what the API answers) and the history lines. It is `web/assets/messages.json`, embedded;
//! the page reads the same file (`web::i18n`). Every key exists in both languages with the
//! same `{parameters}`: `web::i18n`'s tests check it.
//!
//! Two ways a message comes out of it:
//! - made in a language: [`t`] and [`tf`] (a key, and its parameters by name);
//! - said before, in English, and shown later in another language ([`localize`]): the store
//!   writes its reasons and history lines as English text (old databases hold them so, and
//!   tests and acceptance checks read them), and the keys starting with `say.` are their
//!   templates. A stored line is matched against those English templates, and re-made from
//!   the matching key in the wanted language, its parameters translated the same way when
//!   they are themselves sentences of the catalogue (a reason inside a retry's line). Text no
//!   template matches (a provider's own words, a line an older version wrote differently) is
//!   shown as it is: nothing is lost, it is only not translated.
//!
//! Pure: the catalogue is compiled in, and nothing here does I/O.

use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;

use super::Lang;

/// The catalogue, embedded. It lives with the page's assets because the page serves it too.
const MESSAGES: &str = include_str!("../web/assets/messages.json");

/// The prefix of the templates [`localize`] matches stored English text against.
pub const SAID: &str = "say.";

/// The prefix of the `say.` templates that join a list ("{a}, {b}"): [`localize`] uses one
/// only where every part of the list is itself a line of the catalogue (a list of shot names),
/// never to re-punctuate text it does not know.
pub const JOIN: &str = "say.join.";

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

/// A line the daemon stores (a reason, a history line, a wait), in English, made from the
/// catalogue's `say.` template `key`: the one place its words are written, so the read path
/// ([`localize`]) re-makes it in the owner's language from the very template it came from.
/// Write stored lines through this, never as a literal beside the catalogue (a unit test
/// checks that every key named this way exists).
pub fn say(key: &str) -> String {
    t(Lang::En, key)
}

/// [`say`] with its `{name}` parameters filled in.
pub fn say_with(key: &str, params: &[(&str, &str)]) -> String {
    tf(Lang::En, key, params)
}

/// The English text a `say.` template begins with, up to its first parameter (all of it when
/// it has none): what a reader of stored lines recognises a line of that template by, taken
/// from the catalogue so it cannot drift from the writer's [`say_with`].
pub fn said_prefix(key: &str) -> String {
    match pieces(&t(Lang::En, key)).into_iter().next() {
        Some(Piece::Text(text)) => text,
        _ => String::new(),
    }
}

/// The English text a `say.` template ends with, after its last parameter (empty when it ends
/// with one): the other half of [`said_prefix`].
pub fn said_suffix(key: &str) -> String {
    match pieces(&t(Lang::En, key)).into_iter().last() {
        Some(Piece::Text(text)) => text,
        _ => String::new(),
    }
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

/// The `say.` templates in the order they are tried: the most literal text first (a tie
/// between two readings goes to the earlier), then by key, so the order never changes between
/// runs.
fn said_templates() -> &'static [(String, Vec<Piece>)] {
    static T: OnceLock<Vec<(String, Vec<Piece>)>> = OnceLock::new();
    T.get_or_init(|| {
        let mut all: Vec<(String, Vec<Piece>)> = catalogue()
            .get("en")
            .map(|m| m.iter().filter(|(k, _)| k.starts_with(SAID)).map(|(k, v)| (k.clone(), pieces(v))).collect())
            .unwrap_or_default();
        let literal = |p: &[Piece]| -> usize {
            p.iter().map(|x| if let Piece::Text(t) = x { t.chars().count() } else { 0 }).sum()
        };
        all.sort_by(|a, b| literal(&b.1).cmp(&literal(&a.1)).then_with(|| a.0.cmp(&b.0)));
        all
    })
}

/// At most this many readings of one text by one template are weighed ([`best`]): a bound on
/// the work for a text full of a template's separators; real lines have one or two.
const MAX_READINGS: usize = 16;

/// Every way `text` matches `pieces` from piece `i` on (up to [`MAX_READINGS`] in all),
/// each as its parameter values in order, collected into `found`. A parameter may take any
/// text before an occurrence of the literal after it (two parameters never touch: a test
/// checks the templates), shortest first.
fn readings<'p, 'a>(
    pieces: &'p [Piece],
    i: usize,
    text: &'a str,
    out: &mut Vec<(&'p str, &'a str)>,
    found: &mut Vec<Vec<(&'p str, &'a str)>>,
) {
    if found.len() >= MAX_READINGS {
        return;
    }
    match pieces.get(i) {
        None => {
            if text.is_empty() {
                found.push(out.clone());
            }
        }
        Some(Piece::Text(lit)) => {
            if let Some(rest) = text.strip_prefix(lit.as_str()) {
                readings(pieces, i + 1, rest, out, found);
            }
        }
        Some(Piece::Param(name)) => match pieces.get(i + 1) {
            None => {
                out.push((name, text));
                readings(pieces, i + 1, "", out, found);
                out.pop();
            }
            Some(Piece::Text(lit)) => {
                let mut from = 0;
                while let Some(j) = text[from..].find(lit.as_str()) {
                    let at = from + j;
                    out.push((name, &text[..at]));
                    readings(pieces, i + 1, &text[at..], out, found);
                    out.pop();
                    // The next occurrence may overlap this one: step one character on.
                    from = at + text[at..].chars().next().map_or(1, char::len_utf8);
                }
            }
            Some(Piece::Param(_)) => {}
        },
    }
}

/// A line the daemon wrote in English (a stored reason, a history line, a wait), in `lang`:
/// re-made from the `say.` template its English matches, with its parameters translated in
/// turn; as it is when no template matches, and always as it is in English.
///
/// When several templates match, or one in several ways (a provider's message may itself
/// contain "; " or " — "), the reading that explains the most of the text by the catalogue's
/// own words wins: the literal text of every template used, at every level, counted in
/// characters; the first such reading on a tie.
pub fn localize(lang: Lang, text: &str) -> String {
    if lang == Lang::En {
        return text.to_string();
    }
    let mut search = Search { lang, memo: HashMap::new(), tries: 0 };
    search.best(text, 0).map_or_else(|| text.to_string(), |(_, s)| s)
}

/// How deep templates nest in one line ([`localize`]): a line, its reason, a list in it and
/// the list's items (a list of n items nests n deep, through its joiner).
const MAX_DEPTH: u8 = 12;

/// At most this many template tries for one line ([`localize`]): a provider's message full of
/// separators ("; ", " — ") cannot make a translation slow; past it, the rest of the line
/// is shown as it was written.
const MAX_TRIES: usize = 100_000;

/// One [`localize`]: the best reading of each piece of the line already weighed (pieces are
/// slices of the line, so their place and length name them), and the tries so far.
struct Search {
    lang: Lang,
    memo: HashMap<(usize, usize), Option<(usize, String)>>,
    tries: usize,
}

impl Search {
    /// The best reading of `text` (a slice of the line): how many characters the catalogue
    /// explains, and the text in the language; `None` when no template matches.
    fn best(&mut self, text: &str, depth: u8) -> Option<(usize, String)> {
        // Every template has English words; a number, an amount or an id has none to match.
        if depth > MAX_DEPTH || !text.bytes().any(|b| b.is_ascii_alphabetic()) {
            return None;
        }
        let id = (text.as_ptr() as usize, text.len());
        if let Some(known) = self.memo.get(&id) {
            return known.clone();
        }
        let mut found: Option<(usize, String)> = None;
        for (key, ps) in said_templates() {
            if self.tries >= MAX_TRIES {
                break;
            }
            self.tries += 1;
            // A template whose literal words are not all in the text cannot match it: skipped
            // before its parameters are tried at every separator of a long line.
            if !ps.iter().all(|p| match p {
                Piece::Text(t) => text.contains(t.as_str()),
                Piece::Param(_) => true,
            }) {
                continue;
            }
            let mut all = Vec::new();
            readings(ps, 0, text, &mut Vec::new(), &mut all);
            let literal: usize = ps.iter().map(|p| if let Piece::Text(t) = p { t.chars().count() } else { 0 }).sum();
            // A joiner (a list's separator) reads a text only when the catalogue explains
            // every part of it: an English sentence with a comma in it is not a list.
            let joiner = key.starts_with(JOIN);
            'reading: for values in all {
                let mut score = literal;
                let mut words = Vec::with_capacity(values.len());
                for (n, v) in values {
                    match self.best(v, depth + 1) {
                        Some((s, w)) => {
                            score += s;
                            words.push((n, w));
                        }
                        None if joiner => continue 'reading,
                        None => words.push((n, v.to_string())),
                    }
                }
                if found.as_ref().is_none_or(|(s, _)| score > *s) {
                    let made =
                        fill(&t(self.lang, key), |name| words.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone()));
                    found = Some((score, made));
                }
            }
        }
        self.memo.insert(id, found.clone());
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every line written through [`say`] or [`say_with`] names a `say.` key the catalogue has
    /// in both languages, with the same parameters the call fills (a literal key; a key built
    /// at run time is checked by the test of its own module).
    #[test]
    fn every_key_said_exists_in_both_languages() {
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
        walk(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut files);
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

    #[test]
    fn templates_split_into_text_and_parameters() {
        assert_eq!(
            pieces("attempt {n}: {\"json\"} {x"),
            vec![Piece::Text("attempt ".into()), Piece::Param("n".into()), Piece::Text(": {\"json\"} {x".into())]
        );
        assert_eq!(tf(Lang::En, "say.accepted", &[("job", "j-1")]), "the provider accepted the job as j-1");
    }

    #[test]
    fn no_two_parameters_touch_and_every_template_has_text() {
        for (key, ps) in said_templates() {
            assert!(ps.iter().any(|p| matches!(p, Piece::Text(_))), "{key} is only parameters");
            for w in ps.windows(2) {
                assert!(!matches!(w, [Piece::Param(_), Piece::Param(_)]), "{key}: two parameters touch");
            }
        }
    }

    /// Lines exactly as the store and the worker write them come back in Chinese, nested
    /// reasons and money included; English is untouched; unknown text is kept.
    #[test]
    fn stored_english_lines_come_back_in_chinese() {
        let zh = |s: &str| localize(Lang::ZhCn, s);
        assert_eq!(
            zh("attempt 2: sending the request to the provider (its price: about $0.04)"),
            "第 2 次尝试：正在把请求发给服务商（价格约 $0.04）"
        );
        assert_eq!(
            zh("the request reached the provider, but its answer was lost (connection reset); this provider cannot \
                prove whether the request ran or was charged; automatic retries stopped — it may have been charged \
                (about $0.04)"),
            "请求已经到达服务商，但它的回复丢失了（connection reset）；这个服务商无法证明请求有没有执行、有没有收费；\
             自动重试已停止——可能已经收费（约 $0.04）"
        );
        assert_eq!(
            zh(
                "attempt 1 did not go through (the request never reached the provider: timed out); trying again in 2.5 s"
            ),
            "第 1 次尝试没有成功（请求没有到达服务商：timed out）；2.5 秒后再试"
        );
        assert_eq!(
            zh("Held: today's budget of $0.40 is spent — raise it or wait until tomorrow (00:00 UTC). $0.40 is spent \
                or possibly spent today and this request would cost about $0.04; nothing was sent."),
            "已暂停：今天的预算 $0.40 已经用完——提高预算，或者等到明天（UTC 00:00）。今天已花费或可能已花费 $0.40，\
             这次请求大约要 $0.04；什么都没有发送。"
        );
        assert_eq!(
            zh("Held: this month's budget for provider `flux` of $20.00 is spent — raise it or wait until next month \
                (the 1st, 00:00 UTC). $19.98 is spent or possibly spent this month and this request would cost about \
                $0.04; nothing was sent."),
            "已暂停：本月服务商 flux 的预算 $20.00 已经用完——提高预算，或者等到下个月（1 号 UTC 00:00）。\
             本月已花费或可能已花费 $19.98，这次请求大约要 $0.04；什么都没有发送。"
        );
        // The shop's zone (`[ui] time_zone`) names the midnight a budget waits for.
        assert_eq!(
            zh("Held: today's budget of 5.00 CNY is spent — raise it or wait until tomorrow (00:00 Asia/Shanghai). \
                5.00 CNY is spent or possibly spent today and this request would cost about 0.30 CNY; nothing was sent."),
            "已暂停：今天的预算 5.00 CNY 已经用完——提高预算，或者等到明天（Asia/Shanghai 00:00）。\
             今天已花费或可能已花费 5.00 CNY，这次请求大约要 0.30 CNY；什么都没有发送。"
        );
        assert_eq!(zh("a provider said: something new"), "a provider said: something new");
        // Several ways to split one line: the one the catalogue explains best.
        assert_eq!(zh("2 of 5 done, 1 unknown, 1 failed"), "已完成 2/5，1 个结果未知，1 个失败");
        // A provider's message full of separators stays quick, and its line still reads.
        let noisy = format!("the provider rejected the request: {}", "a — b; c, d failed ".repeat(60));
        let started = std::time::Instant::now();
        let out = zh(&noisy);
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
        assert!(out.starts_with("服务商拒绝了这个请求："), "{out}");
        let en = "attempt 2: sending the request to the provider (its price: about $0.04)";
        assert_eq!(localize(Lang::En, en), en);
    }

    /// A set's own timeline, why it cannot be delivered (a list of shot names inside), a
    /// delivery file's why and the budget's refusals, as the store and engine write them,
    /// come back in Chinese; a comma in text the catalogue does not know is left alone.
    #[test]
    fn set_timelines_delivery_reasons_and_budget_errors_come_back_in_chinese() {
        let zh = |s: &str| localize(Lang::ZhCn, s);
        assert_eq!(zh("set created with 3 shot(s), 6 image(s) to generate"), "图片组已创建：3 个镜头，要生成 6 张图片");
        assert_eq!(
            zh("image a-1 (candidate 2, task t-9) is now the choice for shot 1 (Main photo), instead of image a-0"),
            "镜头 1（主图）现在选定图片 a-1（候选图 2，任务 t-9），不再是图片 a-0"
        );
        assert_eq!(
            zh("edited before sending: shot 1 (Main photo) prompt; shot 2 (Lifestyle scene) role; style removed"),
            "发送前修改了：镜头 1（主图）的提示词；镜头 2（场景图）的类型；删除了风格"
        );
        assert_eq!(zh("edited before anything was sent: prompt, role"), "发送前修改了：提示词、镜头类型");
        assert_eq!(zh("duplicated as set s-2"), "已复制为图片组 s-2");
        assert_eq!(
            zh("3 shots have no chosen image: Main photo, Lifestyle scene (shot 2), Lifestyle scene (shot 3)"),
            "3 个镜头还没有选定图片：主图、场景图（镜头 2）、场景图（镜头 3）"
        );
        assert_eq!(
            zh("the Main photo's chosen image is 256 px wide; amazon asks for at least 1000 px"),
            "主图选定的图片宽 256 像素；amazon 要求至少 1000 像素"
        );
        assert_eq!(
            zh("cannot write main.jpg in /srv/out: the disk is full"),
            "无法在 /srv/out 里写入 main.jpg：磁盘满了"
        );
        assert_eq!(
            zh("daily budget of provider `flux` -1 must be an amount of money, 0 or more"),
            "服务商 flux 的每日预算 -1 必须是一个金额，0 或以上"
        );
        assert_eq!(zh("delivery not found"), "找不到这次交付");
        assert_eq!(
            zh(
                "shot 2 (Lifestyle scene) is being generated now; so its words can no longer be changed. Duplicate the \
                set to make a new one with your changes."
            ),
            "镜头 2（场景图）正在生成；所以它的文字不能再改了。复制这个图片组，用你的修改新建一个。"
        );
        // A joiner never re-punctuates words it does not know.
        assert_eq!(zh("Main photo, something else"), "Main photo, something else");
        assert_eq!(zh("the prompt is empty; x"), "the prompt is empty; x");
    }

    #[test]
    fn full_stops_are_added_only_in_chinese() {
        assert_eq!(full_stop(Lang::ZhCn, "已收费"), "已收费。");
        assert_eq!(full_stop(Lang::ZhCn, "已收费。"), "已收费。");
        assert_eq!(full_stop(Lang::ZhCn, "done."), "done。");
        assert_eq!(full_stop(Lang::En, "charged"), "charged");
    }
}
