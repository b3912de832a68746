//! Delivery file names: a profile's `file_name` pattern (over `{product}`, `{role}`,
//! `{index}`, `{profile}`, `{ext}`) expanded into names that are safe on any target.
//!
//! Invariants, enforced here: a name has no path separator, no control character, does not
//! start with `.` and is never `..`, so it always names a file directly inside the target's
//! folder or prefix; it is at most [`MAX_NAME_BYTES`] bytes; and the names of one delivery
//! ([`file_names`]) are distinct, even when the pattern leaves out `{index}` and two shots
//! share a role. Names are deterministic (the same inputs give the same names), so a delivery
//! resumed after a crash writes the names it recorded before.

use std::collections::{HashMap, HashSet};

/// The placeholders a pattern may use.
pub const PLACEHOLDERS: [&str; 5] = ["product", "role", "index", "profile", "ext"];

/// The longest file name made, in bytes (file systems allow 255; this leaves room for a
/// target's temporary suffix).
pub const MAX_NAME_BYTES: usize = 200;

/// The longest a product or role becomes in a name, in characters.
const MAX_PART: usize = 48;

/// What one file's name is made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NameParts<'a> {
    /// The set's product, as the owner typed it (any script): `{product}`.
    pub product: &'a str,
    /// The shot's role (`main`, `selling_point`, …), `None` for a shot without one: `{role}`.
    pub role: Option<&'a str>,
    /// The shot's number in the set, from 1 (as the page says "shot 1"): `{index}`.
    pub index: usize,
    /// The profile's name: `{profile}`.
    pub profile: &'a str,
    /// The extension without the dot (`jpg`, `png`): `{ext}`.
    pub ext: &'a str,
}

/// Check a `file_name` pattern: only the known placeholders, balanced braces, `{ext}` present
/// (a file's type shows in its name), no path separator or control character, no `..`, not
/// starting with `.`, at most 100 characters.
pub fn check_pattern(pattern: &str) -> Result<(), String> {
    if pattern.trim().is_empty() {
        return Err("is empty".into());
    }
    if pattern.chars().count() > 100 {
        return Err("is longer than 100 characters".into());
    }
    if let Some(c) = pattern.chars().find(|c| matches!(c, '/' | '\\') || c.is_control()) {
        return Err(format!(
            "`{pattern}` contains {c:?}: a file name cannot hold a path separator or control character"
        ));
    }
    if pattern.starts_with('.') || pattern.contains("..") {
        return Err(format!("`{pattern}` must not start with '.' or contain \"..\""));
    }
    let mut rest = pattern;
    let mut has_ext = false;
    while let Some(open) = rest.find(['{', '}']) {
        if rest[open..].starts_with('}') {
            return Err(format!("`{pattern}` has a '}}' with no '{{' before it"));
        }
        let after = &rest[open + 1..];
        let close = after.find('}').ok_or_else(|| format!("`{pattern}` has a '{{' that is not closed"))?;
        let key = &after[..close];
        if !PLACEHOLDERS.contains(&key) {
            return Err(format!(
                "`{{{key}}}` is not a placeholder; use {}",
                PLACEHOLDERS.iter().map(|p| format!("{{{p}}}")).collect::<Vec<_>>().join(", ")
            ));
        }
        has_ext |= key == "ext";
        rest = &after[close + 1..];
    }
    if !has_ext {
        return Err(format!("`{pattern}` must contain {{ext}} (e.g. \"{{product}}_{{role}}.{{ext}}\")"));
    }
    Ok(())
}

/// `text` as a part of a file name: lower-case letters and digits of any script kept
/// (`绿茶壶` stays `绿茶壶`), every other run of characters one `-`, at most `max`
/// characters, cut at a word boundary when it can be; `None` when nothing is left. The one
/// slug of tally's file names (the set zip's and a delivery's).
pub fn slug(text: &str, max: usize) -> Option<String> {
    let mut out = String::new();
    let mut dash = false;
    for c in text.chars().flat_map(char::to_lowercase) {
        if c.is_alphanumeric() {
            if dash && !out.is_empty() {
                out.push('-');
            }
            dash = false;
            out.push(c);
        } else {
            dash = true;
        }
    }
    if out.chars().count() > max {
        let cut: String = out.chars().take(max).collect();
        let at_boundary = out.chars().nth(max) == Some('-');
        out = match cut.rfind('-') {
            _ if at_boundary => cut,
            Some(i) if i >= max / 2 => cut[..i].to_string(),
            _ => cut,
        };
    }
    (!out.is_empty()).then_some(out)
}

