//! The documentation against the code: every Markdown page (README.md, DEVELOPING.md, ARCHITECTURE.md and docs/**) is read,
//! and
//!
//! - every `tally <command> [<subcommand>] [--flag…]` it shows in code (blocks and inline
//!   spans) is a command of the binary's clap tree, with flags that command (or a global
//!   option) takes;
//! - every tally route `/v1/...` it names (with its method, when one stands before it) is in
//!   the OpenAPI document the daemon serves (`api::openapi::document`), path parameters
//!   matching `{…}` or `<…>`;
//! - every configuration key of `config.example.toml` and of the config parser's raw structs
//!   (src/config) is documented under its section's heading in docs/guide/config.md;
//! - every relative link between the pages leads to a file that exists, and a `#anchor` to a
//!   heading of that page;
//! - every `cargo test` command it shows names a package, test binary and library module that
//!   exist (the workspace has two packages: `tally` and `tally-base`).
//!
//! Each check collects every problem and fails naming the page and what it says.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::CommandFactory;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// README.md, DEVELOPING.md, ARCHITECTURE.md and every `.md` under docs/, as (path relative to the repository, text).
fn pages() -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).expect("read docs") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "md") {
                out.push(p);
            }
        }
    }
    let mut files = vec![root().join("README.md"), root().join("DEVELOPING.md"), root().join("ARCHITECTURE.md")];
    walk(&root().join("docs"), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(root()).expect("inside").to_string_lossy().replace('\\', "/");
            (rel, std::fs::read_to_string(&p).expect("read page"))
        })
        .collect()
}

/// The code of a page: fenced blocks, indented blocks and inline spans, one string each.
fn code(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fence: Option<String> = None;
    let mut indented = String::new();
    for line in text.lines() {
        if let Some(block) = fence.as_mut() {
            if line.trim_start().starts_with("```") {
                out.push(std::mem::take(block));
                fence = None;
            } else {
                block.push_str(line);
                block.push('\n');
            }
            continue;
        }
        if line.trim_start().starts_with("```") {
            fence = Some(String::new());
            continue;
        }
        if line.starts_with("    ") {
            indented.push_str(line);
            indented.push('\n');
            continue;
        }
        if !indented.is_empty() {
            out.push(std::mem::take(&mut indented));
        }
    }
    if !indented.is_empty() {
        out.push(indented);
    }
    // Inline spans, outside fenced and indented blocks (a span may run over a line break).
    let prose: String = {
        let mut s = String::new();
        let mut in_fence = false;
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                in_fence = !in_fence;
                continue;
            }
            if !in_fence && !line.starts_with("    ") {
                s.push_str(line);
                s.push('\n');
            }
        }
        s
    };
    let parts: Vec<&str> = prose.split('`').collect();
    for (i, part) in parts.iter().enumerate() {
        if i % 2 == 1 && i + 1 < parts.len() {
            out.push(part.replace('\n', " "));
        }
    }
    out
}

/// The name a token carries once quoting and punctuation around it are dropped.
fn bare(token: &str) -> &str {
    token.trim_start_matches(['$', '(', '`', '"', '\'']).trim_end_matches(['`', ')', ',', ';', '.', ':', '"', '\''])
}

/// Every `tally …` invocation in a piece of code: the words after `tally`, up to the end of
/// the command (`&&`, `|`, `;`, a comment, a closing parenthesis or backtick).
fn invocations(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for line in code.lines() {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        for (i, t) in tokens.iter().enumerate() {
            let lead = t.trim_start_matches(['$', '(', '`', '"', '\'']);
            if lead != "tally" {
                continue;
            }
            let mut words = Vec::new();
            for w in &tokens[i + 1..] {
                if matches!(*w, "&&" | "||" | "|" | ";" | "#" | "&") || w.starts_with('#') {
                    break;
                }
                let ends = w.ends_with(')') || w.ends_with('`') || w.ends_with(';');
                words.push(bare(w).to_string());
                if ends {
                    break;
                }
            }
            out.push(words);
        }
    }
    out
}

