//! Honest about money, through the real daemon against a real `tally mock-provider`: each
//! outcome's `charge` agrees with the mock's ledger of what it charged, no "may be charged"
//! wording where nothing can have been, the spend CSV lists exactly the ledger's charged
//! lines, and a budget holds many concurrent workers to what it allows.

use std::time::Duration;

use crate::common::{Daemon, Mock, free_port, wait_for};

const SETTLED: &[&str] = &["succeeded", "failed", "unknown", "canceled"];

/// The phrases that claim a charge may exist.
fn claims_a_charge(text: &str) -> bool {
    let t = text.to_lowercase();
    ["may be charged", "may have been charged", "may already have been charged"].iter().any(|p| t.contains(p))
}

fn provider(name: &str, base: &str, key_env: &str, extra: &str) -> String {
    format!(
        "[[providers]]\nname = \"{name}\"\nkind = \"openai_images\"\nbase_url = \"{base}\"\napi_key_env = \"{key_env}\"\n\
         model = \"gpt-image-2.5-flare\"\nmax_concurrency = 8\nrequest_timeout_ms = 5000\nconnect_timeout_ms = 1000\n{extra}\n"
    )
}

fn tag(what: &str) -> String {
    format!("{what} {}", uuid::Uuid::new_v4().simple())
}

struct World {
    mock: Mock,
    daemon: Daemon,
}

const KEY_ENV: &str = "TALLY_MONEY_TEST_KEY";

fn world(budget: &str, price: &str, workers: usize) -> World {
    let mock = Mock::start(&[]);
    let dead = format!("http://127.0.0.1:{}", free_port());
    let extra = if price.is_empty() { String::new() } else { format!("price_per_image = {price}\n") };
    let providers = format!(
        "{budget}\n{}{}{}",
        provider("oa", &mock.base(), KEY_ENV, &extra),
        provider("nokey", &mock.base(), "TALLY_MONEY_TEST_SURELY_UNSET", ""),
        provider("down", &dead, KEY_ENV, ""),
    );
    let engine = "max_attempts = 2\nbackoff_base_ms = 20\nbackoff_max_ms = 50\n";
    let mut daemon = Daemon::configure_with(engine, &providers);
    let text = std::fs::read_to_string(&daemon.config).expect("config");
    std::fs::write(&daemon.config, text.replace("workers = 4\n", &format!("workers = {workers}\n"))).expect("config");
    daemon.env.push((KEY_ENV.into(), "sk-test-money".into()));
    daemon.spawn();
    World { mock, daemon }
}

impl World {
    fn submit(&self, provider: &str, prompt: &str) -> String {
        let r =
            self.daemon.call("POST", "/v1/tasks", Some(&serde_json::json!({"prompt": prompt, "provider": provider})));
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        r.json()["id"].as_str().expect("id").to_string()
    }

    fn run(&self, provider: &str, prompt: &str) -> serde_json::Value {
        let id = self.submit(provider, prompt);
        self.daemon.wait_status(&id, SETTLED)
    }

    fn events(&self, id: &str) -> Vec<(String, String)> {
        let e = self.daemon.call("GET", &format!("/v1/tasks/{id}/events"), None).json();
        e["events"]
            .as_array()
            .expect("events")
            .iter()
            .map(|e| (e["kind"].as_str().unwrap_or("").to_string(), e["message"].as_str().unwrap_or("").to_string()))
            .collect()
    }

    /// Assert a task that nothing can have charged: state, no acknowledgement, no wording.
    fn assert_not_charged(&self, t: &serde_json::Value, state: &str, what: &str) {
        assert_eq!(t["charge"]["state"], state, "{what}: {t}");
        assert_eq!(t["retry"]["requires_cost_acknowledgement"], false, "{what}: {t}");
        assert!(!claims_a_charge(t["message"].as_str().unwrap_or("")), "{what}: message {}", t["message"]);
        assert!(!claims_a_charge(t["retry"]["note"].as_str().unwrap_or("")), "{what}: note {}", t["retry"]["note"]);
        for (kind, msg) in self.events(t["id"].as_str().expect("id")) {
            assert!(!claims_a_charge(&msg), "{what}: event {kind}: {msg}");
        }
    }
}

