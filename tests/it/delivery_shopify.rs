//! The `shopify` delivery target against the mock's Admin GraphQL stand-in (issue #38), through
//! a real daemon: files attached to the product once (checked in the stand-in's own state, by
//! sha256), `replace` leaving exactly the delivery's files, a lost `fileCreate` answer settled
//! by looking the file up by name (one file, not two), an empty cost bucket waited out, a
//! product that does not exist failing plainly, and the token shown nowhere.

use serde_json::{Value, json};

use crate::common::*;
use crate::deliveries::{chosen_set, ended};

const TOKEN: &str = "shpat_test_0123456789abcdef";

/// A daemon with two shopify targets (`shop`: append, `shop-replace`: replace) at `mock`.
fn daemon(mock: &Mock) -> Daemon {
    let base = format!("http://127.0.0.1:{}", mock.port);
    let targets: String = [("shop", "append"), ("shop-replace", "replace")]
        .iter()
        .map(|(n, p)| {
            format!(
                "\n[[delivery.targets]]\nname = \"{n}\"\nkind = \"shopify\"\nshop = \"test.myshopify.com\"\n\
                 base_url = \"{base}\"\naccess_token_env = \"TALLY_TEST_SHOPIFY_TOKEN\"\nplacement = \"{p}\"\n\
                 timeout_ms = 20000\n"
            )
        })
        .collect();
    let mut d = Daemon::configure(&format!("{FAST_DEMO}{targets}"));
    d.env.push(("TALLY_TEST_SHOPIFY_TOKEN".into(), TOKEN.into()));
    d.spawn();
    d
}

/// The stand-in's state: (files as (id, filename, sha256), the product's media ids).
fn shop_state(mock: &Mock) -> (Vec<(String, String, String)>, Vec<String>) {
    let v = request(mock.port, "GET", "/admin/_mock", &[], None).json();
    let files = v["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| {
            let s = |k: &str| f[k].as_str().expect("field").to_string();
            (s("id"), s("filename"), s("sha256"))
        })
        .collect();
    let media = v["media"].as_array().expect("media").iter().map(|m| m.as_str().expect("id").to_string()).collect();
    (files, media)
}

fn knobs(mock: &Mock, v: Value) {
    let body = v.to_string();
    let r = request(mock.port, "PUT", "/admin/_mock", &[("content-type", "application/json")], Some(body.as_bytes()));
    assert!(r.status < 300, "knobs refused");
}

fn deliver(d: &Daemon, set: &str, target: &str, product: &str) -> Value {
    let body = json!({"profile": "original", "target": target, "shopify_product": product});
    let r = d.call("POST", &format!("/v1/sets/{set}/deliveries"), Some(&body));
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let id = r.json()["id"].as_str().expect("id").to_string();
    ended(d, &id)
}

/// The sha256 of each media file on the product, in order.
fn media_shas(mock: &Mock) -> Vec<String> {
    let (files, media) = shop_state(mock);
    media.iter().map(|m| files.iter().find(|f| &f.0 == m).map(|f| f.2.clone()).unwrap_or_default()).collect()
}

#[test]
fn append_then_replace_attach_each_file_once_and_replace_leaves_exactly_the_delivery() {
    let mock = Mock::start(&[]);
    let d = daemon(&mock);
    let (set, arts) = chosen_set(&d, true);
    let shas: Vec<String> = arts.iter().map(|(_, s)| s.clone()).collect();

    let dv = deliver(&d, &set, "shop", "gid://shopify/Product/1");
    assert_eq!(dv["state"], "delivered", "{dv}");
    assert_eq!(media_shas(&mock), shas, "append attaches both chosen images, byte for byte");
    let (_, media) = shop_state(&mock);
    for (it, m) in dv["items"].as_array().expect("items").iter().zip(&media) {
        assert_eq!(it["remote_id"].as_str(), Some(m.as_str()), "each item keeps its Shopify id");
    }

    // By handle, replace: the product's media become exactly this delivery's two files.
    let dv = deliver(&d, &set, "shop-replace", "demo-product");
    assert_eq!(dv["state"], "delivered", "{dv}");
    let dv2 = deliver(&d, &set, "shop-replace", "gid://shopify/Product/1");
    assert_eq!(dv2["state"], "delivered", "{dv2}");
    let (files, media) = shop_state(&mock);
    assert_eq!(media.len(), 2, "two replace deliveries of two files leave two media: {media:?}");
    assert_eq!(media_shas(&mock), shas);
    let ids: Vec<&str> =
        dv2["items"].as_array().expect("items").iter().filter_map(|i| i["remote_id"].as_str()).collect();
    assert_eq!(ids, media.iter().map(String::as_str).collect::<Vec<_>>(), "the last delivery's files are the media");
    assert_eq!(files.len(), 6, "three deliveries of two files made six files, none twice");

    for path in ["/v1/delivery/targets", &format!("/v1/sets/{set}/deliveries")] {
        let r = d.call("GET", path, None);
        assert!(!String::from_utf8_lossy(&r.body).contains(TOKEN), "the token is in {path}");
    }
    assert!(!d.stderr().contains(TOKEN), "the token is in the daemon's log");
}

#[test]
fn a_lost_file_create_answer_is_settled_by_name_and_a_throttled_bucket_is_waited_out() {
    let mock = Mock::start(&[]);
    let d = daemon(&mock);
    let (set, arts) = chosen_set(&d, true);
    // The first fileCreate takes effect but its answer is lost; the bucket starts empty.
    knobs(&mock, json!({"lose": ["fileCreate"], "available": 0}));
    let dv = deliver(&d, &set, "shop", "gid://shopify/Product/1");
    assert_eq!(dv["state"], "delivered", "{dv}");
    let (files, media) = shop_state(&mock);
    assert_eq!(files.len(), 2, "the lost create was found by its name, not made again: {files:?}");
    assert_eq!(media.len(), 2);
    assert_eq!(media_shas(&mock), arts.iter().map(|(_, s)| s.clone()).collect::<Vec<_>>());
}

#[test]
fn a_product_that_does_not_exist_fails_plainly_and_a_product_is_required() {
    let mock = Mock::start(&[]);
    let d = daemon(&mock);
    let (set, _) = chosen_set(&d, true);
    let dv = deliver(&d, &set, "shop", "gid://shopify/Product/999");
    assert_eq!(dv["state"], "failed", "{dv}");
    let why = dv["items"][0]["why"].as_str().unwrap_or_default();
    assert!(why.contains("no product"), "{why}");
    assert!(shop_state(&mock).0.is_empty(), "nothing was uploaded");
    let r =
        d.call("POST", &format!("/v1/sets/{set}/deliveries"), Some(&json!({"profile": "original", "target": "shop"})));
    assert_eq!(r.status, 422, "{}", String::from_utf8_lossy(&r.body));
    let r = d.call(
        "POST",
        &format!("/v1/sets/{set}/deliveries"),
        Some(&json!({"profile": "original", "target": "exports", "shopify_product": "demo-product"})),
    );
    assert_eq!(r.status, 422, "a product is refused for a folder target");
}
