//! The delivery crash matrix for the `shopify` target (issue #38): every crash point of
//! `engine::deliver::DELIVERY_POINTS` × each backend, against the mock's Admin GraphQL
//! stand-in. A shopify item's steps (record `writing`, then the flow: look up by name, stage,
//! upload, `fileCreate`, wait for `READY`, attach) run between `deliver-after-writing` and
//! `deliver-after-put`, and every step of the flow starts by looking, so the cells are the
//! points around it. After the restart the outside world is read from the stand-in itself:
//! each of the delivery's files exists once (by its deterministic name) with the chosen
//! image's sha256, is attached to the product once, and each item keeps its file's id.

use std::time::Duration;

use serde_json::{Value, json};
use tally::engine::deliver::DELIVERY_POINTS;

use crate::common::{Daemon, FAST_DEMO, Mock, request, wait_for};
use crate::deliveries::{chosen_set, ended};

#[test]
fn shopify_on_sqlite() {
    matrix(false);
}

#[test]
fn shopify_on_postgres() {
    matrix(true);
}

/// How many of the delivery's two files are attached at the crash, and each item's attempts
/// once it ended (a shopify item records `writing` again before its flow looks it up).
fn expected(point: &str) -> (usize, [i64; 2]) {
    match point {
        "deliver-after-claim" => (0, [1, 1]),
        "deliver-after-writing" => (0, [2, 1]),
        "deliver-after-put" => (1, [2, 1]),
        "deliver-after-confirm" => (1, [1, 1]),
        "deliver-after-manifest" => (2, [1, 1]),
        other => panic!("the shopify crash matrix has no expectation for the point {other}"),
    }
}

/// The stand-in's files of delivery `id` as (file id, sha256), and the product's media.
fn at_shop(mock: &Mock, id: &str) -> (Vec<(String, String)>, Vec<String>) {
    let v: Value = request(mock.port, "GET", "/admin/_mock", &[], None).json();
    let tag: String = id.chars().filter(|c| c.is_ascii_alphanumeric()).collect();
    let prefix = format!("tally-{tag}-");
    let files = v["files"]
        .as_array()
        .expect("files")
        .iter()
        .filter(|f| f["filename"].as_str().is_some_and(|n| n.starts_with(&prefix)))
        .map(|f| (f["id"].as_str().unwrap_or("").to_string(), f["sha256"].as_str().unwrap_or("").to_string()))
        .collect();
    let media = v["media"].as_array().expect("media").iter().filter_map(|m| m.as_str().map(String::from)).collect();
    (files, media)
}

fn matrix(postgres: bool) {
    let mock = Mock::start(&[]);
    let target = format!(
        "[[delivery.targets]]\nname = \"shop\"\nkind = \"shopify\"\nshop = \"crash.myshopify.com\"\n\
         base_url = \"http://127.0.0.1:{}\"\naccess_token_env = \"TALLY_TEST_SHOPIFY_TOKEN\"\ntimeout_ms = 10000\n",
        mock.port
    );
    let mut d = Daemon::configure(&format!("{FAST_DEMO}\n{target}"));
    if postgres && d.on_postgres("deliver-crash-shopify").is_none() {
        return;
    }
    d.env.push(("TALLY_TEST_SHOPIFY_TOKEN".into(), "shpat_crash".into()));
    let on = if postgres { "postgres" } else { "sqlite" };
    for point in DELIVERY_POINTS.iter().copied() {
        let cell = format!("shopify on {on}, {point}");
        let (at_crash, attempts) = expected(point);
        d.env.push(("FAILPOINTS".into(), format!("{point}=return")));
        d.spawn();
        let (set, arts) = chosen_set(&d, true);
        let body = json!({"profile": "original", "target": "shop", "shopify_product": "gid://shopify/Product/1"});
        let r = d.call("POST", &format!("/v1/sets/{set}/deliveries"), Some(&body));
        assert_eq!(r.status, 201, "{cell}: {}", String::from_utf8_lossy(&r.body));
        let id = r.json()["id"].as_str().expect("id").to_string();
        let exited = wait_for(Duration::from_secs(30), || d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()));
        assert!(exited.is_some_and(|s| !s.success()), "{cell}: the crash point never fired; stderr:\n{}", d.stderr());
        d.child = None;
        let (files, media) = at_shop(&mock, &id);
        let attached = files.iter().filter(|(f, _)| media.contains(f)).count();
        assert_eq!(attached, at_crash, "{cell}: attached at the crash: {files:?}");

        d.env.retain(|(k, _)| k != "FAILPOINTS");
        d.spawn();
        let done = ended(&d, &id);
        assert_eq!(done["state"], "delivered", "{cell}: {done}");
        let (files, media) = at_shop(&mock, &id);
        assert_eq!(files.len(), 2, "{cell}: each file once at the shop: {files:?}");
        let items = done["items"].as_array().expect("items");
        for ((item, (_, sha)), tries) in items.iter().zip(&arts).zip(attempts) {
            let rid = item["remote_id"].as_str().unwrap_or_else(|| panic!("{cell}: no remote id: {item}"));
            let file =
                files.iter().find(|(f, _)| f == rid).unwrap_or_else(|| panic!("{cell}: {rid} is not at the shop"));
            assert_eq!(&file.1, sha, "{cell}: the shop's file is not the chosen image");
            assert_eq!(media.iter().filter(|m| *m == rid).count(), 1, "{cell}: {rid} attached once");
            assert_eq!(item["attempts"].as_i64(), Some(tries), "{cell}: attempts: {done}");
        }
        d.kill();
    }
}
