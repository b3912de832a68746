//! What a shop owner meets outside the web page: a set's images as one zip and through
//! `tally set download` with names a person recognises, `Content-Disposition` names on single
//! downloads, `tally set list`, `tally serve --listen` found by the other commands, `--wait`
//! exit codes and Ctrl-C, help text for every argument, and the terminal kept safe from
//! control sequences in prompts and provider errors.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{Daemon, EXE, FAST_DEMO, Mock, TempDir, free_port, sha256_hex, wait_for};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Create a set through the API and wait until it is settled.
fn settled_set(d: &Daemon, body: Value) -> Value {
    let r = d.call("POST", "/v1/sets", Some(&body));
    assert_eq!(r.status, 201, "{}", text(&r.body));
    let id = r.json()["id"].as_str().expect("set id").to_string();
    let mut last = Value::Null;
    wait_for(Duration::from_secs(30), || {
        last = d.call("GET", &format!("/v1/sets/{id}"), None).json();
        (last["status"] != "running").then_some(())
    })
    .unwrap_or_else(|| panic!("set {id} never settled: {last}"));
    last
}

/// The entries of a zip: (name, bytes), in order.
fn unzip(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(bytes)).expect("a readable zip");
    (0..z.len())
        .map(|i| {
            let mut e = z.by_index(i).expect("entry");
            let name = e.name().expect("utf-8 name").to_string();
            let mut data = Vec::new();
            e.read_to_end(&mut data).expect("entry bytes (CRC checked)");
            (name, data)
        })
        .collect()
}

#[test]
fn a_set_downloads_as_one_zip_and_into_a_folder_with_product_and_role_names() {
    let d = Daemon::start(FAST_DEMO);
    let set = settled_set(
        &d,
        json!({ "product": "Red Sneaker", "shots": [
            { "role": "main", "prompt": "on white" },
            { "role": "scene", "prompt": "a wet street" },
            { "role": "scene", "prompt": "a beach" } ] }),
    );
    assert_eq!(set["status"], "done", "{set}");
    let id = set["id"].as_str().unwrap();
    let shas: Vec<String> =
        set["shots"].as_array().unwrap().iter().map(|s| s["artifacts"][0]["sha256"].as_str().unwrap().into()).collect();

    // The API: one stored entry per shot, in shot order, named by product and role.
    let r = d.call("GET", &format!("/v1/sets/{id}/download"), None);
    assert_eq!(r.status, 200, "{}", text(&r.body));
    assert_eq!(r.header("content-type"), Some("application/zip"));
    let cd = r.header("content-disposition").unwrap_or("");
    assert!(cd.starts_with("attachment;") && cd.contains("filename=\"red-sneaker.zip\""), "{cd}");
    let entries = unzip(&r.body);
    let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["red-sneaker_main.png", "red-sneaker_scene-1.png", "red-sneaker_scene-2.png"]);
    let got: Vec<String> = entries.iter().map(|(_, b)| sha256_hex(b)).collect();
    assert_eq!(got, shas, "every image with its recorded sha256");

    // A single download is named the same way, plus a short id (the last 8 hex digits of the
    // artifact's id) so two versions saved side by side keep apart; a job outside a set by
    // its prompt.
    let short = |a: &Value| a["id"].as_str().unwrap().replace('-', "")[24..].to_string();
    let art = &set["shots"][0]["artifacts"][0];
    let one = d.call("GET", art["url"].as_str().unwrap(), None);
    let cd = one.header("content-disposition").unwrap_or("");
    assert!(cd.contains(&format!("filename=\"red-sneaker_main_{}.png\"", short(art))), "{cd}");
    let t = d.call("POST", "/v1/tasks", Some(&json!({ "prompt": "Blue mug on a wooden table" }))).json();
    let t = d.wait_status(t["id"].as_str().unwrap(), &["succeeded"]);
    let single = d.call("GET", t["artifacts"][0]["url"].as_str().unwrap(), None);
    let cd = single.header("content-disposition").unwrap_or("");
    let want = format!("filename=\"blue-mug-on-a-wooden-table_{}.png\"", short(&t["artifacts"][0]));
    assert!(cd.starts_with("inline;") && cd.contains(&want), "{cd}");

    // The CLI writes the same files; again is harmless; it never overwrites other bytes.
    let out = TempDir::new();
    let dir = out.path().join("photos");
    let cli = d.cli(&["set", "download", id, dir.to_str().unwrap()]);
    assert!(cli.status.success(), "{}", text(&cli.stderr));
    for (name, bytes) in &entries {
        assert_eq!(&std::fs::read(dir.join(name)).expect(name), bytes, "{name}");
    }
    assert!(d.cli(&["set", "download", id, dir.to_str().unwrap()]).status.success(), "a second download");
    std::fs::write(dir.join("red-sneaker_main.png"), b"my own file").unwrap();
    let refused = d.cli(&["set", "download", id, dir.to_str().unwrap()]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(text(&refused.stderr).contains("nothing was overwritten"), "{}", text(&refused.stderr));
    assert_eq!(std::fs::read(dir.join("red-sneaker_main.png")).unwrap(), b"my own file");

    // Without DIR: a new folder named after the product, in the current directory.
    let here = TempDir::new();
    let cli = Command::new(EXE)
        .args(["set", "download", id, "--config"])
        .arg(&d.config)
        .current_dir(here.path())
        .env_remove("TALLY_CONFIG")
        .env_remove("TALLY_DATA_DIR")
        .output()
        .unwrap();
    assert!(cli.status.success(), "{}", text(&cli.stderr));
    assert!(here.path().join("red-sneaker/red-sneaker_scene-2.png").is_file());

    // `tally set list` finds the set again.
    let list = d.cli(&["set", "list"]);
    assert!(list.status.success() && text(&list.stdout).contains(id), "{}", text(&list.stdout));
}

