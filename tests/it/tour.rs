//! The tour, run as written: the README's CLI tour, curl lines and set delivery, the guide's
//! edit and cutout (docs/guide/jobs.md), draft (docs/guide/sets-and-drafts.md) and mock
//! walk-through (docs/guide/providers/mock.md), in that order, by bash, each command's exit
//! code checked (0, or the code its comment names). Only what a fresh machine would differ in
//! is replaced: `tally` is this build, the home and data directories are temporary, `/tmp/` is
//! a temporary directory, the ports are free ones, `<id>` is the newest job and `<artifact-id>`
//! its image, and the "Two commands" daemon is started in the background where a person would
//! use a second terminal.

use std::path::Path;
use std::process::Command;

use crate::common::{EXE, TempDir, free_port, sha256_hex};

/// The indented lines of the first code block after `marker` in `page`, without their indentation.
fn block_after<'a>(page: &'a str, marker: &str) -> Vec<&'a str> {
    let start = page.find(marker).unwrap_or_else(|| panic!("the page has no `{marker}`"));
    page[start..]
        .lines()
        .skip_while(|l| !l.starts_with("    "))
        .take_while(|l| l.starts_with("    ") || l.trim().is_empty())
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .filter(|l| !l.trim().is_empty())
        .collect()
}

/// Commands of a block: heredocs and `\` continuations joined, comment-only lines dropped.
fn commands(lines: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let mut cmd = lines[i].to_string();
        if let Some(tag) = cmd.split("<<'").nth(1).and_then(|t| t.split('\'').next()).map(str::to_string) {
            while i + 1 < lines.len() {
                i += 1;
                cmd.push('\n');
                cmd.push_str(lines[i]);
                if lines[i].trim() == tag {
                    break;
                }
            }
        }
        while cmd.ends_with('\\') && i + 1 < lines.len() {
            i += 1;
            cmd.push('\n');
            cmd.push_str(lines[i]);
        }
        if !cmd.trim_start().starts_with('#') {
            out.push(cmd);
        }
        i += 1;
    }
    out
}

