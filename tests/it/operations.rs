//! Operation kinds through the daemon (issue #35): an edit and a cutout of a generated image on
//! the demo provider, an edit on an OpenAI-style provider and a cutout on a Photoroom-style one
//! against the mock, what `GET /v1/providers` says each offers, the lineage between an image
//! and what was made from it, and every refusal before anything is recorded or sent (the
//! mock's ledger unchanged, no task made).

use crate::common::{Daemon, Mock, OPENAI_MODEL, sha256_hex};
use serde_json::{Value, json};

const SETTLED: &[&str] = &["succeeded", "failed", "unknown", "canceled"];

fn providers(mock: &Mock) -> String {
    format!(
        "{}\n[[providers]]\nname = \"oa\"\nkind = \"openai_images\"\nbase_url = \"{b}\"\nmodel = \"{OPENAI_MODEL}\"\n\
         api_key_env = \"TALLY_TEST_KEY\"\nprice_per_image = 0.04\n\n[[providers]]\nname = \"pr\"\nkind = \"photoroom\"\n\
         base_url = \"{b}\"\napi_key_env = \"TALLY_TEST_KEY\"\nprice_per_image = 0.02\n",
        crate::common::FAST_DEMO,
        b = mock.base()
    )
}

fn daemon(mock: &Mock) -> Daemon {
    let mut d = Daemon::configure(&providers(mock));
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-ops".into()));
    d.spawn();
    d
}

/// Submit and wait until the task settles; the settled task.
fn run(d: &Daemon, body: Value) -> Value {
    let r = d.call("POST", "/v1/tasks", Some(&body));
    assert_eq!(r.status, 201, "{body}: {}", String::from_utf8_lossy(&r.body));
    d.wait_status(r.json()["id"].as_str().expect("id"), SETTLED)
}

/// The task's one image, downloaded and checked against its sha256.
fn image_of(d: &Daemon, t: &Value) -> Vec<u8> {
    assert_eq!(t["status"], "succeeded", "{t}");
    let a = &t["artifacts"][0];
    let body = d.call("GET", a["url"].as_str().expect("url"), None).body;
    assert_eq!(sha256_hex(&body), a["sha256"].as_str().unwrap_or_default());
    body
}

#[test]
fn edit_and_cutout_run_through_the_protocol_with_their_lineage() {
    let mock = Mock::start(&[]);
    let mut d = daemon(&mock);
    let offered = d.call("GET", "/v1/providers", None).json();
    let ops = |name: &str| -> Vec<String> {
        offered["providers"]
            .as_array()
            .expect("providers")
            .iter()
            .find(|p| p["name"] == name)
            .map(|p| serde_json::from_value(p["operations"].clone()).expect("operations"))
            .unwrap_or_default()
    };
    assert_eq!(ops("demo"), ["generate", "edit", "cutout", "draft"]);
    assert_eq!(ops("oa"), ["generate", "edit"]);
    assert_eq!(ops("pr"), ["cutout"]);

    let src = run(&d, json!({"prompt": "a blue mug on a plain table", "provider": "demo"}));
    assert_eq!(src["operation"], "generate");
    assert_eq!(src["image"], Value::Null);
    let src_png = image_of(&d, &src);
    let art = src["artifacts"][0]["id"].as_str().expect("artifact").to_string();

    let edit = run(
        &d,
        json!({"operation": "edit", "provider": "demo", "prompt": "make it marble", "image": {"artifact": art}}),
    );
    assert_eq!((edit["operation"].as_str(), &edit["image"]), (Some("edit"), &json!({"artifact": art})));
    assert_ne!(image_of(&d, &edit), src_png, "an edit makes a new image");

    // `{"task": ID}` names that task's image; the demo's cutout clears the border's colour.
    let cut = run(&d, json!({"operation": "cutout", "provider": "demo", "image": {"task": src["id"]}}));
    let png = image::load_from_memory(&image_of(&d, &cut)).expect("a PNG").to_rgba8();
    assert_eq!(png.get_pixel(0, 0).0[3], 0, "the background is transparent");
    assert!(png.pixels().any(|p| p.0[3] == 255), "the product is kept");

    // The source knows what was made from it, oldest first.
    let again = d.call("GET", &format!("/v1/tasks/{}", src["id"].as_str().unwrap_or_default()), None).json();
    let derived: Vec<(&str, &str)> = again["derived"]
        .as_array()
        .expect("derived")
        .iter()
        .map(|x| (x["id"].as_str().unwrap_or_default(), x["operation"].as_str().unwrap_or_default()))
        .collect();
    assert_eq!(
        derived,
        [(edit["id"].as_str().unwrap_or_default(), "edit"), (cut["id"].as_str().unwrap_or_default(), "cutout")]
    );

    // Paid providers: one charged request each, the edit with its instruction, the cutout
    // as Photoroom's segment call.
    let oa =
        run(&d, json!({"operation": "edit", "provider": "oa", "prompt": "marble, oa", "image": {"artifact": art}}));
    image_of(&d, &oa);
    let pr = run(&d, json!({"operation": "cutout", "provider": "pr", "image": {"artifact": art}}));
    assert!(tally::domain::operation::png_has_alpha(&image_of(&d, &pr)));
    let charged: Vec<Value> = mock.lines().into_iter().filter(|l| l["charged"] == true).collect();
    assert_eq!(charged.len(), 2, "{charged:?}");
    assert!(charged.iter().any(|l| l["endpoint"] == "POST /v1/images/edits" && l["prompt"] == "marble, oa"));
    assert!(charged.iter().any(|l| l["endpoint"] == "POST /v1/segment" && l["reference_images"] == 1));
    assert_eq!(pr["charge"]["state"], "charged", "{}", pr["charge"]);
    d.term();
}