/// Whether `w` reads as a command name (`set`, `mock-provider`), not an argument.
fn is_name(w: &str) -> bool {
    w.chars().next().is_some_and(|c| c.is_ascii_lowercase()) && w.chars().all(|c| c.is_ascii_lowercase() || c == '-')
}

fn long_flags(cmd: &clap::Command) -> BTreeSet<String> {
    cmd.get_arguments().filter_map(|a| a.get_long().map(str::to_string)).chain(["help".to_string()]).collect()
}

/// The problems with one invocation against the clap tree, if any.
fn check_invocation(root_cmd: &clap::Command, words: &[String]) -> Option<String> {
    let globals = long_flags(root_cmd);
    let mut cmd = root_cmd;
    let mut path = vec!["tally".to_string()];
    let mut i = 0;
    // Global options before the command.
    while i < words.len() && words[i].starts_with("--") {
        let flag = words[i].trim_start_matches("--").split('=').next().unwrap_or("").to_string();
        if !globals.contains(&flag) {
            return Some(format!("`{}` takes no `--{flag}`", path.join(" ")));
        }
        i += if matches!(flag.as_str(), "config" | "data-dir") && !words[i].contains('=') { 2 } else { 1 };
    }
    // The command and its subcommands.
    while i < words.len() && cmd.has_subcommands() {
        let w = &words[i];
        if !is_name(w) {
            break;
        }
        match cmd.find_subcommand(w) {
            Some(sub) => {
                cmd = sub;
                path.push(w.clone());
                i += 1;
            }
            None => return Some(format!("`{}` has no subcommand `{w}`", path.join(" "))),
        }
    }
    if path.len() == 1 {
        return None; // `tally`, `tally --help`, `tally <command>`: no command named
    }
    let flags = long_flags(cmd);
    for w in &words[i..] {
        if let Some(flag) = w.strip_prefix("--") {
            let flag = flag.split('=').next().unwrap_or("");
            let flag = flag.trim_end_matches(|c: char| !(c.is_ascii_alphanumeric() || c == '-'));
            if !flag.is_empty() && !flags.contains(flag) && !globals.contains(flag) {
                return Some(format!("`{}` takes no `--{flag}`", path.join(" ")));
            }
        }
    }
    None
}

#[test]
fn every_tally_command_shown_is_a_real_command() {
    let cli = tally::cli::Cli::command();
    let mut problems = Vec::new();
    let mut seen = 0;
    for (page, text) in pages() {
        for c in code(&text) {
            for words in invocations(&c) {
                seen += 1;
                if let Some(p) = check_invocation(&cli, &words) {
                    problems.push(format!("{page}: `tally {}`: {p}", words.join(" ")));
                }
            }
        }
    }
    assert!(seen > 100, "only {seen} `tally` commands found in the pages: is the scan broken?");
    assert!(problems.is_empty(), "commands the binary does not have:\n{}", problems.join("\n"));
}

/// Paths of the providers' own APIs that the pages quote bare (not after `{base_url}`).
const PROVIDER_PATHS: &[&str] = &["/v1/images/", "/v1/models/", "/v1/predictions", "/v1/responses"];

/// Every tally route a page names: (method if one stands before it, path, whether it is only
/// a prefix, written `/v1/sets…`).
fn routes(text: &str) -> Vec<(Option<String>, String, bool)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find("/v1/") {
        let start = from + at;
        from = start + 4;
        let before = &text[..start];
        let prev = before.chars().last();
        let bare_path = prev.is_none_or(|c| c.is_whitespace() || "`(\"'[|".contains(c));
        let host = {
            let b = before.trim_end_matches(|c: char| c.is_ascii_digit());
            b.ends_with("127.0.0.1:") || b.ends_with("localhost:")
        };
        if !bare_path && !host {
            continue; // a provider's path after its base URL, e.g. `{base_url}/v1/segment`
        }
        let len = text[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || "/{}<>_-.".contains(c)))
            .unwrap_or(text.len() - start);
        let path = text[start..start + len].trim_end_matches(['.', '/']).to_string();
        let prefix = text[start + len..].starts_with('…');
        if PROVIDER_PATHS.iter().any(|p| path.starts_with(p)) {
            continue;
        }
        let method = ["GET", "POST", "PUT", "PATCH", "DELETE"]
            .iter()
            .find(|m| {
                before.ends_with(&format!("{m} "))
                    && before[..before.len() - m.len() - 1].chars().last().is_none_or(|c| !c.is_ascii_alphanumeric())
            })
            .map(|m| m.to_lowercase());
        out.push((method, path, prefix));
    }
    out
}

