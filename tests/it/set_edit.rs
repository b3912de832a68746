//! Editing, duplicating and deleting a set through the real daemon's API and CLI (issue #27):
//! a queued shot's typo fixed (and the request the provider then receives carrying the fix), a
//! running shot refused in plain words with what to do instead, a duplicate made as a copy to
//! edit that sends nothing until it is started (its start priced and asked for; across a
//! restart; twice), and a failed set deleted while Spend keeps its charge. The
//! store's rules on both backends are in `conformance::set_edit`; the page in `web_set_edit`.

use serde_json::{Value, json};

use crate::common::{Daemon, Mock};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A demo provider slow enough that a set's first shot stays running (and so its later shots
/// queued), and a priced OpenAI provider against the mock.
fn daemon(mock: &Mock) -> Daemon {
    let base = mock.base();
    let mut d = Daemon::configure(&format!(
        "[[providers]]\nname = \"slow\"\nkind = \"demo\"\nmax_concurrency = 1\ndelay_ms = 600000\n\n\
         [[providers]]\nname = \"paid\"\nkind = \"openai_images\"\nbase_url = \"{base}\"\nmodel = \"gpt-image-1\"\n\
         api_key_env = \"TALLY_TEST_KEY\"\nmax_concurrency = 2\nrequest_timeout_ms = 5000\nconnect_timeout_ms = 1000\n\
         price_per_image = 0.04\n"
    ));
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-edit".into()));
    d.spawn();
    d
}

fn id(v: &Value) -> String {
    v["id"].as_str().expect("id").to_string()
}