#[test]
fn each_outcome_has_the_charge_the_ledger_shows() {
    let w = world("", "", 4);

    // A missing API key: nothing is sent, nothing is recorded as calling.
    let p = tag("no key");
    let t = w.run("nokey", &p);
    assert_eq!(t["status"], "failed", "{t}");
    assert_eq!(t["charge"]["requests"], 0);
    w.assert_not_charged(&t, "none", "missing key");
    assert!(!w.events(t["id"].as_str().unwrap()).iter().any(|(k, _)| k == "calling"), "no calling step");
    assert!(t["message"].as_str().unwrap().contains("TALLY_MONEY_TEST_SURELY_UNSET"), "{t}");
    assert_eq!(w.mock.count(&p), (0, 0), "the mock never heard of it");

    // A refused connection: nothing reached the provider.
    let p = tag("down");
    let t = w.run("down", &p);
    assert_eq!(t["status"], "failed", "{t}");
    w.assert_not_charged(&t, "none", "connection refused");

    // Definite refusals: 400 and 401.
    for (status, behave) in
        [("400", serde_json::json!({"reject_status": 400})), ("401", serde_json::json!({"reject_status": 401}))]
    {
        w.mock.behave(behave);
        let p = tag(&format!("refused {status}"));
        let t = w.run("oa", &p);
        w.mock.behave(serde_json::json!({"reject_status": null, "retry_after_s": null}));
        assert_eq!(t["status"], "failed", "{status}: {t}");
        w.assert_not_charged(&t, "refused", status);
        let (sent, charged) = w.mock.count(&p);
        assert!(sent >= 1 && charged == 0, "{status}: the ledger shows {sent} requests, {charged} charged");
        assert_eq!(t["charge"]["requests"], sent as i64, "{status}: one request per ledger line");
    }

    // Two 429s ("not now"): refused, so not charged and not attempts; then the task goes
    // through, charged once.
    w.mock.behave(serde_json::json!({"retry_after_s": 0, "rate_limit_times": 2}));
    let p = tag("refused 429");
    let t = w.run("oa", &p);
    w.mock.behave(serde_json::json!({"retry_after_s": null, "rate_limit_times": null}));
    assert_eq!((t["status"].as_str(), t["attempts"].as_i64()), (Some("succeeded"), Some(1)), "{t}");
    assert_eq!(t["charge"]["state"], "charged", "{t}");
    assert_eq!(w.mock.count(&p), (3, 1), "two refused 429s, one charged success");

    // A lost answer: possibly charged (the ledger: charged once), worded as lost.
    w.mock.behave(serde_json::json!({"drop_response": true}));
    let p = tag("dropped");
    let t = w.run("oa", &p);
    w.mock.behave(serde_json::json!({"drop_response": false}));
    assert_eq!((t["status"].as_str(), t["charge"]["state"].as_str()), (Some("unknown"), Some("possible")), "{t}");
    assert_eq!(t["retry"]["requires_cost_acknowledgement"], true);
    assert!(t["message"].as_str().unwrap().contains("answer was lost"), "{}", t["message"]);
    assert_eq!(t["needs_attention"], true);
    assert_eq!(w.mock.count(&p), (1, 1));

    // An HTTP 500: possibly charged, and described as an error answer, not a lost one.
    w.mock.behave(serde_json::json!({"fail_status": 500}));
    let p = tag("error 500");
    let t = w.run("oa", &p);
    w.mock.behave(serde_json::json!({"fail_status": null}));
    assert_eq!((t["status"].as_str(), t["charge"]["state"].as_str()), (Some("unknown"), Some("possible")), "{t}");
    let msg = t["message"].as_str().unwrap();
    assert!(msg.contains("answered with an error") && !msg.contains("lost"), "{msg}");
    assert_eq!(w.mock.count(&p).0, 1);

    // A success: charged, and the ledger charged it once.
    let p = tag("paid");
    let t = w.run("oa", &p);
    assert_eq!((t["status"].as_str(), t["charge"]["state"].as_str()), (Some("succeeded"), Some("charged")), "{t}");
    assert_eq!(t["retry"]["requires_cost_acknowledgement"], true);
    assert_eq!(w.mock.count(&p), (1, 1));
}