fn segments_match(doc: &str, api: &str) -> bool {
    let d: Vec<&str> = doc.split('/').collect();
    let a: Vec<&str> = api.split('/').collect();
    d.len() == a.len()
        && d.iter().zip(&a).all(|(d, a)| {
            let param = |s: &str| (s.starts_with('{') && s.ends_with('}')) || (s.starts_with('<') && s.ends_with('>'));
            if param(a) { param(d) } else { d == a }
        })
}

#[test]
fn every_route_shown_is_in_the_openapi_document() {
    let doc = serde_json::to_value(tally::api::openapi::document()).expect("document");
    let mut ops: Vec<(String, String)> = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for m in ["get", "post", "put", "patch", "delete"] {
            if item.get(m).is_some() {
                ops.push((m.to_string(), path.clone()));
            }
        }
    }
    let mut problems = Vec::new();
    let mut seen = 0;
    for (page, text) in pages() {
        for (method, path, prefix) in routes(&text) {
            seen += 1;
            let found = ops.iter().any(|(m, p)| {
                let path_ok = if prefix { p.starts_with(&path) } else { segments_match(&path, p) };
                path_ok && method.as_ref().is_none_or(|want| want == m)
            });
            if !found {
                let m = method.map(|m| m.to_uppercase() + " ").unwrap_or_default();
                problems.push(format!("{page}: {m}{path}{}", if prefix { "…" } else { "" }));
            }
        }
    }
    assert!(seen > 50, "only {seen} routes found in the pages: is the scan broken?");
    assert!(problems.is_empty(), "routes the OpenAPI document does not have:\n{}", problems.join("\n"));
}

/// Section → keys of config.example.toml, commented-out keys included.
fn example_keys() -> BTreeMap<String, BTreeSet<String>> {
    let text = std::fs::read_to_string(root().join("config.example.toml")).expect("config.example.toml");
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut section = String::new();
    for line in text.lines() {
        let l = line.strip_prefix('#').map(|l| l.strip_prefix(' ').unwrap_or(l)).unwrap_or(line);
        if l.starts_with(' ') {
            continue; // a comment's continuation
        }
        let head = l.split('#').next().unwrap_or("").trim();
        if head.starts_with('[') && head.ends_with(']') {
            section = head.trim_matches(['[', ']']).to_string();
            continue;
        }
        if let Some((key, _)) = head.split_once(" = ")
            && !key.is_empty()
            && key.chars().all(|c| c.is_ascii_lowercase() || c == '_')
            && !section.is_empty()
        {
            out.entry(section.clone()).or_default().insert(key.to_string());
        }
    }
    out
}

/// Section → fields of the config parser's raw structs (every key a file may set).
fn parser_keys() -> BTreeMap<String, BTreeSet<String>> {
    let structs = [
        ("src/config/mod.rs", "struct RawServer", "server"),
        ("src/config/mod.rs", "struct RawStorage", "storage"),
        ("src/config/mod.rs", "struct RawNode", "node"),
        ("src/config/mod.rs", "struct RawEngine", "engine"),
        ("src/config/mod.rs", "struct RawRetention", "retention"),
        ("src/config/mod.rs", "struct RawBudget", "budget"),
        ("src/config/mod.rs", "struct RawUi", "ui"),
        ("src/config/mod.rs", "struct RawProvider", "providers"),
        ("src/config/delivery.rs", "struct RawProfile", "delivery.profiles"),
        ("src/config/delivery.rs", "struct RawTarget", "delivery.targets"),
    ];
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, name, section) in structs {
        let text = std::fs::read_to_string(root().join(file)).expect("config source");
        let start = text.find(name).unwrap_or_else(|| panic!("{file} has no {name}"));
        let body = &text[start..start + text[start..].find("\n}").expect("struct end")];
        for line in body.lines().skip(1) {
            let l = line.trim();
            if let Some((field, ty)) = l.split_once(": ")
                && !l.starts_with("//")
                && ty.starts_with("Option<")
            {
                out.entry(section.to_string()).or_default().insert(field.to_string());
            }
        }
    }
    out
}

