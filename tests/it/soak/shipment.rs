//! The soak's deliveries: sets made, their images chosen and delivered to a folder target of
//! their own, through the kills and freezes, and checked at the end against the folder.
//!
//! A set may be pruned once its deliveries have ended (the soak prunes; see `super::prune`), so
//! the end check finds a set's deliveries three ways: the set's list while it exists, the
//! deliveries this client saw made, and those named by a `manifest-{id}.json` in the folder
//! (a delivery whose answer was lost but which wrote files). Each is then read by its id.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{Daemon, FAST_DEMO, Mock, sha256_hex, try_request, wait_for};

/// How many sets the soak delivers, each to a folder target of its own (`ship0`, …).
pub const SHIPMENTS: usize = 6;

/// The shipment whose set is made at the mock's `openai` provider while the mock answers
/// images of `GIANT_SIDE` px a side (a flat PNG of about 420 KB): its `soak` delivery must say
/// each image is too large, in words, without taking the daemon down (issue #43).
pub const GIANT: usize = 3;

/// How long after its images are chosen a shipment is delivered (longer than a prune's
/// cutoff is behind, so a prune that meets the delivery open would otherwise take the set).
const DELIVER_AFTER: Duration = Duration::from_secs(3);

/// The side of the giant images.
pub const GIANT_SIDE: u32 = 12_000;

/// The demo provider, the `soak` profile (a 1000×1000 PNG: rendering takes a while, so a kill
/// or a prune can land during a delivery) and one folder target per shipment.
pub fn delivery_config(shipments: &[Shipment]) -> String {
    let mut c = format!(
        "{FAST_DEMO}\n[[delivery.profiles]]\nname = \"soak\"\nwidth = 1000\nheight = 1000\nfit = \"pad\"\n\
         background = \"#ffffff\"\nformat = \"png\"\nfile_name = \"{{product}}_{{role}}_{{profile}}.{{ext}}\"\n\n"
    );
    for s in shipments {
        c.push_str(&format!(
            "[[delivery.targets]]\nname = \"{}\"\nkind = \"folder\"\npath = \"{}\"\n\n",
            s.target,
            s.folder.display()
        ));
    }
    c
}

/// A request that may find the daemon dead (`None`), with its JSON answer when it has one.
pub fn try_call(d: &Daemon, method: &str, path: &str, body: Option<&Value>) -> Option<(u16, Value)> {
    let auth = format!("Bearer {}", d.token());
    let body = body.map(Value::to_string);
    let mut headers = vec![("Authorization", auth.as_str())];
    if body.is_some() {
        headers.push(("Content-Type", "application/json"));
    }
    let r = try_request(d.port, method, path, &headers, body.as_deref().map(str::as_bytes))?;
    Some((r.status, serde_json::from_slice(&r.body).unwrap_or(Value::Null)))
}

/// One set on its way to its folder: made (with an idempotency key, so a lost answer is
/// resent safely), each shot's image chosen, delivered. Each step may meet a dead daemon; it
/// is tried again later.
#[derive(Debug)]
pub struct Shipment {
    /// The target's name, and the shipment's number in it.
    pub target: String,
    folder: PathBuf,
    /// The provider its set is made at: `demo`, or the mock's `openai` for the giant one.
    provider: &'static str,
    /// The profiles it is delivered with, one delivery each, in order.
    pub profiles: [&'static str; 2],
    /// Set once the shipment is started.
    pub key: Option<String>,
    pub set: Option<String>,
    pub chosen: bool,
    /// When every shot's image was chosen: the deliveries are made a little later
    /// ([`DELIVER_AFTER`]), so that a prune then may take the set's settled shots.
    chosen_at: Option<Instant>,
    /// Deliveries this client saw made (a lost answer may have made one more: all of a set's
    /// deliveries are checked at the end).
    pub deliveries: usize,
    /// The ids of the deliveries this client saw made.
    seen: Vec<String>,
}

impl Shipment {
    pub fn new(i: usize, root: &Path) -> Shipment {
        Shipment {
            target: format!("ship{i}"),
            folder: root.join(format!("ship{i}")),
            provider: if i == GIANT { "openai" } else { "demo" },
            // The first delivery made renders (slow: the forced kill meets it open).
            profiles: if i.is_multiple_of(2) { ["soak", "original"] } else { ["original", "soak"] },
            key: None,
            set: None,
            chosen: false,
            chosen_at: None,
            deliveries: 0,
            seen: Vec::new(),
        }
    }