#[test]
fn operations_are_refused_before_anything_is_recorded_or_sent() {
    let mock = Mock::start(&[]);
    let mut d = daemon(&mock);
    let src = run(&d, json!({"prompt": "a cup", "provider": "demo"}));
    let art = src["artifacts"][0]["id"].as_str().expect("artifact").to_string();
    let before_tasks = d.call("GET", "/v1/tasks?limit=100", None).json()["tasks"].as_array().map(Vec::len);
    let ghost = "00000000-0000-0000-0000-000000000000";
    for (body, says) in [
        (json!({"operation": "edit", "provider": "demo", "prompt": "x"}), "needs the image"),
        (json!({"operation": "edit", "provider": "demo", "prompt": "x", "image": {"artifact": ghost}}), "no artifact"),
        (
            json!({"operation": "edit", "provider": "demo", "prompt": " ", "image": {"artifact": art}}),
            "prompt is empty",
        ),
        (json!({"operation": "teleport", "provider": "demo", "prompt": "x"}), "operation"),
        (json!({"operation": "cutout", "provider": "oa", "image": {"artifact": art}}), "does not offer `cutout`"),
        (
            json!({"operation": "cutout", "provider": "pr", "prompt": "x", "image": {"artifact": art}}),
            "takes no prompt",
        ),
        (json!({"prompt": "x", "provider": "demo", "image": {"artifact": art}}), "takes no image"),
        (
            json!({"operation": "edit", "provider": "demo", "prompt": "x", "image": {"artifact": art, "upload": art}}),
            "exactly one",
        ),
    ] {
        let r = d.call("POST", "/v1/tasks", Some(&body));
        let text = String::from_utf8_lossy(&r.body).to_string();
        assert_eq!(r.status, 422, "{body}: {text}");
        assert!(text.contains(says), "{body}: {text}");
    }
    // A task that has no image yet cannot be edited.
    let mut slow = Daemon::configure("[[providers]]\nname = \"slow\"\nkind = \"demo\"\ndelay_ms = 60000\n");
    slow.spawn();
    let pending = slow.call("POST", "/v1/tasks", Some(&json!({"prompt": "slow one"}))).json();
    let r = slow.call("POST", "/v1/tasks", Some(&json!({"operation": "cutout", "image": {"task": pending["id"]}})));
    assert_eq!(r.status, 422);
    assert!(String::from_utf8_lossy(&r.body).contains("has no image yet"));
    slow.kill();

    assert!(mock.lines().is_empty(), "a refused operation reached the provider: {:?}", mock.lines());
    let after_tasks = d.call("GET", "/v1/tasks?limit=100", None).json()["tasks"].as_array().map(Vec::len);
    assert_eq!(before_tasks, after_tasks, "a refused operation was recorded");
    d.term();
}

#[test]
fn the_cli_edits_and_cuts_out_by_id_or_file() {
    let mut d = Daemon::start(crate::common::FAST_DEMO);
    let src = run(&d, json!({"prompt": "a teapot", "provider": "demo"}));
    let art = src["artifacts"][0]["id"].as_str().expect("artifact").to_string();
    let out = d.cli(&["submit", "--operation", "edit", "--image", &art, "make it green", "--wait"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let file = d.dir.path().join("photo.png");
    std::fs::write(&file, image_of(&d, &src)).expect("write photo");
    let path = file.to_string_lossy().to_string();
    let out = d.cli(&["--json", "submit", "--operation", "cutout", "--image", &path, "--wait"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let t: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(t["operation"], "cutout");
    assert!(t["image"]["upload"].is_string(), "a file is uploaded first: {t}");
    let out = d.cli(&["submit", "--operation", "cutout", "--image", "no-such-id"]);
    assert!(!out.status.success());
    d.term();
}

#[test]
fn a_candidate_of_a_shot_can_be_a_cutout_of_another_and_be_chosen() {
    let mut d = Daemon::start(crate::common::FAST_DEMO);
    let r = d.call(
        "POST",
        "/v1/sets",
        Some(&json!({"product": "teapot", "shots": [{"role": "main", "prompt": "a teapot"}]})),
    );
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let set = r.json();
    let sid = set["id"].as_str().expect("id").to_string();
    let first = d.wait_status(set["shots"][0]["id"].as_str().expect("shot"), &["succeeded"]);
    let art = first["artifacts"][0]["id"].as_str().expect("image").to_string();
    let path = format!("/v1/sets/{sid}/shots/0/candidates");
    // Not an image of this shot: refused, nothing added.
    let other = run(&d, json!({"prompt": "another job", "provider": "demo"}));
    let stranger = other["artifacts"][0]["id"].as_str().expect("image");
    let r = d.call("POST", &path, Some(&json!({"operation": "cutout", "image": {"artifact": stranger}})));
    assert_eq!(r.status, 422, "{}", String::from_utf8_lossy(&r.body));
    let r = d.call("POST", &path, Some(&json!({"operation": "cutout", "image": {"artifact": art}})));
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let cand = &r.json()["shots"][0]["candidates"][1];
    assert_eq!((cand["operation"].as_str(), &cand["image"]), (Some("cutout"), &json!({"artifact": art})));
    let cut = d.wait_status(cand["task_id"].as_str().expect("task"), SETTLED);
    let png = image_of(&d, &cut);
    assert!(tally::domain::operation::png_has_alpha(&png));
    let chosen = cut["artifacts"][0]["id"].as_str().expect("image");
    let r = d.call("PUT", &format!("/v1/sets/{sid}/shots/0/choice"), Some(&json!({"artifact_id": chosen})));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    d.term();
}
