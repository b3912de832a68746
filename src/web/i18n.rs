//! The page's language: English or Simplified Chinese, from one message catalogue
//! (`assets/messages.json`, read through `domain::words`, which the task JSON and the history
//! lines use too; every key in both languages with the same parameters: a test checks it, and
//! that every key the page uses exists). The language is, in order: the page's own switch
//! (the `tally_lang` cookie), `ui.language` in the configuration, the browser's
//! `Accept-Language`, English (`api::lang::choose`: the API answers by the same rule).
//! The served HTML says which in `<html lang>`; its `{{t:KEY}}` placeholders are filled in
//! here, and the chosen language's messages go into the page (a JSON block the scripts read
//! through `tally.t(KEY)`).

pub use crate::api::lang::{LANG_COOKIE, choose};
pub use crate::domain::Lang;
pub use crate::domain::words::t;
use crate::domain::words::{SAID, catalogue};

/// `html` in `lang`: `{{LANG}}` → the tag, `{{t:KEY}}` → the message (HTML-escaped), and
/// `{{MESSAGES}}` → the language's messages as JSON for the scripts.
pub fn render(html: &str, lang: Lang) -> String {
    let mut out = String::with_capacity(html.len() + 4096);
    let mut rest = html;
    while let Some(i) = rest.find("{{t:") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 4..];
        match after.find("}}") {
            Some(j) => {
                out.push_str(&super::escape_html(&t(lang, &after[..j])));
                rest = &after[j + 2..];
            }
            None => {
                out.push_str(&rest[i..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    // The page's words; the daemon's own lines (`say.…`) it receives already translated.
    let messages: std::collections::BTreeMap<&String, &String> = catalogue()
        .get(lang.tag())
        .map(|m| m.iter().filter(|(k, _)| !k.starts_with(SAID)).collect())
        .unwrap_or_default();
    // `</` cannot end the JSON block early: it is escaped.
    let json = serde_json::to_string(&messages).unwrap_or_else(|_| "{}".into()).replace("</", "<\\/");
    out.replace("{{LANG}}", lang.tag()).replace("{{MESSAGES}}", &json)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::words::Catalogue;
    use axum::http::{HeaderMap, header};

    #[test]
    fn every_key_exists_in_both_languages_and_every_key_used_exists() {
        let c: Catalogue = serde_json::from_str(include_str!("assets/messages.json")).expect("messages.json is JSON");
        assert_eq!(&c, catalogue(), "the catalogue parses");
        let en: Vec<&String> = c["en"].keys().collect();
        let zh: Vec<&String> = c["zh-CN"].keys().collect();
        assert_eq!(en, zh, "the same keys in en and zh-CN");
        assert!(c["zh-CN"].values().all(|v| !v.trim().is_empty()));
        // The same parameters, by name, in both languages.
        let params = |v: &str| -> std::collections::BTreeSet<String> {
            crate::domain::words::pieces(v)
                .into_iter()
                .filter_map(|p| match p {
                    crate::domain::words::Piece::Param(n) => Some(n),
                    crate::domain::words::Piece::Text(_) => None,
                })
                .collect()
        };
        for (key, en) in &c["en"] {
            assert_eq!(params(en), params(&c["zh-CN"][key]), "`{key}` has the same parameters in en and zh-CN");
        }
        // Every key the page uses: {{t:KEY}} in the HTML (and the sign-in link's page in mod.rs),
        // T.t("KEY") / T.tf("KEY", …) in the scripts (and t("KEY") / tf("KEY", …) / msg("KEY")
        // inside core.js).
        let sources = [
            include_str!("assets/index.html"),
            include_str!("assets/signed-out.html"),
            include_str!("mod.rs"),
            include_str!("assets/core.js"),
            include_str!("assets/jobs.js"),
            include_str!("assets/job.js"),
            include_str!("assets/sets.js"),
            include_str!("assets/set_edit.js"),
            include_str!("assets/drafts.js"),
            include_str!("assets/compare.js"),
            include_str!("assets/deliver.js"),
            include_str!("assets/budget.js"),
            include_str!("assets/app.js"),
        ];
        let mut used = 0;
        for src in sources {
            for (open, close) in [
                ("{{t:", "}}"),
                ("T.t(\"", "\""),
                ("T.tf(\"", "\""),
                (" t(\"", "\""),
                ("tf(\"", "\""),
                ("msg(\"", "\""),
            ] {
                let mut rest = src;
                while let Some(i) = rest.find(open) {
                    let after = &rest[i + open.len()..];
                    let Some(j) = after.find(close) else { break };
                    let key = &after[..j];
                    assert!(c["en"].contains_key(key), "`{key}` is used but not in the catalogue");
                    used += 1;
                    rest = &after[j..];
                }
            }
        }
        assert!(used > 20, "the page uses the catalogue ({used} uses found)");
    }

    /// Every key the daemon and the CLI name in their code exists: `t(lang, "KEY")`,
    /// `tf(lang, "KEY", …)`, `word(lang, "KEY")` and the CLI's `label(lang, "NAME")`
    /// (`cli.label.NAME`), `l("NAME")` likewise.
    #[test]
    fn every_key_the_daemon_and_the_cli_use_exists() {
        let c = catalogue();
        let sources = [
            include_str!("../cli/tasks.rs"),
            include_str!("../cli/sets.rs"),
            include_str!("../cli/spend.rs"),
            include_str!("../cli/held.rs"),
            include_str!("../cli/deliveries.rs"),
            include_str!("../api/task_json.rs"),
            include_str!("../api/task_help.rs"),
            include_str!("../api/mod.rs"),
        ];
        let mut used = 0;
        for src in sources {
            for (open, prefix) in [
                ("t(lang, \"", ""),
                ("tf(lang, \"", ""),
                ("word(lang, \"", ""),
                ("label(lang, \"", "cli.label."),
                ("l(\"", "cli.label."),
            ] {
                let mut rest = src;
                while let Some(i) = rest.find(open) {
                    // A call of that very name: `l(` is not the end of `detail(`.
                    let whole = !rest[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_');
                    let after = &rest[i + open.len()..];
                    let Some(j) = after.find('"') else { break };
                    if !whole {
                        rest = &after[j..];
                        continue;
                    }
                    let key = format!("{prefix}{}", &after[..j]);
                    assert!(c["en"].contains_key(&key), "`{key}` is used but not in the catalogue");
                    used += 1;
                    rest = &after[j..];
                }
            }
        }
        assert!(used > 40, "the CLI uses the catalogue ({used} uses found)");
    }

    #[test]
    fn the_language_follows_the_switch_then_the_config_then_the_browser() {
        let mut h = HeaderMap::new();
        assert_eq!(choose(&h, None), Lang::En);
        h.insert(header::ACCEPT_LANGUAGE, "zh-CN,zh;q=0.9,en;q=0.8".parse().expect("header"));
        assert_eq!(choose(&h, None), Lang::ZhCn);
        assert_eq!(choose(&h, Some(Lang::En)), Lang::En, "the configuration wins over the browser");
        h.insert(header::COOKIE, "tally_session=x; tally_lang=zh-CN".parse().expect("header"));
        assert_eq!(choose(&h, Some(Lang::En)), Lang::ZhCn, "the page's switch wins");
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT_LANGUAGE, "fr, en;q=0.5, zh;q=0.7".parse().expect("header"));
        assert_eq!(choose(&h, None), Lang::ZhCn, "by weight");
        assert_eq!(Lang::parse("de"), None);
        let html = render("<html lang=\"{{LANG}}\"><a>{{t:nav.jobs}}</a><script>{{MESSAGES}}</script>", Lang::ZhCn);
        assert!(html.starts_with("<html lang=\"zh-CN\"><a>任务</a>"), "{html}");
    }
}