    /// Whether this is the shipment of giant images.
    pub fn giant(&self) -> bool {
        self.provider == "openai"
    }

    /// Whether every delivery of it was seen made (or it has not started): a prune may then
    /// take its set once those deliveries end, and nothing of it is lost.
    pub fn prunable(&self) -> bool {
        self.key.is_none() || self.deliveries == self.profiles.len()
    }

    /// The next step, if the daemon answers; whether it made a delivery. Once the images are
    /// chosen, every delivery is made in one step (a prune between them would take the set).
    pub fn step(&mut self, d: &Daemon) -> bool {
        let Some(key) = self.key.clone() else { return false };
        let Some(set) = self.set.clone() else {
            let body = json!({"product": format!("soak {}", self.target), "provider": self.provider, "idempotency_key": key,
                "shots": [{"role": "main", "prompt": format!("{key} on white")},
                          {"role": "scene", "prompt": format!("{key} on a shelf")}]});
            match try_call(d, "POST", "/v1/sets", Some(&body)) {
                Some((200 | 201, v)) => self.set = v["id"].as_str().map(str::to_string),
                Some((code, v)) if (400..500).contains(&code) => {
                    panic!("{}: making the set answered {code}: {v}", self.target)
                }
                _ => {}
            }
            return false;
        };
        if !self.chosen {
            self.chosen = self.choose(d, &set);
            self.chosen_at = self.chosen.then(Instant::now);
            return false;
        }
        if self.chosen_at.is_some_and(|at| at.elapsed() < DELIVER_AFTER) {
            return false;
        }
        let mut made = false;
        while let Some(profile) = self.profiles.get(self.deliveries) {
            let body = json!({"profile": profile, "target": self.target, "force": true});
            match try_call(d, "POST", &format!("/v1/sets/{set}/deliveries"), Some(&body)) {
                Some((201, v)) => {
                    self.deliveries += 1;
                    self.seen.extend(v["id"].as_str().map(str::to_string));
                    made = true;
                }
                Some((409, v)) => panic!("{}: the delivery was refused: {v}", self.target),
                Some((404, v)) => panic!("{}: the set of an undelivered shipment is gone: {v}", self.target),
                _ => break,
            }
        }
        made
    }

    /// Choose a succeeded image of every shot; ask for another candidate of a shot whose
    /// candidates all ended without one. Whether every shot has its choice.
    fn choose(&self, d: &Daemon, set: &str) -> bool {
        let Some((200, v)) = try_call(d, "GET", &format!("/v1/sets/{set}"), None) else { return false };
        let Some(shots) = v["shots"].as_array() else { return false };
        let mut all = true;
        for (i, shot) in shots.iter().enumerate() {
            let cands = shot["candidates"].as_array().cloned().unwrap_or_default();
            let ok = cands.iter().find(|c| c["status"] == "succeeded" && c["artifact"]["id"].is_string());
            let open = cands
                .iter()
                .any(|c| !["succeeded", "failed", "unknown", "canceled"].contains(&c["status"].as_str().unwrap_or("")));
            match ok {
                Some(c) => {
                    let body = json!({"artifact_id": c["artifact"]["id"]});
                    let r = try_call(d, "PUT", &format!("/v1/sets/{set}/shots/{i}/choice"), Some(&body));
                    all &= matches!(r, Some((200, _)));
                }
                None => {
                    all = false;
                    if !open {
                        // Every candidate ended without an image (a crash mid-call can end one
                        // `unknown`): another one (free on the demo provider; on the giant
                        // shipment's a new request the owner accepts paying for).
                        let body = json!({"count": 1, "acknowledge_possible_charge": true});
                        let _ = try_call(d, "POST", &format!("/v1/sets/{set}/shots/{i}/candidates"), Some(&body));
                    }
                }
            }
        }
        all
    }