#[test]
fn serve_listen_is_used_and_found_by_the_other_commands() {
    let d = Daemon::configure(FAST_DEMO);
    let port = free_port();
    let mut child = Command::new(EXE)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--config"])
        .arg(&d.config)
        .env_remove("TALLY_CONFIG")
        .env_remove("TALLY_DATA_DIR")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let up = wait_for(Duration::from_secs(30), || std::net::TcpStream::connect(("127.0.0.1", port)).ok());
    assert!(up.is_some(), "serve --listen did not listen there");
    // The config names another port; the CLI still finds the daemon of its data dir.
    let out = d.cli(&["submit", "found by its data dir", "--wait"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(&format!("http://127.0.0.1:{port}/v1/artifacts/")), "{}", text(&out.stdout));
    // The signed-out page names the address the browser used.
    let page = crate::common::request(port, "GET", "/", &[], None);
    assert!(text(&page.body).contains(&format!("http://127.0.0.1:{port}/login?code=")), "{}", text(&page.body));
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let stopped = wait_for(Duration::from_secs(30), || child.try_wait().ok().flatten());
    assert_eq!(stopped.and_then(|s| s.code()), Some(0));
    assert!(!d.data.join("serve.addr").exists(), "a clean stop removes the address file");

    let bad =
        Command::new(EXE).args(["serve", "--listen", "10.1.2.3:7700", "--config"]).arg(&d.config).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(text(&bad.stderr).contains("allow_non_loopback"), "{}", text(&bad.stderr));
}

#[test]
fn ctrl_c_during_wait_stops_waiting_and_the_job_keeps_running() {
    let d = Daemon::start("[[providers]]\nname = \"demo\"\nkind = \"demo\"\ndelay_ms = 1500\n");
    let mut child = Command::new(EXE)
        .args(["submit", "interrupted wait", "--wait", "--config"])
        .arg(&d.config)
        .env_remove("TALLY_CONFIG")
        .env_remove("TALLY_DATA_DIR")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Interrupt once the wait has printed that the job is running, as a person would.
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut seen = String::new();
    let running = loop {
        let mut line = String::new();
        let n = std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
        assert!(n > 0, "the wait ended before the job ran: {seen}");
        seen.push_str(&line);
        if line.contains(": running") {
            break line.split(':').next().unwrap().to_string();
        }
    };
    // While that shot runs, a set of the same slow provider has nothing to download yet.
    let set =
        d.call("POST", "/v1/sets", Some(&json!({ "product": "tote", "shots": [{ "role": "main", "prompt": "x" }] })));
    let nothing = d.call("GET", &format!("/v1/sets/{}/download", set.json()["id"].as_str().unwrap()), None);
    assert_eq!((nothing.status, nothing.error_code().as_str()), (409, "no_images"));
    let _ = Command::new("kill").args(["-INT", &child.id().to_string()]).status();
    let status = child.wait().unwrap();
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert_eq!(status.code(), Some(130), "stderr: {err}");
    assert!(
        err.contains(&format!("stopped waiting; the job keeps running: `tally status {running}`")),
        "stderr: {err}"
    );
    assert_eq!(d.wait_status(&running, &["succeeded"])["status"], "succeeded", "Ctrl-C did not cancel the job");
}

#[test]
fn set_create_wait_exits_like_submit_wait() {
    let mock = Mock::start(&[]);
    let providers = format!(
        "{FAST_DEMO}\n[[providers]]\nname = \"openai\"\nkind = \"openai_images\"\nbase_url = \"{}\"\n\
         model = \"gpt-image-2.5-flare\"\napi_key_env = \"TALLY_TEST_KEY\"\nrequest_timeout_ms = 5000\nconnect_timeout_ms = 1000\n",
        mock.base()
    );
    let mut d = Daemon::configure(&providers);
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test".into()));
    d.spawn();
    let ok = d.cli(&["set", "create", "--product", "mug", "--shot", "main:on white", "--wait"]);
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok.stderr));
    mock.behave(json!({ "drop_response": true }));
    let lost =
        d.cli(&["set", "create", "--product", "mug", "--provider", "openai", "--shot", "main:answer lost", "--wait"]);
    assert_eq!(lost.status.code(), Some(4), "an unknown shot exits 4: {}", text(&lost.stderr));
    mock.behave(json!({ "drop_response": false, "reject_status": 400 }));
    let failed =
        d.cli(&["set", "create", "--product", "mug", "--provider", "openai", "--shot", "main:refused", "--wait"]);
    assert_eq!(failed.status.code(), Some(3), "a failed shot exits 3: {}", text(&failed.stderr));
    let help = Command::new(EXE).args(["set", "create", "--help"]).output().unwrap();
    let help = text(&help.stdout);
    for words in ["0 every shot", "3 a shot failed", "4 a shot ended unknown", "130 Ctrl-C"] {
        assert!(help.contains(words), "`{words}` missing from set create --help:\n{help}");
    }
}

