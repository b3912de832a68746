//! The CLI's own words for people in the config's `ui.language` (`cli.*` keys of the one
//! catalogue, `domain::words`): the labels of `tally status`, `tally set status`, `tally
//! deliveries …` padded to their column by the width a terminal gives them (a Chinese
//! character takes two columns), and a status in plain words. English output is unchanged
//! by this module; machine formats (`--json`, CSV) never pass through it.

use crate::domain::Lang;
use crate::domain::words::t;

/// How many terminal columns `s` takes: two for an East Asian wide character, one otherwise.
pub(super) fn width(s: &str) -> usize {
    s.chars().map(|c| if wide(c) { 2 } else { 1 }).sum()
}

/// Whether `c` is drawn two columns wide (CJK ideographs, kana, Hangul, full-width forms and
/// CJK punctuation: the ranges the catalogue's Chinese uses).
fn wide(c: char) -> bool {
    matches!(c as u32,
        0x1100..=0x115F | 0x2E80..=0x303E | 0x3041..=0x33FF | 0x3400..=0x4DBF | 0x4E00..=0x9FFF
        | 0xA000..=0xA4CF | 0xAC00..=0xD7A3 | 0xF900..=0xFAFF | 0xFE30..=0xFE4F | 0xFF00..=0xFF60 | 0xFFE0..=0xFFE6)
}

/// `s` followed by spaces up to `cols` terminal columns (at least one space after it).
pub(super) fn pad(s: &str, cols: usize) -> String {
    let w = width(s);
    format!("{s}{}", " ".repeat(cols.saturating_sub(w).max(1)))
}

/// `s` followed by spaces up to `cols` terminal columns, as `{:<cols}` pads ASCII.
pub(super) fn fit(s: &str, cols: usize) -> String {
    format!("{s}{}", " ".repeat(cols.saturating_sub(width(s))))
}

/// The column labels of a record (`tally status`, a delivery): this wide, label included.
pub(super) const LABEL: usize = 10;

/// Label `key` (`cli.label.*`) in `lang`, padded to [`LABEL`] columns.
pub(super) fn label(lang: Lang, key: &str) -> String {
    pad(&t(lang, &format!("cli.label.{key}")), LABEL)
}

/// A task's, set's or delivery's `status` as a word for people: the catalogue's word in
/// Chinese (a task's `say.status_*`, a set's `word.*`, a delivery's `dstate.*`), the API's
/// name itself in English.
pub(super) fn status(lang: Lang, name: &str) -> String {
    if lang == Lang::En {
        return name.to_string();
    }
    for key in [format!("say.status_{name}"), format!("word.{name}"), format!("dstate.{name}")] {
        if crate::domain::words::has(&key) {
            return t(lang, &key);
        }
    }
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_line_up_by_terminal_width_and_english_is_unchanged() {
        assert_eq!(label(Lang::En, "job"), "job       ");
        assert_eq!(label(Lang::En, "retry_of"), "retry of  ");
        let zh = label(Lang::ZhCn, "job");
        assert_eq!(width(&zh), LABEL, "{zh:?}");
        assert_eq!(width("收费"), 4);
        assert_eq!(pad("a-very-long-label", 4), "a-very-long-label ");
        assert_eq!(fit("结果未知", 9), "结果未知 ");
        assert_eq!(fit("unknown", 9), format!("{:<9}", "unknown"));
        assert_eq!(status(Lang::En, "succeeded"), "succeeded");
        assert_eq!(status(Lang::ZhCn, "unknown"), t(Lang::ZhCn, "say.status_unknown"));
        assert_eq!(status(Lang::ZhCn, "something_new"), "something_new");
    }
}