    /// Whether a delivery of the set is queued or being delivered (false if the daemon does
    /// not answer or the set is gone).
    pub fn open(&self, d: &Daemon) -> bool {
        let Some(set) = &self.set else { return false };
        let Some((200, v)) = try_call(d, "GET", &format!("/v1/sets/{set}/deliveries"), None) else { return false };
        v["deliveries"]
            .as_array()
            .is_some_and(|ds| ds.iter().any(|x| ["queued", "delivering"].contains(&x["state"].as_str().unwrap_or(""))))
    }

    /// For the giant shipment: its key (in both its shots' prompts) and how many candidates its
    /// shots have, each a request the owner asked for, so the mock may have charged prompts
    /// with this key up to that many times.
    pub fn giant_requests(&self, d: &Daemon) -> Option<(String, usize)> {
        let (true, Some(set), Some(key)) = (self.giant(), &self.set, &self.key) else { return None };
        let v = d.call("GET", &format!("/v1/sets/{set}"), None).json();
        let n =
            v["shots"].as_array().into_iter().flatten().map(|s| s["candidates"].as_array().map_or(0, Vec::len)).sum();
        Some((key.clone(), n))
    }

    /// Every delivery of the set, once each has ended: the set's list while the set exists,
    /// else those seen made and those named by a manifest in the folder (see the module docs).
    fn ended_deliveries(&self, d: &Daemon) -> Vec<Value> {
        let set = self.set.as_deref().expect("made");
        let mut ids: BTreeSet<String> = self.seen.iter().cloned().collect();
        for e in std::fs::read_dir(&self.folder).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(id) = name.strip_prefix("manifest-").and_then(|n| n.strip_suffix(".json")) {
                ids.insert(id.to_string());
            }
        }
        let mut last = Value::Null;
        wait_for(Duration::from_secs(120), || {
            let listed = d.call("GET", &format!("/v1/sets/{set}/deliveries"), None);
            let all: Vec<Value> = if listed.status == 200 {
                last = listed.json();
                last["deliveries"].as_array()?.clone()
            } else {
                assert_eq!(listed.status, 404, "{}: the set's deliveries", self.target);
                let mut all = Vec::new();
                for id in &ids {
                    let r = d.call("GET", &format!("/v1/deliveries/{id}"), None);
                    assert_eq!(r.status, 200, "{}: delivery {id} of a pruned set", self.target);
                    all.push(r.json());
                }
                last = Value::Array(all.clone());
                all
            };
            all.iter()
                .all(|x| !["queued", "delivering"].contains(&x["state"].as_str().unwrap_or("queued")))
                .then_some(all)
        })
        .unwrap_or_else(|| panic!("{}: deliveries never ended: {last}", self.target))
    }