/// Issue 15, item 9: a prompt or a provider's error carrying terminal control sequences
/// (ESC [ … m colours, ESC ] … OSC titles, carriage returns that rewrite a line) reached the
/// terminal raw through `tally status`, `list`, `events` and `submit --wait`.
#[test]
fn terminal_control_sequences_from_prompts_are_escaped() {
    let d = Daemon::start(FAST_DEMO);
    let prompt = "red \u{1b}[31mred\u{1b}[0m \u{1b}]0;pwned\u{7}\rsneaker\u{9b}2J";
    let out = d.cli(&["submit", prompt, "--wait"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = d.call("GET", "/v1/tasks", None).json()["tasks"][0]["id"].as_str().unwrap().to_string();
    for args in [vec!["status", id.as_str()], vec!["list"], vec!["events", id.as_str()]] {
        let out = d.cli(&args);
        assert!(out.status.success());
        let shown = text(&out.stdout);
        let raw_controls: Vec<char> = shown.chars().filter(|c| c.is_control() && *c != '\n' && *c != '\t').collect();
        assert!(raw_controls.is_empty(), "tally {args:?} printed raw control characters {raw_controls:?}:\n{shown}");
        if args[0] != "events" {
            assert!(shown.contains("\\u{1b}[31mred"), "the escape is shown, visibly: {shown}");
        }
    }
    // An error message from the daemon goes through the same filter on stderr.
    let missing = d.cli(&["status", "no-such\u{1b}[2J-id"]);
    assert!(!text(&missing.stderr).contains('\u{1b}'), "{}", text(&missing.stderr));
}

#[test]
fn every_argument_has_help_and_meaningless_global_flags_are_not_listed() {
    fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for a in cmd.get_arguments() {
            let id = a.get_id().as_str();
            if id == "help" || id == "version" || a.is_hide_set() {
                continue;
            }
            if a.get_help().is_none_or(|h| h.to_string().trim().is_empty()) {
                missing.push(format!("{path} {id}"));
            }
        }
        for sub in cmd.get_subcommands() {
            if sub.get_about().is_none() {
                missing.push(format!("{path} {} (no about)", sub.get_name()));
            }
            walk(sub, &format!("{path} {}", sub.get_name()), missing);
        }
    }
    let mut cmd = tally::cli::command();
    cmd.build();
    let mut missing = Vec::new();
    walk(&cmd, "tally", &mut missing);
    assert!(missing.is_empty(), "arguments without help: {missing:?}");

    let help = |args: &[&str]| text(&Command::new(EXE).args(args).arg("--help").output().unwrap().stdout);
    for (args, absent) in [
        (vec!["serve"], vec!["--json"]),
        (vec!["mock-provider"], vec!["--json", "--config", "--data-dir"]),
        (vec!["bench"], vec!["--config", "--data-dir"]),
        (vec!["backup"], vec!["--json"]),
    ] {
        let h = help(&args);
        for flag in absent {
            assert!(!h.contains(&format!("{flag} ")), "tally {args:?} --help lists {flag}:\n{h}");
        }
    }
    assert!(help(&["list"]).contains("--json"), "client commands keep --json");
    // An environment data dir is not shown in usage lines as if it had been typed.
    let usage = Command::new(EXE).args(["resolve", "x"]).env("TALLY_DATA_DIR", "/nonexistent").output().unwrap();
    assert_eq!(usage.status.code(), Some(2));
    assert!(!text(&usage.stderr).contains("--data-dir"), "{}", text(&usage.stderr));
}

/// The harness's own guard: a port taken between configuring a daemon and starting it (tests
/// run in parallel) does not make the test talk to another daemon — this one moves to a free
/// port and the test reaches it.
#[test]
fn a_daemon_whose_port_was_taken_moves_to_a_free_one() {
    let mut d = Daemon::configure(FAST_DEMO);
    let taken = d.port;
    let _squatter = std::net::TcpListener::bind(("127.0.0.1", taken)).expect("take the port");
    d.spawn();
    assert_ne!(d.port, taken, "it moved");
    assert_eq!(d.call("GET", "/healthz", None).status, 200);
    assert!(d.data.join("api-token").exists(), "its own data dir");
}