#[test]
fn the_spend_csv_lists_exactly_the_ledgers_charged_requests() {
    let w = world("", "0.04", 4);
    let run = tag("spend");
    w.run("oa", &format!("{run} ok 1"));
    w.run("oa", &format!("{run} ok 2"));
    w.mock.behave(serde_json::json!({"reject_status": 400}));
    w.run("oa", &format!("{run} refused"));
    w.mock.behave(serde_json::json!({"reject_status": null, "drop_response": true}));
    let lost = w.run("oa", &format!("{run} lost"));
    w.mock.behave(serde_json::json!({"drop_response": false}));
    w.run("nokey", &format!("{run} no key"));
    assert_eq!(lost["charge"]["estimated_cost"], 0.04, "{lost}");

    let charged_lines: Vec<serde_json::Value> = w
        .mock
        .lines()
        .into_iter()
        .filter(|l| l["charged"] == true && l["prompt"].as_str().is_some_and(|p| p.contains(&run)))
        .collect();
    let out = w.daemon.cli(&["spend", "--csv"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("time,task,provider,model,state,estimated_cost,currency,recorded"));
    let rows: Vec<Vec<String>> = lines.map(|l| l.split(',').map(str::to_string).collect()).collect();
    assert_eq!(rows.len(), charged_lines.len(), "one CSV row per charged ledger line:\n{text}");
    // Match them one for one: each row's task asked the mock for one charged generation.
    let mut prompts: Vec<String> =
        charged_lines.iter().map(|l| l["prompt"].as_str().unwrap_or("").to_string()).collect();
    for row in &rows {
        let t = w.daemon.call("GET", &format!("/v1/tasks/{}", row[1]), None).json();
        let i =
            prompts.iter().position(|p| p == t["prompt"].as_str().unwrap_or("")).expect("a ledger line for the row");
        prompts.remove(i);
        assert_eq!(
            (row[2].as_str(), row[3].as_str(), row[5].as_str(), row[6].as_str()),
            ("oa", "gpt-image-2.5-flare", "0.04", "USD")
        );
        assert!(["charged", "possible"].contains(&row[4].as_str()), "{row:?}");
    }

    let s = w.daemon.call("GET", "/v1/spend?group=provider", None).json();
    assert_eq!(s["currency"], "USD");
    let oa = s["rows"].as_array().expect("rows").iter().find(|r| r["key"] == "oa").expect("oa row").clone();
    let pair = |a: &serde_json::Value| (a["count"].as_i64(), a["amount"].as_f64());
    assert_eq!(pair(&oa["charged"]), (Some(2), Some(0.08)), "{s}");
    assert_eq!(pair(&oa["possibly_charged"]), (Some(1), Some(0.04)), "{s}");
    assert_eq!(oa["refused"], 1, "{s}");
    assert_eq!(s["totals"]["charged"]["count"], 2, "{s}");
}

#[test]
fn a_budget_holds_many_workers_to_what_it_allows_and_a_raised_limit_lets_them_go() {
    // Room for 3 requests at 0.04 each (0.14 / 0.04 = 3.5), 12 tasks at once, 12 workers.
    let w = world("[budget]\ndaily = 0.14\n", "0.04", 12);
    w.mock.behave(serde_json::json!({"latency_ms": 200}));
    let run = tag("budget");
    let ids: Vec<String> = std::thread::scope(|s| {
        let (w, run) = (&w, &run);
        let hs: Vec<_> = (0..12).map(|i| s.spawn(move || w.submit("oa", &format!("{run} {i}")))).collect();
        hs.into_iter().map(|h| h.join().expect("submit thread")).collect()
    });
    let tasks = |ids: &[String]| -> Vec<serde_json::Value> {
        ids.iter().map(|id| w.daemon.call("GET", &format!("/v1/tasks/{id}"), None).json()).collect()
    };
    let settled = wait_for(Duration::from_secs(30), || {
        let ts = tasks(&ids);
        let done = ts.iter().filter(|t| t["status"] == "succeeded").count();
        let held = ts
            .iter()
            .filter(|t| t["status"] == "waiting" && t["message"].as_str().unwrap_or("").contains("budget"))
            .count();
        (done == 3 && held == 9).then_some(ts)
    })
    .unwrap_or_else(|| panic!("want 3 succeeded and 9 held by the budget: {:?}", tasks(&ids)));
    assert_eq!(w.mock.count(&run), (3, 3), "no more requests left than the budget allows");
    for t in settled.iter().filter(|t| t["status"] == "waiting") {
        assert_eq!(t["attempts"], 0, "a held task counts no attempt: {t}");
        assert_eq!(t["charge"]["state"], "none", "{t}");
        assert!(t["message"].as_str().unwrap().contains("$0.14"), "{}", t["message"]);
    }
    let s = w.daemon.call("GET", "/v1/spend", None).json();
    assert_eq!(s["budgets"][0]["spent"].as_f64(), Some(0.12), "{s}");

    // Raise the limit and tell the daemon (SIGHUP): the held tasks go without a restart.
    let text = std::fs::read_to_string(&w.daemon.config).expect("config");
    std::fs::write(&w.daemon.config, text.replace("daily = 0.14", "daily = 1.0")).expect("write config");
    let pid = w.daemon.child.as_ref().expect("running").id().to_string();
    assert!(std::process::Command::new("kill").args(["-HUP", &pid]).status().expect("kill").success());
    let done =
        wait_for(Duration::from_secs(30), || tasks(&ids).iter().all(|t| t["status"] == "succeeded").then_some(()));
    assert!(done.is_some(), "after raising the limit: {:?}", tasks(&ids));
    assert_eq!(w.mock.count(&run), (12, 12));
}

#[test]
fn serve_warns_about_an_unset_api_key_at_start_up() {
    let w = world("", "", 4);
    let err = w.daemon.stderr();
    assert!(err.contains("TALLY_MONEY_TEST_SURELY_UNSET") && err.contains("nokey"), "{err}");
    assert!(!err.contains(&format!("variable {KEY_ENV} is not set")), "{err}");
}

/// The CLI says what the API says, in its own words: `submit --wait` ending unknown names
/// both next steps, `list --needs-attention` is the to-do list, a retry refusal names the
/// CLI's flags (not the API's JSON fields), a second retry needs `--acknowledge-retried-as`,
/// and `status` shows "retried as → task X".
#[test]
fn the_cli_guides_an_unknown_job_to_one_retry() {
    let w = world("", "0.04", 4);
    w.mock.behave(serde_json::json!({"drop_response": true}));
    let p = tag("cli lost");
    let out = w.daemon.cli(&["submit", &p, "--provider", "oa", "--wait"]);
    w.mock.behave(serde_json::json!({"drop_response": false}));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(4), "{text}");
    assert!(text.contains("tally resolve") && text.contains("tally retry"), "both next steps: {text}");
    let id = text
        .split_whitespace()
        .map(|w| w.trim_end_matches(':'))
        .find(|w| w.len() == 36 && w.matches('-').count() == 4)
        .expect("an id")
        .to_string();

    let out = w.daemon.cli(&["list", "--needs-attention"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains(&id), "the unknown job needs attention");

    let out = w.daemon.cli(&["retry", &id]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--accept-possible-charge") && !err.contains("acknowledge_possible_charge"), "{err}");
    assert!(err.contains("about $0.04"), "the retry says what it may cost: {err}");

    let out = w.daemon.cli(&["--json", "retry", &id, "--accept-possible-charge"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let first: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let first = first["id"].as_str().expect("retry id").to_string();
    w.daemon.wait_status(&first, SETTLED);
    assert_eq!(w.mock.count(&p), (2, 2), "the original and its one retry");

    let out = w.daemon.cli(&["list", "--needs-attention"]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains(&id), "a retried job leaves the to-do list");
    let out = w.daemon.cli(&["status", &id]);
    let status = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(status.contains(&format!("as → task {first} (succeeded)")), "{status}");

    let out = w.daemon.cli(&["retry", &id, "--accept-possible-charge"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "a second retry is not made by accident: {err}");
    assert!(err.contains(&format!("--acknowledge-retried-as {first}")), "{err}");
    assert_eq!(w.mock.count(&p), (2, 2), "nothing more was sent");
    let out = w.daemon.cli(&["retry", &id, "--accept-possible-charge", "--acknowledge-retried-as", &first]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// `/v1/providers` shows prices; `/metrics` counts settled requests by charge and their
/// estimated spend, from the database.
#[test]
fn providers_show_prices_and_metrics_count_requests_by_charge() {
    let w = world("", "0.04", 4);
    w.run("oa", &tag("metrics ok"));
    w.mock.behave(serde_json::json!({"reject_status": 400}));
    w.run("oa", &tag("metrics refused"));
    w.mock.behave(serde_json::json!({"reject_status": null}));
    let p = w.daemon.call("GET", "/v1/providers", None).json();
    let oa = p["providers"].as_array().expect("providers").iter().find(|p| p["name"] == "oa").expect("oa").clone();
    assert_eq!(
        (oa["price_per_image"].as_f64(), oa["currency"].as_str(), oa["billable"].as_bool()),
        (Some(0.04), Some("USD"), Some(true))
    );
    let nokey = p["providers"].as_array().unwrap().iter().find(|p| p["name"] == "nokey").expect("nokey").clone();
    assert!(nokey["price_per_image"].is_null(), "{nokey}");
    let r = crate::common::request(w.daemon.port, "GET", "/metrics", &[], None);
    let text = String::from_utf8_lossy(&r.body).to_string();
    let line = |needle: &[&str]| {
        text.lines()
            .find(|l| needle.iter().all(|n| l.contains(n)))
            .unwrap_or_else(|| panic!("no {needle:?} in\n{text}"))
            .to_string()
    };
    assert!(line(&["tally_provider_requests_total", "charge=\"charged\"", "provider=\"oa\""]).ends_with(" 1"));
    assert!(line(&["tally_provider_requests_total", "charge=\"refused\"", "provider=\"oa\""]).ends_with(" 1"));
    let spend = line(&["tally_estimated_spend_total", "charge=\"charged\"", "currency=\"USD\""]);
    assert!(spend.ends_with(" 0.04"), "{spend}");
}
