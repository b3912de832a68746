//! The shop's clock in a real browser at phone size (390×844): the time zone chosen in the
//! page's Settings, a budget day that begins at that zone's midnight (Asia/Shanghai, 16:00 UTC),
//! and Spend's rows by the zone's local day — in English and in Chinese, axe-clean.
//!
//! The daemon's clock is put just before a local midnight with `TALLY_TEST_CLOCK_AT` (test
//! builds only), from which it runs at the real pace: nothing here waits for a real midnight.

use fantoccini::Locator;
use serde_json::{Value, json};

use crate::browser::Browser;
use crate::common::{Daemon, Mock};
use crate::web::printed_sign_in_url;

const ZONE: &str = "Asia/Shanghai";

/// A priced provider ($0.04 an image) and a daily budget of one image.
fn config(mock: &Mock, language: &str) -> String {
    let ui = if language == "en" { String::new() } else { format!("[ui]\nlanguage = \"{language}\"\n\n") };
    format!(
        "{ui}[budget]\ndaily = 0.04\n\n[[providers]]\nname = \"paid\"\nkind = \"openai_images\"\nbase_url = \"{}\"\n\
         model = \"gpt-image-1\"\napi_key_env = \"TALLY_TEST_KEY\"\nrequest_timeout_ms = 5000\nprice_per_image = 0.04\n",
        mock.base()
    )
}

fn submit(d: &Daemon, prompt: &str) -> String {
    let r = d.call("POST", "/v1/tasks", Some(&json!({"prompt": prompt, "provider": "paid"})));
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    r.json()["id"].as_str().expect("id").to_string()
}