#[test]
fn every_config_key_is_in_the_config_guide() {
    let guide = std::fs::read_to_string(root().join("docs/guide/config.md")).expect("docs/guide/config.md");
    // The guide's text under each `## `[section]`` heading.
    let mut sections: BTreeMap<String, String> = BTreeMap::new();
    let mut current = String::new();
    for line in guide.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            current = h.trim().trim_matches('`').trim_matches(['[', ']']).to_string();
            continue;
        }
        sections.entry(current.clone()).or_default().push_str(&format!("{line}\n"));
    }
    let example = example_keys();
    let parser = parser_keys();
    assert!(example.get("engine").is_some_and(|k| k.contains("lease_secs")), "config.example.toml scan: {example:?}");
    assert!(parser.get("providers").is_some_and(|k| k.contains("dashboard_url")), "parser scan: {parser:?}");
    let mut problems = Vec::new();
    for (from, keys) in [("config.example.toml", &example), ("the config parser", &parser)] {
        for (section, keys) in keys {
            let Some(text) = sections.get(section) else {
                problems.push(format!("{from}: no `## `[{section}]`` section in docs/guide/config.md"));
                continue;
            };
            for key in keys {
                if !text.contains(&format!("`{key}`")) {
                    problems.push(format!("{from}: `{section}.{key}` is not in its section of docs/guide/config.md"));
                }
            }
        }
    }
    assert!(problems.is_empty(), "undocumented configuration keys:\n{}", problems.join("\n"));
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut in_fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
        } else if !in_fence && line.starts_with('#') {
            out.insert(slug(line.trim_start_matches('#')));
        }
    }
    out
}

#[test]
fn every_relative_link_resolves() {
    let pages = pages();
    let texts: BTreeMap<String, String> = pages.iter().cloned().collect();
    let mut problems = Vec::new();
    let mut seen = 0;
    for (page, text) in &pages {
        let dir = Path::new(page).parent().unwrap_or(Path::new(""));
        let mut from = 0;
        while let Some(at) = text[from..].find("](") {
            let start = from + at + 2;
            let end = start + text[start..].find(')').unwrap_or(0);
            from = end.max(start);
            let target = &text[start..end];
            if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                continue;
            }
            seen += 1;
            let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
            // Resolve against the page's directory, `..` included.
            let mut resolved = PathBuf::new();
            for part in dir.join(file).components() {
                match part {
                    std::path::Component::ParentDir => {
                        resolved.pop();
                    }
                    std::path::Component::CurDir => {}
                    other => resolved.push(other),
                }
            }
            let rel = resolved.to_string_lossy().replace('\\', "/");
            let rel = if file.is_empty() { page.clone() } else { rel };
            if !root().join(&rel).exists() {
                problems.push(format!("{page}: ({target}): {rel} does not exist"));
                continue;
            }
            if !anchor.is_empty() && rel.ends_with(".md") {
                let heads = texts
                    .get(&rel)
                    .map(|t| anchors(t))
                    .unwrap_or_else(|| anchors(&std::fs::read_to_string(root().join(&rel)).unwrap_or_default()));
                if !heads.contains(anchor) {
                    problems.push(format!("{page}: ({target}): {rel} has no heading #{anchor}"));
                }
            }
        }
    }
    assert!(seen > 30, "only {seen} relative links found: is the scan broken?");
    assert!(problems.is_empty(), "broken links:\n{}", problems.join("\n"));
}