    /// Wait until every delivery of the set ended, then check its items and its folder (see
    /// the module docs), adding to `r`.
    pub fn check(&self, d: &Daemon, r: &mut DeliveryReport) {
        let all = self.ended_deliveries(d);
        assert!(!all.is_empty(), "{}: no delivery", self.target);
        r.deliveries += all.len();
        // name → sha256 of every delivered item; each not delivered says why.
        let mut delivered: BTreeMap<String, String> = BTreeMap::new();
        for x in &all {
            for item in x["items"].as_array().expect("items") {
                r.items += 1;
                r.attempted_again += usize::from(item["attempts"].as_i64().unwrap_or(0) > 1);
                let name = item["file_name"].as_str().expect("name").to_string();
                if item["state"] == "delivered" {
                    r.delivered += 1;
                    let sha = item["sha256"].as_str().expect("a delivered item's sha256").to_string();
                    let before = delivered.insert(name.clone(), sha.clone());
                    assert!(before.is_none_or(|b| b == sha), "{}: {name} delivered with two contents", self.target);
                    if x["profile"] == "original" {
                        let art = item["artifact_id"].as_str().expect("artifact");
                        let a = d.call("GET", &format!("/v1/artifacts/{art}"), None);
                        if a.status != 404 {
                            // (An image of a set pruned after its delivery is a clean 404.)
                            assert_eq!(sha256_hex(&a.body), sha, "{}: {name} is not the chosen image", self.target);
                        }
                    }
                } else {
                    r.not_delivered += 1;
                    let why = item["why"].as_str().unwrap_or("");
                    assert!(!why.is_empty(), "{}: item {name} ended {} without saying why", self.target, item["state"]);
                    // A prune never takes what a delivery not yet ended reads (issue #43).
                    assert!(
                        !why.contains("no longer stored"),
                        "{}: a prune took {name} mid-delivery: {why}",
                        self.target
                    );
                    if self.giant() && x["profile"] == "soak" {
                        r.refused_for_size += usize::from(why.contains(&format!("{GIANT_SIDE}×{GIANT_SIDE} px")));
                    }
                    eprintln!("soak: {} {name} not delivered: {why}", self.target);
                }
            }
        }
        let mut files = BTreeMap::new();
        for e in std::fs::read_dir(&self.folder).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                // A write killed before its rename leaves its temporary name (never reused).
                r.temp_files += 1;
            } else {
                files.insert(name, std::fs::read(e.path()).expect("read a delivered file"));
            }
        }
        let mut want: BTreeSet<String> = delivered.keys().cloned().collect();
        if !delivered.is_empty() {
            want.extend(["manifest.csv".to_string(), "manifest.json".to_string()]);
        }
        // Each delivery that delivered anything keeps its own manifest beside the latest one.
        for x in &all {
            if x["items"].as_array().is_some_and(|i| i.iter().any(|i| i["state"] == "delivered")) {
                let id = x["id"].as_str().expect("a delivery's id");
                want.extend([format!("manifest-{id}.csv"), format!("manifest-{id}.json")]);
            }
        }
        assert_eq!(files.keys().cloned().collect::<BTreeSet<_>>(), want, "{}: the folder holds", self.target);
        for (name, sha) in &delivered {
            assert_eq!(&sha256_hex(&files[name]), sha, "{}: {name} is not what was delivered", self.target);
        }
        // The manifest is the last settled delivery's that delivered anything.
        if let Some(newest) = all
            .iter()
            .filter(|x| x["items"].as_array().is_some_and(|i| i.iter().any(|i| i["state"] == "delivered")))
            .max_by_key(|x| x["updated_at"].as_i64())
        {
            let items = newest["items"].as_array().expect("items").clone();
            crate::delivery_crash::check_manifests(&self.target, &files, &items);
        }
    }
}

/// Turn the mock's giant images on while the giant shipment's images are being made, off once
/// they are chosen.
pub fn giant_mood(mock: &Mock, shipments: &[Shipment], on: &mut bool) {
    let want = shipments.iter().any(|s| s.giant() && s.key.is_some() && !s.chosen);
    if want != *on {
        let side = if want { json!(GIANT_SIDE) } else { Value::Null };
        mock.behave(json!({ "giant_image_side": side }));
        eprintln!("soak: giant images {}", if want { "on" } else { "off" });
        *on = want;
    }
}

/// What the soak's deliveries came to.
#[derive(Debug, Default)]
pub struct DeliveryReport {
    pub deliveries: usize,
    pub items: usize,
    pub delivered: usize,
    pub not_delivered: usize,
    /// Items whose write was recorded more than once (a kill between `writing` and the put).
    pub attempted_again: usize,
    pub temp_files: usize,
    /// Items of the giant shipment's `soak` delivery refused in words for their size.
    pub refused_for_size: usize,
}
