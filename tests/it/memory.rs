//! The daemon's one budget for image work (`src/pixels.rs`), held to the outside world: a real
//! daemon limited to 1 GiB of address space (`prlimit --as`), images of 12,000 px a side that
//! are tiny on disk (the mock's `giant_image_side`: a one-colour PNG of about 420 KB that
//! decodes to 432 MB), three profile zips, a delivery and thumbnails of them at once, and two
//! paid jobs in flight at the mock meanwhile. Before the budget, three such renders at once
//! exhausted a 4 GiB daemon (an allocation failure aborts the process) and the paid jobs in
//! flight came back `unknown` after the restart.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::*;

/// The address space the daemon may use: 1 GiB, hard and soft (it cannot raise it).
const ADDRESS_SPACE: u64 = 1 << 30;
/// The resident memory of an idle test daemon, generously (about 45 MB measured, debug build).
const CEILING_IDLE: u64 = 128 << 20;
/// The default image budget (`[engine] image_memory_mb` = 384).
const IMAGE_BUDGET: u64 = tally::pixels::DEFAULT_BYTES;

fn zip_entries(body: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(body)).expect("a whole zip");
    (0..z.len())
        .map(|i| {
            let mut e = z.by_index(i).expect("entry");
            let mut b = Vec::new();
            e.read_to_end(&mut b).expect("read");
            (e.name().expect("a name").to_string(), b)
        })
        .collect()
}