/// The workspace's packages, each with its test binaries (`[[test]]` names of its manifest) and
/// its library's top-level modules (`pub mod` / `pub use` names of its crate root).
fn packages() -> BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> {
    let read = |p: &str| std::fs::read_to_string(root().join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    let tests = |manifest: &str| -> BTreeSet<String> {
        let m: toml::Value = toml::from_str(&read(manifest)).expect("manifest parses");
        let list = m.get("test").and_then(|t| t.as_array()).cloned().unwrap_or_default();
        list.iter().filter_map(|t| t.get("name").and_then(|n| n.as_str()).map(str::to_string)).collect()
    };
    let modules = |crate_root: &str| -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for line in read(crate_root).lines() {
            if let Some(m) = line.strip_prefix("pub mod ") {
                out.insert(m.trim_end_matches(';').to_string());
            } else if let Some(list) = line.strip_prefix("pub use tally_base::{") {
                out.extend(list.trim_end_matches("};").split(',').map(|m| m.trim().to_string()));
            }
        }
        out
    };
    BTreeMap::from([
        ("tally".to_string(), (tests("Cargo.toml"), modules("src/lib.rs"))),
        ("tally-base".to_string(), (tests("crates/tally-base/Cargo.toml"), modules("src/base.rs"))),
    ])
}

/// The names of every module of the package's own rooms: each room and the file stems and
/// folder names under `src/<room>/` (a test filter is matched as a substring of the test's
/// path, so it may start at any module).
fn module_names(rooms: &BTreeSet<String>) -> BTreeSet<String> {
    fn walk(dir: &Path, out: &mut BTreeSet<String>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if let Some(stem) = p.file_stem().and_then(|s| s.to_str()) {
                out.insert(stem.to_string());
            }
            if p.is_dir() {
                walk(&p, out);
            }
        }
    }
    let mut out = rooms.clone();
    for room in rooms {
        walk(&root().join("src").join(room), &mut out);
    }
    out
}

/// Every `cargo test` command a page shows names a package of the workspace (`-p`), a test
/// binary of that package (`--test`), and, with `--lib`, a filter that starts with a module of
/// that package's own library: a command that quietly runs no test (the `tally` library's tests
/// filtered by a module of `tally-base`) fails here.
#[test]
fn every_cargo_test_shown_names_a_real_target() {
    let packages = packages();
    assert!(packages["tally"].0.contains("it") && packages["tally-base"].0.contains("adapters"), "{packages:?}");
    let own_rooms = |p: &str| -> BTreeSet<String> {
        let (_, mods) = &packages[p];
        let own =
            if p == "tally" { mods.difference(&packages["tally-base"].1).cloned().collect() } else { mods.clone() };
        module_names(&own)
    };
    let mut problems = Vec::new();
    let mut seen = 0;
    for (page, text) in pages() {
        for block in code(&text) {
            for line in block.lines() {
                let Some(at) = line.find("cargo test") else { continue };
                seen += 1;
                let words: Vec<&str> = line[at..].split_whitespace().take_while(|w| *w != "--").collect();
                let value = |flag: &str| words.iter().position(|w| *w == flag).and_then(|i| words.get(i + 1)).copied();
                let package = value("-p").unwrap_or("tally");
                let Some((tests, _)) = packages.get(package) else {
                    problems.push(format!("{page}: `{line}`: no package {package}"));
                    continue;
                };
                if let Some(t) = value("--test").filter(|t| !tests.contains(*t)) {
                    problems.push(format!("{page}: `{}`: package {package} has no test binary {t}", line.trim()));
                }
                if let Some(filter) = value("--lib").filter(|f| !f.starts_with('-')) {
                    let room = filter.split("::").next().unwrap_or(filter);
                    if !own_rooms(package).contains(room) {
                        problems.push(format!("{page}: `{}`: {package}'s library has no module {room}", line.trim()));
                    }
                }
            }
        }
    }
    assert!(seen >= 10, "only {seen} cargo test commands found: is the page reader broken?");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