#[test]
fn a_queued_shot_is_edited_a_running_one_refused_a_set_duplicated_and_a_failed_one_deleted_with_its_charge_kept() {
    let mock = Mock::start(&["--job-duration-ms", "20"]);
    let d = daemon(&mock);
    // One shot of a set at a time: the slow provider holds the first shot running for minutes,
    // so the second stays queued, nothing sent for it.
    let r = d.call(
        "POST",
        "/v1/sets",
        Some(&json!({"product": "teapot", "provider": "slow", "style": "bright",
            "shots": [{"role": "main", "prompt": "on a table"}, {"role": "scene", "prompt": "in a kitchin"}]})),
    );
    assert_eq!(r.status, 201, "{}", text(&r.body));
    let set = id(&r.json());
    let path = format!("/v1/sets/{set}");
    let shot0 = r.json()["shots"][0]["id"].as_str().expect("shot").to_string();
    d.wait_status(&shot0, &["running"]);

    // The typo fixed in the queued shot, and its role changed.
    let r = d.call(
        "PATCH",
        &path,
        Some(&json!({"shots": [{"position": 1, "prompt": "in a kitchen", "role": "selling_point"}]})),
    );
    assert_eq!(r.status, 200, "{}", text(&r.body));
    let v = r.json();
    assert_eq!(v["shots"][1]["prompt"], "in a kitchen — product: teapot; style: bright");
    assert_eq!(v["shots"][1]["role"], "selling_point");
    assert_eq!(v["shots"][1]["status"], "queued");
    assert_eq!(v["timeline"].as_array().and_then(|t| t.last()).map(|e| e["kind"].clone()), Some(json!("edited")));
    // A shot named twice takes both entries in order: the last value of a field wins.
    let r = d.call(
        "PATCH",
        &path,
        Some(&json!({"shots": [{"position": 1, "prompt": "by a window", "role": "scene"},
                               {"position": 1, "prompt": "in a kitchen"}]})),
    );
    assert_eq!(r.status, 200, "{}", text(&r.body));
    assert_eq!(r.json()["shots"][1]["prompt"], "in a kitchen — product: teapot; style: bright");
    assert_eq!(r.json()["shots"][1]["role"], "scene");
    let r = d.call("PATCH", &path, Some(&json!({"shots": [{"position": 1, "role": "selling_point"}]})));
    assert_eq!(r.status, 200, "{}", text(&r.body));
    // Refusals keep the API's error shape and say why.
    let bad = d.call("PATCH", &path, Some(&json!({"shots": [{"position": 1, "role": "hero"}]})));
    assert_eq!((bad.status, bad.error_code()), (422, "invalid_request".to_string()));
    let bad = d.call("PATCH", &path, Some(&json!({"shots": [{"position": 5, "prompt": "x"}]})));
    assert_eq!((bad.status, bad.error_code()), (404, "not_found".to_string()));
    let bad = d.call("PATCH", &path, Some(&json!({"shot": []})));
    assert_eq!(bad.status, 422, "an unknown field is refused: {}", text(&bad.body));
    // The running shot, and what every shot sends, can no longer change.
    let r = d.call("PATCH", &path, Some(&json!({"shots": [{"position": 0, "prompt": "under a tree"}]})));
    assert_eq!((r.status, r.error_code()), (409, "shot_already_sent".to_string()));
    let message = r.json()["error"]["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("being generated now") && message.contains("Duplicate the set"), "{message}");
    let r = d.call("PATCH", &path, Some(&json!({"product": "kettle"})));
    assert_eq!((r.status, r.error_code()), (409, "shot_already_sent".to_string()));
    assert_eq!(d.call("GET", &path, None).json()["product"], "teapot", "a refused edit writes nothing");
    // The CLI edits the same way (the shot named by its role), and says what to do instead.
    let out = d.cli(&["set", "edit", &set, "selling_point", "--prompt", "on a kitchen shelf"]);
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(
        d.call("GET", &path, None).json()["shots"][1]["prompt"],
        "on a kitchen shelf — product: teapot; style: bright"
    );
    let out = d.cli(&["set", "edit", &set, "--prompt", "no shot named"]);
    assert_eq!(out.status.code(), Some(2), "a usage error: {}", text(&out.stderr));
    let out = d.cli(&["set", "edit", &set, "0", "--prompt", "under a tree"]);
    assert!(text(&out.stderr).contains(&format!("tally set duplicate {set}")), "{}", text(&out.stderr));
    // A set is deleted only when finished; the CLI says how.
    let out = d.cli(&["set", "delete", &set]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("cancel the set first") && err.contains("tally set cancel"), "{err}");

    // Duplicate: a copy to edit of the same shots, nothing of it sent.
    let r = d.call("POST", &format!("{path}/duplicate"), Some(&json!({"idempotency_key": "copy-1"})));
    assert_eq!(r.status, 201, "{}", text(&r.body));
    let copy = r.json();
    assert_ne!(id(&copy), set);
    assert_eq!(copy["status"], "draft");
    assert_eq!(copy["shots"][0]["prompt"], "on a table — product: teapot; style: bright");
    assert_eq!(copy["shots"][1]["prompt"], "on a kitchen shelf — product: teapot; style: bright");
    assert_eq!(copy["shots"][1]["role"], "selling_point");
    assert_eq!(copy["shots"][1]["status"], "queued");
    assert!(copy["shots"][1]["message"].as_str().unwrap_or_default().contains("Start generating"), "{copy}");
    let again = d.call("POST", &format!("{path}/duplicate"), Some(&json!({"idempotency_key": "copy-1"})));
    assert_eq!((again.status, id(&again.json())), (200, id(&copy)), "the same key is the same copy");
    assert_eq!(d.call("POST", "/v1/sets/nope/duplicate", None).status, 404);

    // A priced provider: a copy costs nothing; its start states the price and waits for the
    // acknowledgement.
    mock.behave(json!({ "drop_response": true }));
    let r = d.call(
        "POST",
        "/v1/sets",
        Some(&json!({"product": "kettle", "provider": "paid", "shots": [{"role": "main", "prompt": "on white", "candidates": 2}]})),
    );
    assert_eq!(r.status, 201, "{}", text(&r.body));
    let paid = r.json();
    let paid_set = id(&paid);
    let r = d.call("POST", &format!("/v1/sets/{paid_set}/duplicate"), None);
    assert_eq!((r.status, r.json()["status"].clone()), (201, json!("draft")), "{}", text(&r.body));
    let paid_copy = id(&r.json());
    let r = d.call("POST", &format!("/v1/sets/{paid_copy}/start"), None);
    assert_eq!((r.status, r.error_code()), (409, "cost_acknowledgement_required".to_string()));
    let cost = &r.json()["error"]["estimated_cost"];
    assert_eq!((cost["images"].clone(), cost["currency"].clone()), (json!(2), json!("USD")));
    assert!((cost["amount"].as_f64().unwrap_or(0.0) - 0.08).abs() < 1e-9, "{cost}");
    assert!(r.json()["error"]["message"].as_str().unwrap_or_default().contains("$0.08"), "{}", text(&r.body));
    // Asked for with the duplicate itself, the start asks the same.
    let r = d.call("POST", &format!("/v1/sets/{paid_set}/duplicate"), Some(&json!({"start": true})));
    assert_eq!((r.status, r.error_code()), (409, "cost_acknowledgement_required".to_string()));
    // The CLI says it, and how to accept it.
    let out = d.cli(&["set", "start", &paid_copy]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("$0.08") && err.contains("--accept-possible-charge"), "{err}");
    assert_eq!(d.call("GET", &format!("/v1/sets/{paid_copy}"), None).json()["status"], "draft");
    // Never started, the copy is deleted whole.
    let r = d.call("DELETE", &format!("/v1/sets/{paid_copy}"), None);
    assert_eq!((r.status, r.json()["tasks_deleted"].clone()), (200, json!(2)), "{}", text(&r.body));

    // Both candidates reach the provider and lose their answer: unknown. Recorded by hand as
    // failed and charged (what the dashboard showed), the set is failed and can be deleted.
    let tasks: Vec<String> = paid["shots"][0]["candidates"]
        .as_array()
        .expect("candidates")
        .iter()
        .map(|c| c["task_id"].as_str().expect("task").to_string())
        .collect();
    for t in &tasks {
        d.wait_status(t, &["unknown"]);
        let r =
            d.call("POST", &format!("/v1/tasks/{t}/resolve"), Some(&json!({"outcome": "failed", "charge": "charged"})));
        assert_eq!(r.status, 200, "{}", text(&r.body));
    }
    mock.behave(json!({ "drop_response": false }));
    let requests = |d: &Daemon| d.call("GET", "/v1/spend/requests?from=2000-01-01&to=2100-01-01", None);
    let before = requests(&d);
    assert_eq!(before.status, 200, "{}", text(&before.body));
    let csv =
        |d: &Daemon| text(&d.call("GET", "/v1/spend/requests?from=2000-01-01&to=2100-01-01&format=csv", None).body);
    let csv_before = csv(&d);
    for t in &tasks {
        assert!(csv_before.contains(t.as_str()), "the CSV lists {t}: {csv_before}");
    }
    let out = d.cli(&["set", "delete", &paid_set]);
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    let said = text(&out.stdout);
    assert!(said.contains("The set is deleted") && said.contains("kept: job"), "{said}");
    assert_eq!(d.call("GET", &format!("/v1/sets/{paid_set}"), None).status, 404);
    assert_eq!(requests(&d).json(), before.json(), "Spend lists the same requests and charges");
    assert_eq!(csv(&d), csv_before, "the CSV is unchanged, byte for byte");
    for t in &tasks {
        let job = d.call("GET", &format!("/v1/tasks/{t}"), None).json();
        assert_eq!((job["status"].clone(), job["set_id"].clone()), (json!("failed"), Value::Null), "{job}");
    }
    let again = d.call("DELETE", &format!("/v1/sets/{paid_set}"), None);
    assert_eq!(again.status, 404);
}

/// A set's candidates' task ids.
fn task_ids(set: &Value) -> Vec<String> {
    set["shots"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["candidates"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["task_id"].as_str().map(str::to_string))
        .collect()
}

/// Issue #39: a duplicate of a set of a billing provider is a copy to edit that sends nothing —
/// not at once, not after a restart of the daemon — until "Start generating"; its start is
/// refused without the acknowledgement (nothing sent), sends its shots with it, and a second
/// start sends nothing more.
#[test]
fn a_copy_sends_nothing_until_it_is_started_and_a_second_start_sends_nothing_more() {
    let mock = Mock::start(&["--job-duration-ms", "20"]);
    let base = mock.base();
    let mut d = Daemon::configure(&format!(
        "[[providers]]\nname = \"cny\"\nkind = \"openai_images\"\nbase_url = \"{base}\"\nmodel = \"{}\"\n\
         api_key_env = \"TALLY_TEST_KEY\"\nmax_concurrency = 2\nrequest_timeout_ms = 5000\nconnect_timeout_ms = 1000\n\
         price_per_image = 0.3\ncurrency = \"CNY\"\n",
        crate::common::OPENAI_MODEL
    ));
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-copy".into()));
    d.spawn();
    let r = d.call(
        "POST",
        "/v1/sets",
        Some(&json!({"product": "blue cup", "provider": "cny",
            "shots": [{"role": "main", "prompt": "a blue cup"}, {"role": "scene", "prompt": "on a desk"}]})),
    );
    assert_eq!(r.status, 201, "{}", text(&r.body));
    let src = id(&r.json());
    for t in task_ids(&r.json()) {
        d.wait_status(&t, &["succeeded"]);
    }
    let sent = mock.lines().len();
    assert_eq!(sent, 2, "the source's two shots");

    // The copy: a draft, nothing sent; the acknowledgement is accepted and changes nothing.
    let r = d.call("POST", &format!("/v1/sets/{src}/duplicate"), Some(&json!({"acknowledge_possible_charge": true})));
    assert_eq!(r.status, 201, "{}", text(&r.body));
    let copy = id(&r.json());
    let path = format!("/v1/sets/{copy}");
    let tasks = task_ids(&r.json());
    assert_eq!(r.json()["status"], "draft");
    let timeline = d.call("GET", &format!("/v1/sets/{src}"), None).json()["timeline"].to_string();
    assert!(timeline.contains("a copy to edit") && timeline.contains(&copy), "{timeline}");

    // Restarted with the copy waiting: a job sent after the restart goes and comes back (the
    // dispatcher runs), and still nothing of the copy was sent.
    d.term();
    d.spawn();
    let control = d.call("POST", "/v1/tasks", Some(&json!({"provider": "cny", "prompt": "a control mug"})));
    assert_eq!(control.status, 201, "{}", text(&control.body));
    let control = id(&control.json());
    d.wait_status(&control, &["succeeded"]);
    let v = d.call("GET", &path, None).json();
    assert_eq!(v["status"], "draft", "{v}");
    assert_eq!(mock.lines().len(), sent + 1, "only the control job was sent: {:?}", mock.lines());
    for t in &tasks {
        assert_eq!(d.call("GET", &format!("/v1/tasks/{t}"), None).json()["status"], "queued");
    }

    // Edited like any set nothing of which was sent.
    let r = d.call("PATCH", &path, Some(&json!({"product": "green cup"})));
    assert_eq!(r.status, 200, "{}", text(&r.body));
    assert_eq!(r.json()["shots"][0]["prompt"], "a blue cup — product: green cup");
    // A candidate more asks for no acknowledgement yet (the start asks for every image), and
    // waits with the rest.
    let r = d.call("POST", &format!("{path}/shots/0/candidates"), None);
    assert_eq!(r.status, 201, "{}", text(&r.body));
    assert_eq!(r.json()["status"], "draft");
    let tasks = task_ids(&r.json());
    assert_eq!(tasks.len(), 3);

    // Started without the acknowledgement: refused with the price; nothing sent.
    let r = d.call("POST", &format!("{path}/start"), Some(&json!({})));
    assert_eq!((r.status, r.error_code()), (409, "cost_acknowledgement_required".to_string()), "{}", text(&r.body));
    let cost = &r.json()["error"]["estimated_cost"];
    assert_eq!((cost["images"].clone(), cost["currency"].clone()), (json!(3), json!("CNY")), "{cost}");
    assert_eq!(d.call("GET", &path, None).json()["status"], "draft");
    assert_eq!(mock.lines().len(), sent + 1);

    // Started with it, through the CLI: its shots are sent, one after another, with the edit.
    let out = d.cli(&["set", "start", &copy, "--accept-possible-charge"]);
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    for t in &tasks {
        d.wait_status(t, &["succeeded"]);
    }
    assert_eq!(mock.count("green cup").0, 3, "each image of the copy sent once: {:?}", mock.lines());
    let v = d.call("GET", &path, None).json();
    assert_eq!(v["status"], "done", "{v}");
    assert!(v["timeline"].as_array().is_some_and(|t| t.iter().any(|e| e["kind"] == "started")), "{v}");

    // A second start is answered with the set, unchanged, and sends nothing.
    let again = d.call("POST", &format!("{path}/start"), Some(&json!({"acknowledge_possible_charge": true})));
    assert_eq!((again.status, again.json()["status"].clone()), (200, json!("done")), "{}", text(&again.body));
    let again = d.call("POST", &format!("{path}/start"), None);
    assert_eq!(again.status, 200, "no acknowledgement is asked of a set already started: {}", text(&again.body));
    let control = d.call("POST", "/v1/tasks", Some(&json!({"provider": "cny", "prompt": "a second control mug"})));
    d.wait_status(&id(&control.json()), &["succeeded"]);
    assert_eq!(mock.count("green cup").0, 3, "nothing sent again");
    assert_eq!(d.call("POST", "/v1/sets/nope/start", None).status, 404);
    let bad = d.call("POST", &format!("{path}/start"), Some(&json!({"idempotency_key": ""})));
    assert_eq!(bad.status, 422, "an empty key is refused as everywhere: {}", text(&bad.body));
    // A started copy is no longer deleted as a draft is.
    assert_eq!(d.call("DELETE", &path, None).error_code(), "set_has_images");

    // The CLI's duplicate names the copy and the next command.
    let out = d.cli(&["set", "duplicate", &src]);
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    let said = text(&out.stdout);
    assert!(said.contains("tally set start "), "{said}");
}