/// `VmHWM` (the most resident memory the process has had), in bytes.
fn peak_resident(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[test]
fn giant_images_are_refused_in_words_and_paid_jobs_in_flight_finish_within_1_gib() {
    let mock = Mock::start(&[]);
    let tmp = TempDir::new();
    let out = tmp.path().join("out");
    let mut d = Daemon::configure(&format!(
        "{}\n[[delivery.targets]]\nname = \"out\"\nkind = \"folder\"\npath = \"{}\"\n",
        providers(&mock),
        out.display()
    ));
    let log = std::fs::File::create(d.dir.path().join("serve.err")).expect("log");
    let child = Command::new("prlimit")
        .arg(format!("--as={ADDRESS_SPACE}:{ADDRESS_SPACE}"))
        .arg("--")
        .arg(EXE)
        .args(["serve", "--config"])
        .arg(&d.config)
        .env_remove("TALLY_DATA_DIR")
        .env_remove("TALLY_CONFIG")
        .env_remove("FAILPOINTS")
        .env("TALLY_TEST_KEY", "sk-test-memory")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("prlimit runs tally serve");
    let pid = child.id();
    d.child = Some(child);
    let port = d.port;
    assert!(
        wait_for(Duration::from_secs(30), || std::net::TcpStream::connect(("127.0.0.1", port)).ok()).is_some(),
        "the daemon did not start under a 1 GiB address space:\n{}",
        d.stderr()
    );

    // A two-shot set whose images come back 12,000 px a side, both chosen.
    mock.behave(json!({"giant_image_side": 12000}));
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let body = json!({"product": "teapot", "provider": "openai", "shots": [
        {"role": "main", "prompt": format!("giant main {tag}")},
        {"role": "scene", "prompt": format!("giant scene {tag}")}]});
    let r = d.call("POST", "/v1/sets", Some(&body));
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let set = r.json()["id"].as_str().expect("id").to_string();
    let settled = wait_for(Duration::from_secs(120), || {
        let s = d.call("GET", &format!("/v1/sets/{set}"), None).json();
        let shots = s["shots"].as_array()?.clone();
        shots.iter().all(|x| x["candidates"][0]["status"] == "succeeded").then_some(s)
    })
    .unwrap_or_else(|| panic!("the giant set never settled:\n{}", d.stderr()));
    let arts: Vec<String> = settled["shots"]
        .as_array()
        .expect("shots")
        .iter()
        .map(|x| x["candidates"][0]["artifact"]["id"].as_str().expect("artifact").to_string())
        .collect();
    for (i, a) in arts.iter().enumerate() {
        let r = d.call("PUT", &format!("/v1/sets/{set}/shots/{i}/choice"), Some(&json!({"artifact_id": a})));
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }

    // Two paid jobs at the mock, answering slowly, in flight through everything below.
    mock.behave(json!({"giant_image_side": null, "latency_ms": 2500}));
    let paid: Vec<String> = (0..2)
        .map(|i| {
            let r = d.call(
                "POST",
                "/v1/tasks",
                Some(&json!({"prompt": format!("in flight {i} {tag}"), "provider": "openai"})),
            );
            assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
            r.json()["id"].as_str().expect("id").to_string()
        })
        .collect();

    // An unforced delivery checks each chosen image first and says why it cannot be made.
    let r = d.call("POST", &format!("/v1/sets/{set}/deliveries"), Some(&json!({"profile": "amazon", "target": "out"})));
    let text = String::from_utf8_lossy(&r.body).to_string();
    assert!(r.status >= 400 && r.status < 500, "an unforced delivery of giant images: {} {text}", r.status);
    assert!(text.contains("12000×12000 px"), "the refusal names the size: {text}");

    // Three profile zips, a forced delivery and both thumbnails, all at once.
    let dd = &d;
    let results: Vec<(String, Reply)> = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for profile in ["amazon", "shopify", "etsy"] {
            let path = format!("/v1/sets/{set}/download?profile={profile}&which=chosen");
            handles.push(s.spawn(move || (path.clone(), dd.call("GET", &path, None))));
        }
        let path = format!("/v1/sets/{set}/deliveries");
        handles.push(s.spawn(move || {
            (path.clone(), dd.call("POST", &path, Some(&json!({"profile": "taobao", "target": "out", "force": true}))))
        }));
        for a in &arts {
            let path = format!("/v1/artifacts/{a}/thumbnail");
            handles.push(s.spawn(move || (path.clone(), dd.call("GET", &path, None))));
        }
        handles.into_iter().map(|h| h.join().expect("a request thread")).collect()
    });

    let mut delivery = None;
    for (path, r) in &results {
        let body = String::from_utf8_lossy(&r.body);
        if path.contains("/download") {
            // No image can be made: the zip is refused before its first byte, each shot named.
            assert_eq!((r.status, r.error_code()), (409, "cannot_make".to_string()), "{path}: {body}");
            for shot in ["shot 1: it is 12000×12000 px", "shot 2: it is 12000×12000 px"] {
                assert!(body.contains(shot) && body.contains("too large"), "{path}: {body}");
            }
        } else if path.contains("/deliveries") {
            assert_eq!(r.status, 201, "{path}: {body}");
            delivery = Some(r.json()["id"].as_str().expect("id").to_string());
        } else {
            assert_eq!(r.status, 422, "{path}: a thumbnail too large to make is refused in words: {body}");
            assert!(body.contains("12000×12000 px"), "{path}: {body}");
        }
    }
    let delivery = delivery.expect("the forced delivery");
    let ended = wait_for(Duration::from_secs(60), || {
        let v = d.call("GET", &format!("/v1/deliveries/{delivery}"), None).json();
        (!["queued", "delivering"].contains(&v["state"].as_str()?)).then_some(v)
    })
    .unwrap_or_else(|| panic!("the delivery never ended:\n{}", d.stderr()));
    let items = ended["items"].as_array().expect("items");
    assert_eq!(items.len(), 2, "{ended}");
    for i in items {
        assert_eq!(i["state"], "failed", "{ended}");
        let why = i["why"].as_str().unwrap_or_default();
        assert!(why.contains("12000×12000 px") && why.contains("too large"), "a plain reason: {why}");
    }
    let written: Vec<_> = std::fs::read_dir(&out).map(|r| r.flatten().collect()).unwrap_or_default();
    assert!(
        written.iter().all(|e| !e.file_name().to_string_lossy().ends_with(".jpg")),
        "no image file was written for images that could not be made"
    );

    // The paid jobs in flight end `succeeded` with their image, one charge each at the mock.
    for id in &paid {
        let t = d.wait_status(id, &["succeeded", "failed", "unknown"]);
        assert_eq!(t["status"], "succeeded", "{t}\n{}", d.stderr());
        let art = &t["artifacts"][0];
        let img = d.call("GET", art["url"].as_str().expect("url"), None);
        assert_eq!(sha256_hex(&img.body), art["sha256"].as_str().expect("sha"));
    }
    for i in 0..2 {
        let (_, charged) = mock.count(&format!("in flight {i} {tag}"));
        assert_eq!(charged, 1, "one charge for paid job {i}");
    }

    // Still the same process (no abort), and it stayed well inside its address space.
    let alive = d.child.as_mut().expect("child").try_wait().expect("try_wait");
    assert!(alive.is_none(), "the daemon exited: {alive:?}\n{}", d.stderr());
    let peak = peak_resident(pid);
    eprintln!("memory: peak resident {} MB under a {} MB address space", peak >> 20, ADDRESS_SPACE >> 20);
    assert!(peak > 0 && peak < ADDRESS_SPACE, "peak resident {peak} bytes");
    assert!(d.term().success(), "{}", d.stderr());
}