/// `(key, charged amount)` of each row of `GET /v1/spend?group=day`.
fn day_rows(d: &Daemon) -> Vec<(String, f64)> {
    let s = d.call("GET", "/v1/spend?group=day", None).json();
    assert_eq!(s["time_zone"], ZONE, "{s}");
    s["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| (r["key"].as_str().unwrap_or("").to_string(), r["charged"]["amount"].as_f64().unwrap_or(-1.0)))
        .collect()
}

#[test]
fn a_budget_day_begins_at_the_shops_midnight_chosen_in_the_page() {
    day_boundary("en", "The shop's time zone", "every page of the file and every image's record are whole");
}

#[test]
fn a_budget_day_begins_at_the_shops_midnight_chosen_in_the_page_in_chinese() {
    day_boundary("zh-CN", "店铺所在时区", "文件的每一页和每张图片的记录都完好");
}

fn day_boundary(language: &str, card_title: &str, card_check: &str) {
    let shanghai = jiff::tz::TimeZone::get(ZONE).expect("bundled zone");
    // A day D two days from now in Shanghai: the daemon starts at its noon, and later just
    // before its midnight. In UTC both moments are on the same date (04:00 and 15:59:56).
    let today = jiff::Timestamp::now().to_zoned_datetime(shanghai.clone()).date();
    let day = today.checked_add(jiff::Span::new().days(2)).expect("a date");
    let next = day.tomorrow().expect("a date");
    let noon = day.at(12, 0, 0, 0).to_zoned_datetime(shanghai.clone()).expect("noon").timestamp();
    let before_midnight = next.at(0, 0, 0, 0).to_zoned_datetime(shanghai.clone()).expect("midnight").timestamp()
        - jiff::SignedDuration::from_secs(4);
    let utc = |t: jiff::Timestamp| t.to_zoned_datetime(jiff::tz::TimeZone::UTC).date();
    assert_eq!(utc(noon), utc(before_midnight), "one UTC date: only the shop's zone makes two days");

    let mock = Mock::start(&["--job-duration-ms", "20"]);
    let mut d = Daemon::configure(&config(&mock, language));
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-clock".into()));
    d.env.push(("TALLY_TEST_CLOCK_AT".into(), noon.to_string()));
    d.spawn();

    // Over the API first: an unknown name is refused and changes nothing.
    let before = d.call("GET", "/v1/time-zone", None).json();
    assert_eq!((before["time_zone"].as_str(), before["source"].as_str()), (Some("UTC"), Some("config")), "{before}");
    let r = d.call("PUT", "/v1/time-zone", Some(&json!({"time_zone": "Asia/Atlantis"})));
    assert_eq!(r.status, 422, "{}", String::from_utf8_lossy(&r.body));
    assert!(String::from_utf8_lossy(&r.body).contains("Asia/Atlantis"), "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(d.call("GET", "/v1/time-zone", None).json(), before, "nothing changed");

    let url = printed_sign_in_url(&d);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = Browser::phone().await;
        b.sign_in(&url).await;
        // Settings: choose the shop's zone.
        b.click("#nav-settings").await;
        b.until("the time zone card", 10, "document.getElementById('time-zone-name') !== null").await;
        assert_eq!(b.js("document.getElementById('time-zone-title').textContent").await, card_title);
        b.assert_accessible("the settings with the time zone").await;
        b.js(&format!("(document.getElementById('time-zone-name').value = '{ZONE}')")).await;
        b.click("#time-zone-save").await;
        b.until(
            "the page again, in the shop's zone",
            15,
            &format!(
                "document.querySelector('meta[name=time-zone]')?.content === '{ZONE}' && \
                 document.getElementById('time-zone-reset') !== null"
            ),
        )
        .await;
        // The card says the shop's time now: the daemon's clock, at noon in Shanghai.
        let now = b.js("document.getElementById('time-zone-now').textContent").await;
        let now = now.as_str().unwrap_or("");
        assert!(now.contains(ZONE) && now.contains("12:0"), "{now}");
        // The database file's card: the background check after start-up passed.
        b.until(
            "the database check's line",
            10,
            "document.getElementById('db-check-state')?.dataset.state === 'passed'",
        )
        .await;
        let check = b.js("document.getElementById('db-check-state').textContent").await;
        assert!(check.as_str().is_some_and(|c| c.contains(card_check)), "{check}");
        b.assert_accessible("the settings after choosing a zone").await;
        b.close().await;
    });
    let set = d.call("GET", "/v1/time-zone", None).json();
    assert_eq!((set["time_zone"].as_str(), set["source"].as_str()), (Some(ZONE), Some("set")), "{set}");
    assert!(set["now"].as_str().is_some_and(|n| n.ends_with("+08:00")), "{set}");

    // Day D: the first image takes the day's budget, the second waits for the zone's midnight.
    let first = d.wait_status(&submit(&d, "before midnight"), &["succeeded"]);
    assert_eq!(first["charge"]["state"], "charged", "{first}");
    let second = submit(&d, "after midnight");
    let held = d.wait_status(&second, &["waiting"]);
    let words = held["waiting_for"].as_str().unwrap_or("");
    let midnight_words =
        if language == "en" { format!("tomorrow (00:00 {ZONE})") } else { format!("明天（{ZONE} 00:00）") };
    assert!(words.contains(&midnight_words), "{held}");
    assert_eq!(mock.count("after midnight"), (0, 0), "held: nothing sent");
    assert_eq!(day_rows(&d), vec![(day.to_string(), 0.04)]);

    // Later the same day, seconds before the shop's midnight (the zone set in the page is
    // stored: it holds across the restart). The held image goes once the day turns.
    d.term();
    d.env.retain(|(k, _)| k != "TALLY_TEST_CLOCK_AT");
    d.env.push(("TALLY_TEST_CLOCK_AT".into(), before_midnight.to_string()));
    d.spawn();
    assert_eq!(d.call("GET", "/v1/time-zone", None).json()["source"], "set");
    let done = d.wait_status(&second, &["succeeded"]);
    assert_eq!(done["charge"]["state"], "charged", "{done}");
    assert_eq!(mock.count("after midnight"), (1, 1), "sent once, after midnight");
    // Spend by the shop's days: two rows, one image each (UTC would show one day with two).
    assert_eq!(day_rows(&d), vec![(day.to_string(), 0.04), (next.to_string(), 0.04)]);
    // The CLI shows the job's times in the shop's zone too (its JSON keeps RFC 3339 UTC).
    let out = d.cli(&["status", &second]);
    let out = String::from_utf8_lossy(&out.stdout).to_string();
    let created = done["created_at"].as_str().expect("created_at").parse::<jiff::Timestamp>().expect("RFC 3339");
    let local = created.to_zoned_datetime(shanghai.clone()).strftime("%Y-%m-%d %H:%M:%S +08:00").to_string();
    assert!(out.contains(&local) && !out.contains(done["created_at"].as_str().unwrap_or("-")), "{local}: {out}");
    let budget = d.call("GET", "/v1/budget", None).json();
    assert_eq!((budget["spent_today"].as_f64(), budget["time_zone"].as_str()), (Some(0.04), Some(ZONE)), "{budget}");

    rt.block_on(async {
        let b = Browser::phone().await;
        b.sign_in(&printed_sign_in_url(&d)).await;
        b.c().goto(&format!("http://127.0.0.1:{}/#/spend", d.port)).await.expect("spend");
        b.until("the spend view", 10, "document.getElementById('spend-group') !== null").await;
        let group = b.c().find(Locator::Css("#spend-group")).await.expect("group");
        group.select_by_value("day").await.expect("by day");
        let keys = b
            .until(
                "two local days",
                10,
                "(() => { const r = document.querySelectorAll('#spend-rows tbody tr th'); \
                 return r.length === 2 ? Array.from(r, (x) => x.textContent) : null; })()",
            )
            .await;
        assert_eq!(keys, json!([day.to_string(), next.to_string()]), "Spend's rows are the shop's days");
        let cells: Value = b
            .js("Array.from(document.querySelectorAll('#spend-rows tbody tr td:first-of-type'), (x) => x.textContent)")
            .await;
        assert!(
            cells
                .as_array()
                .is_some_and(|c| c.len() == 2 && c.iter().all(|x| x.as_str().unwrap_or("").contains("0.04"))),
            "{cells}"
        );
        b.assert_accessible("Spend by the shop's days").await;
        // The budget line counts today, the new local day: one image of one.
        b.click("#nav-jobs").await;
        let line = b.until("the budget line", 10, "document.getElementById('budget-line')?.textContent || null").await;
        let line = line.as_str().unwrap_or("");
        assert_eq!(line.matches("$0.04").count(), 2, "today's spend and limit: {line}");
        b.close().await;
    });
}
