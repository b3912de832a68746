//! Candidates per shot and the owner's choice through a real daemon: `POST /v1/sets` with
//! `candidates`, `POST /v1/sets/{id}/shots/{index}/candidates` (the cost acknowledgement of a
//! billing provider, asserted on the mock's ledger), `PUT`/`DELETE .../choice`, the set's
//! `delivery.blocking`, the zip, and `tally set create --candidates / more / choose`.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::*;

fn set_of(d: &Daemon, id: &str) -> Value {
    let r = d.call("GET", &format!("/v1/sets/{id}"), None);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

fn candidates(shot: &Value) -> Vec<Value> {
    shot["candidates"].as_array().cloned().unwrap_or_default()
}

/// Wait until every candidate of every shot is settled; the set then.
fn settled(d: &Daemon, id: &str) -> Value {
    let mut last = Value::Null;
    let done = wait_for(Duration::from_secs(60), || {
        last = set_of(d, id);
        let all = last["shots"].as_array()?.iter().flat_map(candidates).collect::<Vec<_>>();
        let fin = ["succeeded", "failed", "unknown", "canceled"];
        all.iter().all(|c| fin.contains(&c["status"].as_str().unwrap_or(""))).then(|| last.clone())
    });
    done.unwrap_or_else(|| panic!("set {id} never settled: {last}"))
}

fn art(c: &Value) -> (String, String) {
    (c["artifact"]["id"].as_str().expect("artifact").to_string(), c["artifact"]["sha256"].as_str().expect("sha").into())
}

#[test]
fn candidates_are_chosen_through_the_api_and_the_cli() {
    let d = Daemon::start(FAST_DEMO);
    let tag = uuid::Uuid::new_v4().simple().to_string();
    // Out of range: a 400 that says why, and no set.
    for n in [0, 5] {
        let body = json!({"product": "teapot", "shots": [{"role": "main", "prompt": tag, "candidates": n}]});
        let r = d.call("POST", "/v1/sets", Some(&body));
        assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
        assert!(r.json()["error"]["message"].as_str().unwrap_or("").contains("candidates must be 1 to 4"));
    }
    assert_eq!(d.call("GET", "/v1/sets", None).json()["sets"].as_array().map(Vec::len), Some(0));
    let body = json!({"product": "green teapot", "shots": [
        {"role": "main", "prompt": format!("on white {tag}"), "candidates": 2},
        {"role": "scene", "prompt": format!("on a shelf {tag}")}]});
    let r = d.call("POST", "/v1/sets", Some(&body));
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let id = r.json()["id"].as_str().expect("id").to_string();
    let s = settled(&d, &id);
    let shots = s["shots"].as_array().expect("shots").clone();
    assert_eq!(shots.iter().map(|x| candidates(x).len()).collect::<Vec<_>>(), [2, 1]);
    assert_eq!(shots[0]["id"], candidates(&shots[0])[0]["task_id"], "a shot's task is its first candidate");
    let (a0, sha0) = art(&candidates(&shots[0])[0]);
    let (a1, sha1) = art(&candidates(&shots[0])[1]);
    let (b0, _) = art(&candidates(&shots[1])[0]);
    assert_ne!(sha0, sha1, "the demo draws each candidate of a shot differently");
    assert_eq!(
        s["delivery"],
        json!({"ready": false,
        "blocking": ["2 shots have no chosen image: Main photo, Lifestyle scene"]})
    );
    assert_eq!(s["shots_chosen"], 0);
    // Refusals, each with its reason.
    let choice = |i: &str| format!("/v1/sets/{id}/shots/{i}/choice");
    let r = d.call("PUT", &choice("0"), Some(&json!({"artifact_id": b0})));
    assert_eq!((r.status, r.error_code().as_str()), (409, "not_a_candidate"));
    let r = d.call("PUT", &choice("0"), Some(&json!({"artifact_id": "no-such-image"})));
    assert_eq!(r.status, 404);
    assert_eq!(d.call("PUT", &choice("9"), Some(&json!({"artifact_id": a0}))).status, 404);
    assert_eq!(d.call("PUT", &choice("x"), Some(&json!({"artifact_id": a0}))).status, 400);
    // Choose, change, and the timeline records both.
    let r = d.call("PUT", &choice("0"), Some(&json!({"artifact_id": a0})));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let r = d.call("PUT", &choice("0"), Some(&json!({"artifact_id": a1})));
    let s = r.json();
    assert_eq!(s["shots"][0]["chosen"], json!(a1));
    assert_eq!(s["shots"][0]["candidates"][1]["chosen"], true);
    assert_eq!(s["delivery"]["blocking"], json!(["1 shot has no chosen image: Lifestyle scene"]));
    let kinds: Vec<&str> =
        s["timeline"].as_array().expect("timeline").iter().filter_map(|e| e["kind"].as_str()).collect();
    assert_eq!(kinds, ["created", "chosen", "chosen"]);
    // The zip: shot 0's chosen image only; shot 1 (none chosen) every candidate.
    let more = d.call("POST", &format!("/v1/sets/{id}/shots/1/candidates"), Some(&json!({"count": 1})));
    assert_eq!(more.status, 201, "{}", String::from_utf8_lossy(&more.body));
    let bad = d.call("POST", &format!("/v1/sets/{id}/shots/1/candidates"), Some(&json!({"count": 5})));
    assert_eq!(bad.status, 400);
    let s = settled(&d, &id);
    assert_eq!(candidates(&s["shots"][1]).len(), 2);
    let zip = d.call("GET", &format!("/v1/sets/{id}/download"), None);
    assert_eq!(zip.status, 200);
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(zip.body)).expect("zip");
    let mut shas = std::collections::BTreeSet::new();
    for i in 0..z.len() {
        let mut e = z.by_index(i).expect("entry");
        let mut b = Vec::new();
        std::io::Read::read_to_end(&mut e, &mut b).expect("read");
        shas.insert(sha256_hex(&b));
    }
    let want: std::collections::BTreeSet<String> =
        std::iter::once(sha1.clone()).chain(candidates(&s["shots"][1]).iter().map(|c| art(c).1)).collect();
    assert_eq!(shas, want, "the chosen image where chosen, else every candidate");
    // The CLI: choose by role, clear, ask for more, create with --candidates.
    let out = d.cli(&["set", "choose", &id, "scene", &b0]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(set_of(&d, &id)["delivery"], json!({"ready": true, "blocking": []}));
    let out = d.cli(&["set", "unchoose", &id, "0"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(set_of(&d, &id)["shots"][0]["chosen"], Value::Null);
    assert_eq!(set_of(&d, &id)["timeline"].as_array().map(Vec::len), Some(6), "created, 3 chosen, 1 added, 1 cleared");
    let out = d.cli(&["set", "more", &id, "main", "--count", "2"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(candidates(&settled(&d, &id)["shots"][0]).len(), 4);
    let out = d.cli(&["set", "choose", &id, "nope", &a0]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no shot of this set has the role `nope`"));
    let out = d.cli(&[
        "--json",
        "set",
        "create",
        "--product",
        "mug",
        "--candidates",
        "3",
        "--shot",
        &format!("main:a mug {tag}"),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let made: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(candidates(&made["shots"][0]).len(), 3);
}

const KEY_ENV: &str = "TALLY_CANDIDATES_TEST_KEY";

#[test]
fn more_candidates_of_a_billing_provider_need_the_cost_acknowledgement() {
    let mock = Mock::start(&[]);
    let providers = format!(
        "[[providers]]\nname = \"oa\"\nkind = \"openai_images\"\nbase_url = \"{}\"\napi_key_env = \"{KEY_ENV}\"\n\
         model = \"gpt-image-2.5-flare\"\nmax_concurrency = 4\nrequest_timeout_ms = 5000\nconnect_timeout_ms = 1000\n\
         price_per_image = 0.04\n",
        mock.base()
    );
    let mut d = Daemon::configure(&providers);
    d.env.push((KEY_ENV.into(), "sk-test-candidates".into()));
    d.spawn();
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let body =
        json!({"product": "lamp", "provider": "oa", "shots": [{"role": "main", "prompt": format!("lamp {tag}")}]});
    let r = d.call("POST", "/v1/sets", Some(&body));
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let id = r.json()["id"].as_str().expect("id").to_string();
    settled(&d, &id);
    assert_eq!(mock.count(&tag), (1, 1));
    let path = format!("/v1/sets/{id}/shots/0/candidates");
    let r = d.call("POST", &path, Some(&json!({"count": 2})));
    assert_eq!(r.status, 409, "{}", String::from_utf8_lossy(&r.body));
    let e = r.json()["error"].clone();
    assert_eq!(e["code"], "cost_acknowledgement_required");
    assert_eq!(e["estimated_cost"], json!({"amount": 0.08, "currency": "USD", "images": 2}));
    assert!(e["message"].as_str().unwrap_or("").contains("$0.08"), "{e}");
    let out = d.cli(&["set", "more", &id, "0", "--count", "2"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--accept-possible-charge"));
    assert_eq!(candidates(&set_of(&d, &id)["shots"][0]).len(), 1, "nothing was made");
    assert_eq!(mock.count(&tag), (1, 1), "nothing was sent");
    let r = d.call("POST", &path, Some(&json!({"count": 2, "acknowledge_possible_charge": true})));
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let s = settled(&d, &id);
    assert_eq!(candidates(&s["shots"][0]).len(), 3);
    assert_eq!(mock.count(&tag), (3, 3), "each acknowledged candidate is one charged request");
    assert!(candidates(&s["shots"][0]).iter().all(|c| c["charge"]["state"] == "charged"));
}

/// In a real browser: a shot's candidates side by side, "Use this one", the chosen image
/// marked and the delivery line, "Generate another like this" adding a candidate, the set
/// list's count of chosen shots; axe-core finds nothing on the set page.
#[test]
fn the_owner_chooses_a_candidate_in_the_page() {
    let d = Daemon::start(FAST_DEMO);
    let url = crate::web::printed_sign_in_url(&d);
    let site = format!("http://127.0.0.1:{}", d.port);
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let body = json!({"product": "green teapot", "shots": [
        {"role": "main", "prompt": format!("on white {tag}"), "candidates": 2},
        {"role": "scene", "prompt": format!("on a shelf {tag}")}]});
    let r = d.call("POST", "/v1/sets", Some(&body));
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let id = r.json()["id"].as_str().expect("id").to_string();
    let s = settled(&d, &id);
    let (second, _) = art(&candidates(&s["shots"][0])[1]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = crate::browser::Browser::start().await;
        b.sign_in(&url).await;
        b.c().goto(&format!("{site}/#/sets/{id}")).await.expect("open the set");
        b.until(
            "two candidates side by side",
            15,
            "document.querySelectorAll('#candidates-0 .candidate').length === 2",
        )
        .await;
        let line = b.js("document.getElementById('set-delivery').textContent").await;
        assert_eq!(line, "2 shots have no chosen image: Main photo, Lifestyle scene");
        b.assert_accessible("the set page with candidates").await;
        // Two candidates, none chosen: no shot download that would pick one for the owner.
        assert_eq!(b.js("document.getElementById('shot-download-0') === null").await, json!(true));
        // Use the second candidate: it is marked chosen, through the API too.
        b.click("#use-0-1").await;
        b.until(
            "the second candidate marked chosen",
            15,
            &format!("document.querySelector('#candidates-0 .candidate.chosen')?.dataset.artifactId === '{second}'"),
        )
        .await;
        let mark = b.js("document.querySelector('#candidates-0 .candidate.chosen').textContent").await;
        assert!(mark.as_str().unwrap_or("").contains("Chosen"), "{mark}");
        assert_eq!(set_of(&d, &id)["shots"][0]["chosen"], json!(second));
        // The shot's download gives the chosen image, not the first candidate's.
        let dl = b.js("document.getElementById('shot-download-0')?.dataset.artifactId").await;
        assert_eq!(dl, json!(second), "the shot's download is its chosen image");
        // The single-candidate shot: "Use this one", then the set is ready.
        b.click("#use-1-0").await;
        b.until("ready to deliver", 15, "document.getElementById('set-delivery').dataset.ready === 'true'").await;
        b.assert_accessible("the set page with every shot chosen").await;
        // "Generate another like this" adds a candidate to the shot (the demo is free: no question).
        b.click("#shot-more-1").await;
        b.until(
            "a second candidate for shot 2",
            30,
            "document.querySelectorAll('#candidates-1 .candidate').length === 2",
        )
        .await;
        assert_eq!(candidates(&set_of(&d, &id)["shots"][1]).len(), 2);
        // The set list says how many shots are chosen.
        b.c().goto(&format!("{site}/#/sets")).await.expect("open the list");
        let count = b
            .until(
                "the chosen count",
                15,
                &format!("document.querySelector(\"li[data-set-id='{id}'] .chosen-count\")?.textContent"),
            )
            .await;
        assert_eq!(count, "2 of 2 shots chosen");
        b.close().await;
    });
}

/// A shot with a good candidate and one whose answer was lost after the provider charged: the
/// shot is not painted "ready" but "needs a look" with a line saying why, and the lost
/// candidate carries its own "Record what you found…" and "Generate again…" with the price.
/// Generating it again asks for the acknowledgement, sends one new request, and the shot is
/// ready again. At phone width, axe-clean.
#[test]
fn an_unknown_candidate_is_acted_on_from_the_set_page() {
    let mock = Mock::start(&[]);
    let providers = format!(
        "[[providers]]\nname = \"openai\"\nkind = \"openai_images\"\nbase_url = \"{}\"\nmodel = \"{}\"\n\
         price_per_image = 0.04\napi_key_env = \"TALLY_TEST_KEY\"\nrequest_timeout_ms = 5000\n",
        mock.base(),
        OPENAI_MODEL
    );
    let mut d = Daemon::configure(&providers);
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test".into()));
    d.spawn();
    let url = crate::web::printed_sign_in_url(&d);
    let r = d.call(
        "POST",
        "/v1/sets",
        Some(&json!({"product": "celadon bowl", "shots": [{"role": "main", "prompt": "on white"}]})),
    );
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let id = r.json()["id"].as_str().expect("id").to_string();
    settled(&d, &id);
    // The second candidate's answer is lost after the charge: unknown.
    mock.behave(json!({ "drop_response": true }));
    let more = d.call(
        "POST",
        &format!("/v1/sets/{id}/shots/0/candidates"),
        Some(&json!({"count": 1, "acknowledge_possible_charge": true})),
    );
    assert!(more.status < 300, "{}", String::from_utf8_lossy(&more.body));
    let s = settled(&d, &id);
    assert_eq!(candidates(&s["shots"][0])[1]["status"], "unknown", "{s}");
    mock.behave(json!({ "drop_response": false }));
    let charged_before = mock.lines().iter().filter(|l| l["charged"] == true).count();

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = crate::browser::Browser::phone().await;
        b.sign_in(&url).await;
        b.c().goto(&format!("http://127.0.0.1:{}/#/sets/{id}", d.port)).await.expect("open the set");
        b.until("the lost candidate's buttons", 15, "document.getElementById('cand-retry-0-1') !== null").await;
        let standing = b.js("document.querySelector('#shots li.shot').dataset.standing").await;
        assert_eq!(standing, "done_with_problems", "a shot with an unknown candidate is not green");
        let line = b.js("document.getElementById('shot-attention-0').textContent").await;
        assert!(line.as_str().is_some_and(|l| l.contains("1 ended unknown")), "{line}");
        assert_eq!(b.js("document.getElementById('cand-resolve-0-1') !== null").await, json!(true));
        assert_eq!(
            b.js("document.getElementById('cand-retry-0-0') === null").await,
            json!(true),
            "the good one has none"
        );
        let price = b.js("document.getElementById('cand-retry-price-0-1').textContent").await;
        assert!(price.as_str().is_some_and(|p| p.contains("0.04")), "the price beside the button: {price}");
        b.assert_accessible("a set page with an unknown candidate").await;
        // "Record what you found…" opens the form for that candidate's job.
        b.click("#cand-resolve-0-1").await;
        b.until("the resolve form", 10, "document.getElementById('resolve-dialog').open").await;
        b.click("#resolve-dialog-close").await;
        // "Generate again…": the acknowledgement first, then one new request.
        b.click("#cand-retry-0-1").await;
        b.until("the retry question", 10, "document.getElementById('retry-dialog').open").await;
        b.click("#retry-ack").await;
        b.click("#retry-confirm").await;
        b.until(
            "the shot ready again",
            30,
            "document.querySelector('#shots li.shot')?.dataset.standing === 'succeeded'",
        )
        .await;
        b.close().await;
    });
    let charged = mock.lines().iter().filter(|l| l["charged"] == true).count();
    assert_eq!(charged, charged_before + 1, "generating again sent exactly one charged request");
}