/// Expand `pattern` (already accepted by [`check_pattern`]) for one file. Each placeholder's
/// value is made safe first ([`slug`]; a product or role with nothing left becomes `product`
/// or `shot`), then the whole name is made safe again and cut to [`MAX_NAME_BYTES`] keeping
/// its extension. Not unique by itself: use [`file_names`] for a delivery's files.
pub fn expand(pattern: &str, parts: &NameParts<'_>) -> String {
    let mut out = String::new();
    let mut rest = pattern;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else {
            out.push_str(&rest[open..]);
            rest = "";
            break;
        };
        let value = match &after[..close] {
            "product" => slug(parts.product, MAX_PART).unwrap_or_else(|| "product".into()),
            "role" => parts.role.and_then(|r| slug(r, MAX_PART)).unwrap_or_else(|| "shot".into()),
            "index" => parts.index.to_string(),
            "profile" => slug(parts.profile, 64).unwrap_or_else(|| "profile".into()),
            "ext" => slug(parts.ext, 8).unwrap_or_else(|| "bin".into()),
            other => format!("{{{other}}}"),
        };
        out.push_str(&value);
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    safe(&out, parts.ext)
}

/// A name made safe whatever it holds: separators and control characters become `-`, runs of
/// dots collapse to one, no leading dots or spaces, at most [`MAX_NAME_BYTES`] (the stem is
/// cut at a character boundary and `.ext` kept).
fn safe(name: &str, ext: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        let c =
            if matches!(c, '/' | '\\' | ':' | '*' | '?' | '"' | '<' | '>' | '|') || c.is_control() { '-' } else { c };
        if c == '.' && out.ends_with('.') {
            continue;
        }
        out.push(c);
    }
    let out = out.trim_start_matches(['.', ' ', '-']).trim_end_matches([' ', '.']).to_string();
    let out = if out.is_empty() { format!("file.{}", slug(ext, 8).unwrap_or_else(|| "bin".into())) } else { out };
    if out.len() <= MAX_NAME_BYTES {
        return out;
    }
    let suffix = out.rfind('.').map(|i| out[i..].to_string()).filter(|s| s.len() <= 16).unwrap_or_default();
    let mut stem = out[..out.len() - suffix.len()].to_string();
    while stem.len() + suffix.len() > MAX_NAME_BYTES {
        stem.pop();
    }
    format!("{}{suffix}", stem.trim_end_matches(['-', '.', ' ']))
}