/// The exit code a command's comment promises ("exit code 4"), else 0.
fn expected_code(cmd: &str) -> i32 {
    cmd.split("exit code ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[test]
fn the_readme_tour_runs_as_written() {
    let read = |rel: &str| {
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(rel))
            .unwrap_or_else(|e| panic!("{rel}: {e}"))
    };
    let tmp = TempDir::new();
    let root = tmp.path();
    for d in ["home", "xdg", "work", "tmp"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let (p1, p2, p3) = (free_port(), free_port(), free_port());
    let subst = |c: &str| {
        let c = c
            .replace("/tmp/", &format!("{}/tmp/", root.display()))
            .replace("127.0.0.1:7700", &format!("127.0.0.1:{p1}"))
            .replace("127.0.0.1:7701", &format!("127.0.0.1:{p2}"))
            .replace("127.0.0.1:7800", &format!("127.0.0.1:{p3}"))
            .replace("<artifact-id>", "$(artifact_id)")
            .replace("<id>", "$(last_id)")
            .replace("<set-id>", "$(set_id)")
            .replace("<draft-id>", "$(draft_id)");
        // `tally set choose $(set_id) ROLE <image-id>`: the first image of that shot.
        match c.split("$(set_id) ").nth(1).and_then(|rest| rest.split_whitespace().next()) {
            Some(role) if c.contains("<image-id>") => c.replace("<image-id>", &format!("$(image_of {role})")),
            _ => c,
        }
    };
    // The owner's photo the README's listing step names: a blue mug on a plain grey backdrop.
    let photo = image::RgbImage::from_fn(1600, 1200, |x, y| {
        if (560..1040).contains(&x) && (330..930).contains(&y) {
            image::Rgb([40, 80, 190])
        } else {
            image::Rgb([225, 225, 220])
        }
    });
    photo.save(root.join("work/mug-photo.png")).expect("the photo");
    let mut steps: Vec<String> = Vec::new();
    for (page, marker) in [
        ("README.md", "## A short tour"),
        ("docs/guide/jobs.md", "## Edit an image, and cut out a product"),
        ("README.md", "With curl:"),
        ("README.md", "Deliver a set:"),
        ("docs/guide/sets-and-drafts.md", "## Drafts: from the product's photos"),
        ("docs/guide/providers/mock.md", "## A walk-through: a lost answer, a retry, a cancel"),
    ] {
        let text = read(page);
        steps.extend(commands(&block_after(&text, marker)).iter().map(|c| subst(c)));
    }
    assert!(steps.iter().any(|s| s.contains("tally cancel")) && steps.iter().any(|s| s.contains("tally retry")));

    let exe_dir = Path::new(EXE).parent().unwrap().display().to_string();
    let mut script = format!(
        "set -u\nexport PATH={exe_dir}:$PATH HOME={r}/home XDG_DATA_HOME={r}/xdg\nunset TALLY_CONFIG TALLY_DATA_DIR\n\
         cd {r}/work\ntrap 'kill -KILL $(jobs -p) 2>/dev/null' EXIT\n\
         last_id() {{ tally list --limit 1 | head -n1 | cut -d' ' -f1; }}\n\
         artifact_id() {{ tally status \"$(last_id)\" | sed -n 's/.*(artifact id \\([^)]*\\)).*/\\1/p' | head -n1; }}\n\
         set_id() {{ tally set list | head -n1 | cut -d' ' -f1; }}\n\
         draft_id() {{ curl -s -H \"Authorization: Bearer $(tally token)\" 'http://127.0.0.1:{p1}/v1/drafts?limit=1' | sed -n 's/^{{\"drafts\":\\[{{\"id\":\"\\([^\"]*\\)\".*/\\1/p'; }}\n\
         image_of() {{ tally set status \"$(set_id)\" | awk -v r=\"$1\" '$1 ~ /^#[0-9]+$/ {{f=($2==r); next}} f && /image/ {{for(i=1;i<=NF;i++) if($i==\"image\") {{print $(i+1); exit}}}}'; }}\n\
         tally serve --listen 127.0.0.1:{p1} > {r}/serve1.log 2>&1 &\n\
         for i in $(seq 200); do tally list > /dev/null 2>&1 && break; sleep 0.05; done\n",
        r = root.display()
    );
    for (i, s) in steps.iter().enumerate() {
        script.push_str(&format!("{s}\necho \"step {i} $?\" >> {}/steps.log\n", root.display()));
    }
    let out = Command::new("bash").arg("-c").arg(&script).output().expect("run bash");
    let log = std::fs::read_to_string(root.join("steps.log")).unwrap_or_default();
    let said = format!(
        "stdout:\n{}\nstderr:\n{}\nserve:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(root.join("serve1.log")).unwrap_or_default()
    );
    let codes: Vec<i32> = log.lines().filter_map(|l| l.rsplit(' ').next()?.parse().ok()).collect();
    assert_eq!(codes.len(), steps.len(), "every step ran:\n{said}");
    for (i, (s, code)) in steps.iter().zip(&codes).enumerate() {
        assert_eq!(*code, expected_code(s), "step {i} `{s}` exited {code}\n{said}");
    }
    // The delivered set: each file in the manifest is on disk with its sha256, one per shot.
    let exports = root.join("xdg/tally/exports");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(exports.join("manifest.json")).unwrap_or_default()).unwrap_or_default();
    let files = manifest["files"].as_array().cloned().unwrap_or_default();
    assert_eq!(files.len(), 2, "one file per shot in the manifest: {manifest}\n{said}");
    for f in &files {
        let name = f["file_name"].as_str().unwrap_or_default();
        let bytes = std::fs::read(exports.join(name)).unwrap_or_default();
        assert_eq!(Some(sha256_hex(&bytes).as_str()), f["sha256"].as_str(), "{name} on disk matches the manifest");
    }
    assert!(exports.join("manifest.csv").is_file(), "manifest.csv beside the files");
    // The listing's main image: the mug from the photo, on pure white at Amazon's size.
    let main = files.iter().find_map(|f| f["file_name"].as_str().filter(|n| n.contains("white")));
    let main = image::open(exports.join(main.unwrap_or("no main_white file"))).expect("the main image").to_rgb8();
    assert_eq!(main.dimensions(), (2000, 2000));
    let edge = main.enumerate_pixels().filter(|(x, y, _)| *x == 0 || *y == 0 || *x == 1999 || *y == 1999);
    assert!(edge.clone().all(|(_, _, p)| p.0 == [255, 255, 255]), "its edge is pure white");
    assert!(main.pixels().any(|p| p.0[2] > 150 && p.0[0] < 80), "the blue mug is on it");
    // The mock's ledger counts what was charged: the red, the lost blue, its retry, the green.
    let ledger = std::fs::read_to_string(root.join("tmp/ledger.jsonl")).unwrap_or_default();
    let charged = ledger.lines().filter(|l| l.contains("\"charged\":true")).count();
    assert!(charged >= 3, "the ledger shows {charged} charged requests:\n{ledger}");
}
