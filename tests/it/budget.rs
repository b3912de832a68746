//! The budget over the API and the CLI, against the real daemon and the mock provider's ledger:
//! the config's `[budget]` in force until one is set; a set one stored (it survives a restart),
//! holding the request that does not fit with words that name the budget, and releasing it
//! when raised; `null` removing a limit and `DELETE` going back to the config's. And the shop's
//! clock and currencies (issue #39): spend dated by `[ui] time_zone`'s local days, two
//! currencies reported side by side and never added, a whole-daemon budget counting only its own.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{Daemon, Mock, wait_for};

const SETTLED: &[&str] = &["succeeded", "failed", "unknown", "canceled"];

fn priced_daemon(mock: &Mock) -> Daemon {
    let base = mock.base();
    let mut d = Daemon::configure(&format!(
        "[budget]\ndaily = 0.10\n\n[[providers]]\nname = \"oa\"\nkind = \"openai_images\"\nbase_url = \"{base}\"\n\
         api_key_env = \"TALLY_TEST_KEY\"\nmodel = \"gpt-image-1\"\nmax_concurrency = 4\nrequest_timeout_ms = 5000\n\
         price_per_image = 0.04\nbudget_monthly = 20\n"
    ));
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-budget".into()));
    d
}

fn budget(d: &Daemon) -> Value {
    let r = d.call("GET", "/v1/budget", None);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

#[test]
fn a_budget_set_over_the_api_holds_survives_a_restart_and_releases_when_raised() {
    let mock = Mock::start(&["--job-duration-ms", "20"]);
    let mut d = priced_daemon(&mock);
    d.spawn();
    let b = budget(&d);
    assert_eq!((b["daily"].as_f64(), b["source"].as_str()), (Some(0.10), Some("config")), "{b}");
    assert_eq!(b["providers"]["oa"]["monthly"].as_f64(), Some(20.0), "{b}");
    assert_eq!(b["currency"], "USD");

    // Bad input is refused and changes nothing.
    for bad in [json!({"daily": -1}), json!({"providers": {"nobody": {"daily": 1}}}), json!({"weekly": 1})] {
        let r = d.call("PUT", "/v1/budget", Some(&bad));
        assert!((400..500).contains(&r.status), "{bad} answered {}", r.status);
    }
    assert_eq!(budget(&d)["source"], "config");

    let r = d.call("PUT", "/v1/budget", Some(&json!({"daily": 0.22})));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let b = r.json();
    assert_eq!((b["daily"].as_f64(), b["source"].as_str()), (Some(0.22), Some("set")), "{b}");
    assert_eq!(b["providers"]["oa"]["monthly"].as_f64(), Some(20.0), "limits not named stay: {b}");

    d.term();
    d.spawn();
    let b = budget(&d);
    assert_eq!((b["daily"].as_f64(), b["source"].as_str()), (Some(0.22), Some("set")), "after a restart: {b}");

    // 0.22 at 0.04 an image: five go, the sixth is held and says why.
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let ids: Vec<String> = (0..6)
        .map(|i| {
            let r =
                d.call("POST", "/v1/tasks", Some(&json!({"prompt": format!("budget {i} {tag}"), "provider": "oa"})));
            assert_eq!(r.status, 201);
            r.json()["id"].as_str().expect("id").to_string()
        })
        .collect();
    let held = wait_for(Duration::from_secs(30), || {
        let ts: Vec<Value> = ids.iter().map(|i| d.call("GET", &format!("/v1/tasks/{i}"), None).json()).collect();
        let settled = ts.iter().filter(|t| SETTLED.contains(&t["status"].as_str().unwrap_or(""))).count();
        let waiting: Vec<Value> = ts.into_iter().filter(|t| t["status"] == "waiting").collect();
        (settled == 5 && waiting.len() == 1).then(|| waiting[0].clone())
    })
    .expect("five settle and one waits");
    assert_eq!(mock.count(&tag).1, 5, "five charges reached the provider");
    let words = held["waiting_for"].as_str().unwrap_or("");
    assert!(words.starts_with("Held: today's budget of $0.22 is spent — raise it or wait until tomorrow"), "{held}");
    assert!(held["message"].as_str().unwrap_or("").contains("budget"), "{held}");
    let b = budget(&d);
    assert!((b["spent_today"].as_f64().unwrap_or(0.0) - 0.20).abs() < 1e-9, "{b}");
    assert!((b["providers"]["oa"]["spent_this_month"].as_f64().unwrap_or(0.0) - 0.20).abs() < 1e-9, "{b}");
    // The CLI names it too.
    let out = d.cli(&["status", held["id"].as_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("today's budget of $0.22 is spent"), "{out:?}");

    // Raising it with the CLI lets the held one go at once.
    let out = d.cli(&["budget", "set", "--daily", "0.40"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let done = d.wait_status(held["id"].as_str().unwrap(), SETTLED);
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(mock.count(&tag).1, 6);
    let out = d.cli(&["budget", "show"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("of $0.40") && text.contains("set with `tally budget set`"),
        "{text}"
    );

    // A provider's limit, `none` removing one, and a bad amount.
    let out = d.cli(&["budget", "set", "--monthly", "none", "--provider", "oa"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(budget(&d)["providers"]["oa"]["monthly"].is_null());
    let out = d.cli(&["budget", "set", "--daily", "lots"]);
    assert_eq!(out.status.code(), Some(2), "a bad amount is a usage error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("none"), "it says what to type");

    let r = d.call("PUT", "/v1/budget", Some(&json!({"daily": null})));
    assert_eq!(r.status, 200);
    let b = r.json();
    assert!(b["daily"].is_null() && b["source"] == "set", "{b}");

    // Back to the config's.
    let r = d.call("DELETE", "/v1/budget", None);
    assert_eq!(r.status, 200);
    let b = r.json();
    assert_eq!((b["daily"].as_f64(), b["source"].as_str()), (Some(0.10), Some("config")), "{b}");
    d.term();
    d.spawn();
    assert_eq!(budget(&d)["source"], "config", "the removal is kept too");
}

#[test]
fn resolving_with_a_charge_record_changes_the_task_spend_and_the_csv() {
    let mock = Mock::start(&["--job-duration-ms", "20"]);
    let mut d = priced_daemon(&mock);
    d.spawn();
    mock.behave(json!({ "drop_response": true }));
    let lost: Vec<String> = (0..2)
        .map(|i| {
            let r = d.call("POST", "/v1/tasks", Some(&json!({"prompt": format!("lost {i}"), "provider": "oa"})));
            r.json()["id"].as_str().expect("id").to_string()
        })
        .collect();
    for id in &lost {
        assert_eq!(d.wait_status(id, SETTLED)["status"], "unknown");
    }
    mock.behave(json!({ "drop_response": false }));
    let spent_before = budget(&d)["spent_today"].as_f64().unwrap_or(0.0);
    assert!((spent_before - 0.08).abs() < 1e-9, "two possibly charged: {spent_before}");

    // A bad record is refused; then the API with not_charged, the CLI with charged.
    let r = d.call(
        "POST",
        &format!("/v1/tasks/{}/resolve", lost[0]),
        Some(&json!({"outcome": "failed", "charge": "maybe"})),
    );
    assert_eq!(r.status, 422);
    let r = d.call(
        "POST",
        &format!("/v1/tasks/{}/resolve", lost[0]),
        Some(&json!({"outcome": "failed", "charge": "not_charged", "note": "not in the dashboard"})),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let t = r.json();
    assert_eq!((t["charge"]["state"].as_str(), t["charge"]["recorded_by_hand"].as_bool()), (Some("none"), Some(true)));
    assert_eq!(t["retry"]["requires_cost_acknowledgement"], false, "nothing to acknowledge once recorded as free");
    let out = d.cli(&["resolve", &lost[1], "--failed", "--charge", "charged"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let t = d.call("GET", &format!("/v1/tasks/{}", lost[1]), None).json();
    assert_eq!(
        (t["charge"]["state"].as_str(), t["charge"]["recorded_by_hand"].as_bool()),
        (Some("charged"), Some(true))
    );

    // Spend and the budget follow the record; the CSV says it was by hand.
    let spend = d.call("GET", "/v1/spend", None).json();
    assert_eq!(spend["totals"]["charged"]["count"], 1, "{spend}");
    assert_eq!(spend["totals"]["possibly_charged"]["count"], 0, "{spend}");
    assert_eq!(spend["totals"]["recorded_by_hand"], 2, "{spend}");
    assert!((budget(&d)["spent_today"].as_f64().unwrap_or(0.0) - 0.04).abs() < 1e-9);
    let out = d.cli(&["spend", "--csv"]);
    let csv = String::from_utf8_lossy(&out.stdout).to_string();
    let line = |id: &str| csv.lines().find(|l| l.contains(id)).unwrap_or_default().to_string();
    assert!(line(&lost[0]).contains(",none,") && line(&lost[0]).ends_with(",by hand"), "{csv}");
    assert!(line(&lost[1]).contains(",charged,") && line(&lost[1]).ends_with(",by hand"), "{csv}");
}

/// A zone whose date differs from UTC's right now: Kiritimati (UTC+14) from 10:00 UTC, Pago
/// Pago (UTC−11) before 11:00 UTC.
fn zone_off_utc() -> (&'static str, String, String) {
    let now = jiff::Timestamp::now();
    let name = if now.to_zoned_datetime(jiff::tz::TimeZone::UTC).hour() >= 10 {
        "Pacific/Kiritimati"
    } else {
        "Pacific/Pago_Pago"
    };
    let zone = jiff::tz::TimeZone::get(name).expect("bundled zone");
    let local = now.to_zoned_datetime(zone).date().to_string();
    let utc = now.to_zoned_datetime(jiff::tz::TimeZone::UTC).date().to_string();
    (name, local, utc)
}

#[test]
fn spend_is_dated_in_the_shops_zone_and_kept_per_currency() {
    let mock = Mock::start(&[]);
    let base = mock.base();
    let (zone, local, utc) = zone_off_utc();
    let provider = |name: &str, price: &str, currency: &str| {
        format!(
            "[[providers]]\nname = \"{name}\"\nkind = \"openai_images\"\nbase_url = \"{base}\"\n\
             api_key_env = \"TALLY_TEST_KEY\"\nmodel = \"gpt-image-1\"\nrequest_timeout_ms = 5000\n\
             price_per_image = {price}\ncurrency = \"{currency}\"\n"
        )
    };
    let mut d = Daemon::configure(&format!(
        "[ui]\ntime_zone = \"{zone}\"\n\n[budget]\ndaily = 0.30\ncurrency = \"CNY\"\n\n{}\n{}",
        provider("cn", "0.30", "CNY"),
        provider("us", "0.04", "USD")
    ));
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-zone".into()));
    d.spawn();
    let submit = |p: &str, prompt: &str| {
        let r = d.call("POST", "/v1/tasks", Some(&json!({"prompt": prompt, "provider": p})));
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        r.json()["id"].as_str().expect("id").to_string()
    };
    // The CNY budget of 0.30 takes the CNY request whole; the USD one is not counted against it.
    for p in ["cn", "us"] {
        let t = d.wait_status(&submit(p, &format!("one in {p}")), SETTLED);
        assert_eq!((t["status"].as_str(), t["charge"]["state"].as_str()), (Some("succeeded"), Some("charged")), "{t}");
    }
    // A second CNY request is held until the zone's next midnight, and says so.
    let held = d.wait_status(&submit("cn", "two in cn"), &["waiting"]);
    let words = held["waiting_for"].as_str().unwrap_or("");
    assert!(words.contains(&format!("tomorrow (00:00 {zone})")) && words.contains("0.30 CNY"), "{held}");
    let r = d.call("GET", "/v1/spend?group=day", None);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let s = r.json();
    assert_eq!(s["time_zone"], zone, "{s}");
    // One row per currency, both dated by the zone's local day, not UTC's.
    let rows: Vec<(String, String, f64)> = s["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            let key = r["key"].as_str().unwrap_or("").to_string();
            (key, r["currency"].as_str().unwrap_or("").to_string(), r["charged"]["amount"].as_f64().unwrap_or(-1.0))
        })
        .collect();
    assert_ne!(local, utc);
    assert_eq!(rows, vec![(local.clone(), "CNY".into(), 0.30), (local.clone(), "USD".into(), 0.04)], "{s}");
    assert_eq!(s["currencies"], json!(["CNY", "USD"]), "{s}");
    // Never added across currencies: the totals count both, the amounts stay per currency.
    assert_eq!((s["currency"].clone(), s["totals"]["charged"]["count"].clone()), (Value::Null, json!(2)), "{s}");
    assert_eq!(s["totals"]["charged"]["amount"].as_f64(), Some(0.0), "{s}");
    let by: Vec<(Value, Value)> = s["totals_by_currency"]
        .as_array()
        .expect("totals_by_currency")
        .iter()
        .map(|t| (t["currency"].clone(), t["charged"]["amount"].clone()))
        .collect();
    assert_eq!(by, vec![(json!("CNY"), json!(0.3)), (json!("USD"), json!(0.04))], "{s}");
    // The CNY budget counts the CNY request only, and resets at the zone's next midnight.
    let b = &s["budgets"][0];
    assert_eq!((b["currency"].as_str(), b["spent"].as_f64()), (Some("CNY"), Some(0.3)), "{s}");
    let resets: jiff::Timestamp = b["resets_at"].as_str().expect("resets_at").parse().expect("RFC 3339");
    let tz = jiff::tz::TimeZone::get(zone).expect("zone");
    let midnight = resets.to_zoned_datetime(tz.clone());
    assert_eq!((midnight.hour(), midnight.minute()), (0, 0), "{s}");
    let tomorrow = jiff::Timestamp::now().to_zoned_datetime(tz).date().tomorrow().expect("a date");
    assert_eq!(midnight.date(), tomorrow, "{s}");
    // A local date as `from` starts at the zone's midnight: today's local date includes both.
    let r = d.call("GET", &format!("/v1/spend?group=month&from={local}&to={local}"), None);
    assert_eq!(r.json()["totals"]["charged"]["count"], 2, "{}", String::from_utf8_lossy(&r.body));
    // `tally spend` shows the same local day, each currency on its own line.
    let cli = d.cli(&["spend"]);
    let out = String::from_utf8_lossy(&cli.stdout);
    let day_lines: Vec<&str> = out.lines().filter(|l| l.starts_with(local.as_str())).collect();
    assert_eq!(day_lines.len(), 2, "{out}");
    assert!(day_lines.iter().any(|l| l.contains("CNY")) && day_lines.iter().any(|l| l.contains("$0.04")), "{out}");
    assert!(!out.lines().any(|l| l.starts_with(utc.as_str())), "{out}");
    assert_eq!(budget(&d)["time_zone"], zone);
    let out = d.cli(&["budget", "show"]);
    let out = String::from_utf8_lossy(&out.stdout);
    assert!(out.contains(&format!("days and months are those of {zone}")), "{out}");
    // A provider added in the page may use any currency, but not one the whole daemon's budget
    // in force would not count.
    let added = |name: &str, currency: &str| {
        let body = json!({"name": name, "kind": "openai_images", "model": "gpt-image-1", "base_url": base,
                          "price_per_image": 0.5, "currency": currency});
        d.call("POST", "/v1/providers", Some(&body))
    };
    let r = added("eu", "EUR");
    let why = String::from_utf8_lossy(&r.body).to_string();
    assert_eq!(r.status, 422, "{why}");
    assert!(why.contains("EUR") && why.contains("CNY") && why.contains("daily"), "{why}");
    assert_eq!(added("cn2", "CNY").status, 201);
    // With two currencies a whole-daemon budget must name its currency: one removed cannot
    // come back over the API (it would not know which), a provider's can.
    let r = d.call("PUT", "/v1/budget", Some(&json!({"daily": null})));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let r = d.call("PUT", "/v1/budget", Some(&json!({"daily": 5})));
    assert_eq!(r.status, 422, "{}", String::from_utf8_lossy(&r.body));
    assert!(String::from_utf8_lossy(&r.body).contains("CNY, USD"), "{}", String::from_utf8_lossy(&r.body));
    let r = d.call("PUT", "/v1/budget", Some(&json!({"providers": {"cn": {"daily": 0.30}}})));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["providers"]["cn"]["currency"], "CNY", "{}", String::from_utf8_lossy(&r.body));
}

#[test]
fn the_shops_time_zone_is_shown_and_set_with_the_cli() {
    let d = Daemon::start("");
    let text = |out: &std::process::Output| String::from_utf8_lossy(&out.stdout).to_string();
    // Shown: the configuration's (the tests' daemons run in UTC).
    let out = d.cli(&["time-zone"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text(&out).starts_with("The shop's time zone: UTC (now "), "{}", text(&out));
    assert!(text(&out).contains("From the configuration"), "{}", text(&out));
    // An unknown name is refused with the reason, and nothing changes.
    let out = d.cli(&["time-zone", "Asia/Atlantis"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("Asia/Atlantis"), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(d.call("GET", "/v1/time-zone", None).json()["source"], "config");
    // Set: the answer says so, the daemon holds it, and the CLI's times follow it.
    let out = d.cli(&["time-zone", "Asia/Shanghai"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text(&out).starts_with("The shop's time zone: Asia/Shanghai (now "), "{}", text(&out));
    assert!(text(&out).contains(" +08:00)."), "{}", text(&out));
    let z = d.call("GET", "/v1/time-zone", None).json();
    assert_eq!((z["time_zone"].as_str(), z["source"].as_str()), (Some("Asia/Shanghai"), Some("set")), "{z}");
    assert_eq!(budget(&d)["time_zone"], "Asia/Shanghai");
    let out = d.cli(&["time-zone", "--json"]);
    let j: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(j["now"].as_str().is_some_and(|n| n.ends_with("+08:00")), "{j}");
    // Back to the configuration's.
    let out = d.cli(&["time-zone", "--reset"]);
    assert!(out.status.success() && text(&out).starts_with("The shop's time zone: UTC"), "{}", text(&out));
    assert_eq!(d.call("GET", "/v1/time-zone", None).json()["source"], "config");
}