/// The names of one delivery's files, in the order given, all distinct: each is
/// [`expand`]ed, then, when the pattern has no `{index}`, names that clash get `-{index}`
/// before the extension (two shots with one role), and any clash left (two files of one
/// shot) gets `-2`, `-3`, … in order.
pub fn file_names(pattern: &str, parts: &[NameParts<'_>]) -> Vec<String> {
    let first: Vec<String> = parts.iter().map(|p| expand(pattern, p)).collect();
    let mut count: HashMap<&str, usize> = HashMap::new();
    for n in &first {
        *count.entry(n.as_str()).or_default() += 1;
    }
    // Only a pattern without `{index}` can be told apart by the shot's number.
    let by_index = !pattern.contains("{index}");
    let second: Vec<String> =
        first
            .iter()
            .zip(parts)
            .map(|(n, p)| {
                if by_index && count[n.as_str()] > 1 { with_suffix(n, p.ext, &p.index.to_string()) } else { n.clone() }
            })
            .collect();
    let mut taken: HashSet<String> = HashSet::new();
    let mut out = Vec::with_capacity(second.len());
    for (n, p) in second.into_iter().zip(parts) {
        let mut name = n.clone();
        let mut k = 2;
        while taken.contains(&name) {
            name = with_suffix(&n, p.ext, &k.to_string());
            k += 1;
        }
        taken.insert(name.clone());
        out.push(name);
    }
    out
}

/// `name` with `-tag` before its `.ext` (or at its end when it does not end in `.ext`).
fn with_suffix(name: &str, ext: &str, tag: &str) -> String {
    let dot_ext = format!(".{}", slug(ext, 8).unwrap_or_else(|| "bin".into()));
    let stem = name.strip_suffix(&dot_ext);
    let made = match stem {
        Some(stem) => format!("{stem}-{tag}{dot_ext}"),
        None => format!("{name}-{tag}"),
    };
    safe(&made, ext)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::profile::DEFAULT_FILE_NAME;

    fn parts<'a>(product: &'a str, role: Option<&'a str>, index: usize) -> NameParts<'a> {
        NameParts { product, role, index, profile: "amazon", ext: "jpg" }
    }

    #[test]
    fn the_acceptance_pattern_expands() {
        let p = "{product}_{role}_{profile}.{ext}";
        check_pattern(p).expect("valid");
        let n = expand(
            p,
            &NameParts { product: "green teapot", role: Some("main"), index: 1, profile: "tall600", ext: "png" },
        );
        assert_eq!(n, "green-teapot_main_tall600.png");
        assert_eq!(
            expand(DEFAULT_FILE_NAME, &parts("Red Sneaker", Some("selling_point"), 3)),
            "red-sneaker_selling-point_3_amazon.jpg"
        );
    }

    #[test]
    fn names_are_safe_whatever_the_product_is_called() {
        for product in ["../../etc/passwd", "a/b\\c", "..", ".hidden", "CON", "x\0y\n", "   ", "", "😀😀"] {
            let n = expand(DEFAULT_FILE_NAME, &parts(product, Some("../main"), 1));
            assert!(!n.contains('/') && !n.contains('\\') && !n.starts_with('.'), "{product:?} → {n}");
            assert!(!n.contains("..") && !n.chars().any(char::is_control), "{product:?} → {n}");
            assert!(n.ends_with(".jpg") && n.len() <= MAX_NAME_BYTES, "{product:?} → {n}");
        }
        assert_eq!(expand(DEFAULT_FILE_NAME, &parts("../../etc/passwd", None, 1)), "etc-passwd_shot_1_amazon.jpg");
        assert_eq!(expand(DEFAULT_FILE_NAME, &parts("", None, 2)), "product_shot_2_amazon.jpg");
    }

    #[test]
    fn non_ascii_products_stay_readable_and_long_ones_are_cut() {
        assert_eq!(expand(DEFAULT_FILE_NAME, &parts("绿色 茶壶", Some("main"), 1)), "绿色-茶壶_main_1_amazon.jpg");
        assert_eq!(
            expand(DEFAULT_FILE_NAME, &parts("Crème Brûlée Pot", Some("main"), 1)),
            "crème-brûlée-pot_main_1_amazon.jpg"
        );
        let long = "茶".repeat(500);
        let n = expand("{product}{product}{product}{product}{product}_{role}.{ext}", &parts(&long, Some("main"), 1));
        assert!(n.len() <= MAX_NAME_BYTES && n.ends_with(".jpg"), "{} bytes: {n}", n.len());
    }

    #[test]
    fn two_shots_with_one_role_get_distinct_names() {
        let p = "{product}_{role}.{ext}";
        let ps = [parts("mug", Some("scene"), 1), parts("mug", Some("main"), 2), parts("mug", Some("scene"), 3)];
        assert_eq!(file_names(p, &ps), ["mug_scene-1.jpg", "mug_main.jpg", "mug_scene-3.jpg"]);
        // Two files of the same shot (every candidate): numbered in order.
        let ps = [parts("mug", Some("scene"), 1), parts("mug", Some("scene"), 1), parts("mug", Some("scene"), 1)];
        assert_eq!(file_names(p, &ps), ["mug_scene-1.jpg", "mug_scene-1-2.jpg", "mug_scene-1-3.jpg"]);
        // With {index} nothing needs changing, and two files of one shot are numbered.
        let ps = [parts("mug", Some("scene"), 1), parts("mug", Some("scene"), 2), parts("mug", Some("scene"), 2)];
        assert_eq!(
            file_names(DEFAULT_FILE_NAME, &ps),
            ["mug_scene_1_amazon.jpg", "mug_scene_2_amazon.jpg", "mug_scene_2_amazon-2.jpg"]
        );
    }

    #[test]
    fn bad_patterns_are_refused_in_words() {
        for (p, words) in [
            ("{product}/{role}.{ext}", "path separator"),
            ("..{product}.{ext}", "must not start"),
            ("{product}..{ext}", "must not start with '.' or contain"),
            ("{product}_{colour}.{ext}", "`{colour}` is not a placeholder"),
            ("{product.{ext}", "is not a placeholder"),
            ("{product}_{role", "not closed"),
            ("{product}}.{ext}", "'}' with no '{'"),
            ("{product}_{role}", "must contain {ext}"),
            ("", "is empty"),
        ] {
            let e = check_pattern(p).expect_err(p);
            assert!(e.contains(words), "{p}: {e}");
        }
    }
}