/// Under the same limit, an image that fits the budget is still made: the budget refuses only
/// what it must. A 3,000 px image (27 MB of pixels) rendered by three zips at once.
#[test]
fn images_within_the_budget_are_still_rendered_under_1_gib() {
    let mock = Mock::start(&[]);
    let mut d = Daemon::configure(&providers(&mock));
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-memory".into()));
    let log = std::fs::File::create(d.dir.path().join("serve.err")).expect("log");
    let child = Command::new("prlimit")
        .arg(format!("--as={ADDRESS_SPACE}:{ADDRESS_SPACE}"))
        .arg("--")
        .arg(EXE)
        .args(["serve", "--config"])
        .arg(&d.config)
        .env_remove("TALLY_DATA_DIR")
        .env_remove("TALLY_CONFIG")
        .env_remove("FAILPOINTS")
        .env("TALLY_TEST_KEY", "sk-test-memory")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("prlimit runs tally serve");
    let pid = child.id();
    d.child = Some(child);
    let port = d.port;
    assert!(wait_for(Duration::from_secs(30), || std::net::TcpStream::connect(("127.0.0.1", port)).ok()).is_some());
    mock.behave(json!({"giant_image_side": 3000}));
    let body = json!({"product": "teapot", "provider": "openai",
        "shots": [{"role": "main", "prompt": format!("big main {}", uuid::Uuid::new_v4())}]});
    let r = d.call("POST", "/v1/sets", Some(&body));
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let set = r.json()["id"].as_str().expect("id").to_string();
    let s: Value = wait_for(Duration::from_secs(120), || {
        let s = d.call("GET", &format!("/v1/sets/{set}"), None).json();
        (s["shots"][0]["candidates"][0]["status"] == "succeeded").then_some(s)
    })
    .expect("settled");
    let a = s["shots"][0]["candidates"][0]["artifact"]["id"].as_str().expect("artifact").to_string();
    assert_eq!(d.call("PUT", &format!("/v1/sets/{set}/shots/0/choice"), Some(&json!({"artifact_id": a}))).status, 200);
    let (dd, set) = (&d, &set);
    let zips: Vec<Reply> = std::thread::scope(|sc| {
        let hs: Vec<_> = ["amazon", "shopify", "etsy"]
            .into_iter()
            .map(|p| {
                sc.spawn(move || {
                    let path = format!("/v1/sets/{set}/download?profile={p}&which=chosen");
                    let auth = format!("Bearer {}", dd.token());
                    try_request(dd.port, "GET", &path, &[("Authorization", &auth)], None)
                        .unwrap_or_else(|| panic!("{path}: no whole answer; daemon stderr:\n{}", dd.stderr()))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    for z in zips {
        assert_eq!(z.status, 200);
        let entries = zip_entries(&z.body);
        assert!(
            entries.iter().all(|(n, _)| n != "NOT-INCLUDED.txt"),
            "{:?}",
            entries.iter().map(|e| &e.0).collect::<Vec<_>>()
        );
        let jpg = entries.iter().find(|(n, _)| n.ends_with(".jpg")).expect("the rendered image");
        assert!(image::load_from_memory(&jpg.1).is_ok());
    }
    assert!(d.child.as_mut().expect("child").try_wait().expect("try_wait").is_none(), "{}", d.stderr());
    // The ceiling ARCHITECTURE.md ("Memory") documents: the idle daemon, the image budget, and
    // the files of the requests in flight (here three zips of one JPEG each).
    let peak = peak_resident(pid);
    eprintln!("memory: peak resident {} MB rendering within the budget", peak >> 20);
    assert!(peak < CEILING_IDLE + IMAGE_BUDGET + (64 << 20), "peak resident {} MB", peak >> 20);
}
