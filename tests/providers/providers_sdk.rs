//! Contract tests with the official SDKs (drafts too: `responses.create` in background mode and
//! `responses.retrieve`, chat completions at DashScope's compatible-mode path): the pinned `openai`, `replicate`, `fal-client` and `dashscope`
//! Python packages (`tests/sdk/requirements.txt`, installed into `target/sdk-venv` by
//! `scripts/install-sdk-venv.sh`, which `scripts/test.sh` runs first) drive a real
//! `tally mock-provider` process through create, poll/status, result, list, cancel and edits
//! with reference images (`tests/sdk/contract.py`). A mock answer a real client cannot parse,
//! or a request the mock accepts where the real API refuses it, fails this test.
//!
//! The venv is a dependency like Chromium for the web tests: when it is missing this test
//! fails (it never skips), with the command that installs it.

use std::path::PathBuf;
use std::process::Command;

use crate::common::Mock;

fn python() -> PathBuf {
    match std::env::var_os("TALLY_SDK_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target/sdk-venv/bin/python")),
    }
}

#[test]
fn the_official_sdks_parse_every_mock_answer() {
    let python = python();
    assert!(
        python.exists(),
        "the SDK venv is missing ({}): run `bash scripts/install-sdk-venv.sh` (scripts/test.sh does)",
        python.display()
    );
    // Started without behaviour flags: the defaults must be the real APIs' behaviour.
    let mock = Mock::start(&[]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/contract.py");
    let out = Command::new(&python).arg(script).arg(mock.base()).output().expect("run the SDK contract script");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the official SDKs disagree with the mock:\n{text}");
    assert!(text.contains(" passed, 0 failed"), "the contract script ran no checks:\n{text}");
}
