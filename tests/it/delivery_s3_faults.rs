//! The `s3` target riding out the faults S3 documents, and bounded by what tally wrote
//! (issue #38), against moto behind `delivery_s3`'s fault [`Proxy`], and against small
//! hostile endpoints of this file ([`Hostile`]): an error page of 48 MB, an endpoint that
//! echoes the request (its `Authorization` header with the access key id and the signature),
//! and one that trickles its answer a byte at a time.
//!
//! What is asserted is the outside world: the bucket (read with boto3), moto's request log
//! (how many writes of a name it accepted, and refused with 412), how many bytes the hostile
//! endpoint got to send, the delivery's JSON, the daemon's log and its data directory.
//! Run alone: `cargo test --features failpoints --test it delivery_s3`.

use std::io::Write;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tally::delivery::s3::{Credentials, S3Target};
use tally::delivery::target::{Put, S3Config, TargetError, WHY_MAX_CHARS};

use crate::common::{Daemon, FAST_DEMO, sha256_hex};
use crate::deliveries::{chosen_set, deliver, ended};
use crate::delivery_s3::{Mode, Moto, Proxy, image, read_request};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_down_twice_then_success_is_one_accepted_write() {
    let moto = Moto::start();
    let proxy = Proxy::start(moto.port, &[Mode::SlowDown, Mode::SlowDown]);
    let t = moto.target_via(proxy.port, 10_000);
    let bytes = image("slow down");
    let sha = sha256_hex(&bytes);
    assert_eq!(t.put("slow.jpg", bytes.clone(), &sha).await, Ok(Put::Written));
    assert_eq!(proxy.used(), vec![Mode::SlowDown, Mode::SlowDown], "the 503s were not given: nothing was tested");
    moto.await_put("shop/slow.jpg", 200);
    assert_eq!(moto.puts("shop/slow.jpg", 200), 1);
    let (there, meta, _) = moto.object("shop/slow.jpg").expect("the object is there");
    assert_eq!((sha256_hex(&there), meta), (sha.clone(), Some(sha)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_held_past_the_timeout_before_landing_is_written_again_once() {
    let moto = Moto::start();
    // The first write is held by the proxy and never reaches moto; the client gives up after
    // its timeout, reads back (nothing there), and writes again, conditionally.
    let proxy = Proxy::start(moto.port, &[Mode::Stall]);
    let t = moto.target_via(proxy.port, 1_500);
    let bytes = image("held before landing");
    let sha = sha256_hex(&bytes);
    assert_eq!(t.put("held.png", bytes.clone(), &sha).await, Ok(Put::Written));
    assert_eq!(proxy.used(), vec![Mode::Stall], "the write was not held: nothing was tested");
    moto.await_put("shop/held.png", 200);
    assert_eq!(moto.puts("shop/held.png", 200), 1, "written exactly once");
    assert!(moto.object("shop/held.png").expect("there").0 == bytes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_held_past_the_timeout_after_landing_is_settled_by_reading_back() {
    let moto = Moto::start();
    // moto stores the object and answers; the proxy holds the answer past the timeout.
    let proxy = Proxy::start(moto.port, &[Mode::Hold]);
    let t = moto.target_via(proxy.port, 3_000);
    let bytes = image("held after landing");
    let sha = sha256_hex(&bytes);
    assert_eq!(t.put("landed.png", bytes.clone(), &sha).await, Ok(Put::Written));
    assert_eq!(proxy.used(), vec![Mode::Hold]);
    moto.await_put("shop/landed.png", 200);
    // A HEAD after the put, logged after it: moto's log is complete up to here.
    let _ = moto.target().look("landed.png").await;
    let head = format!("\"HEAD /{}/shop/landed.png HTTP/1.1\"", moto.bucket);
    let logged = crate::common::wait_for(Duration::from_secs(10), || moto.log().contains(&head).then_some(()));
    assert!(logged.is_some(), "moto never logged the HEAD");
    assert_eq!(moto.puts("shop/landed.png", 200), 1);
    assert_eq!(moto.puts("shop/landed.png", 412), 0, "settled by reading back, not by writing again");
}

/// A delivery through the daemon to a bucket that answers `503 SlowDown` twice: delivered in
/// one attempt per file, one accepted write each, and each file's ETag kept as its
/// `remote_id`, in the delivery and in its own manifest.
#[test]
fn a_delivery_rides_out_slow_down_with_one_write_per_file() {
    let moto = Moto::start();
    let proxy = Proxy::start(moto.port, &[Mode::SlowDown, Mode::SlowDown]);
    let mut d = Daemon::configure(&format!(
        "{FAST_DEMO}\n[[delivery.targets]]\nname = \"shop\"\nkind = \"s3\"\nendpoint = \"http://127.0.0.1:{}\"\n\
         region = \"us-east-1\"\nbucket = \"{}\"\nprefix = \"slow/\"\naccess_key_id_env = \"TALLY_TEST_S3_KEY\"\n\
         secret_access_key_env = \"TALLY_TEST_S3_SECRET\"\ntimeout_ms = 10000\nretry_for_ms = 20000\n",
        proxy.port, moto.bucket
    ));
    d.env.push(("TALLY_TEST_S3_KEY".into(), moto.creds.access_key_id.clone()));
    d.env.push(("TALLY_TEST_S3_SECRET".into(), moto.creds.secret_access_key.clone()));
    d.spawn();
    let (set, arts) = chosen_set(&d, true);
    let id = deliver(&d, &set, "original", "shop", false);
    let done = ended(&d, &id);
    assert_eq!(done["state"], "delivered", "{done}; stderr:\n{}", d.stderr());
    assert_eq!(proxy.used(), vec![Mode::SlowDown, Mode::SlowDown]);
    let objects = moto.objects("slow/");
    let items = done["items"].as_array().expect("items");
    for (item, (_, sha)) in items.iter().zip(&arts) {
        let name = item["file_name"].as_str().expect("name");
        assert_eq!(item["attempts"], 1, "{item}");
        assert!(item["remote_id"].as_str().is_some_and(|r| !r.is_empty()), "the ETag is kept: {item}");
        assert_eq!(sha256_hex(&objects[&format!("slow/{name}")].0), *sha);
        assert_eq!(moto.puts(&format!("slow/{name}"), 200), 1, "{name} written once");
    }
    // Its own manifest, with each file's remote id; `manifest.json` is the latest's.
    for manifest in [format!("slow/manifest-{id}.json"), "slow/manifest.json".to_string()] {
        let (bytes, _) = objects.get(&manifest).unwrap_or_else(|| panic!("{manifest}: {:?}", objects.keys()));
        let m: Value = serde_json::from_slice(bytes).expect("json");
        let listed: Vec<&Value> = m["files"].as_array().expect("files").iter().map(|f| &f["remote_id"]).collect();
        let kept: Vec<&Value> = items.iter().map(|i| &i["remote_id"]).collect();
        assert_eq!(listed, kept, "{manifest}");
    }
}

/// What a [`Hostile`] endpoint does with every request.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Behaviour {
    /// `400` with a 48 MB HTML body, sent as fast as the client takes it.
    HugeError,
    /// `400` with an S3 XML error whose message echoes the request's headers, `Authorization`
    /// first.
    Echo,
    /// `200 OK` a byte every 100 ms, never finishing.
    Trickle,
}

/// A hostile S3 endpoint on a loopback port (a thread per connection), stopped on drop.
struct Hostile {
    port: u16,
    stop: Arc<AtomicBool>,
    /// Bytes of answers sent so far.
    sent: Arc<AtomicUsize>,
    /// The request heads received, in order.
    seen: Arc<Mutex<Vec<String>>>,
}

impl Hostile {
    fn start(behaviour: Behaviour) -> Hostile {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (s, n, h) = (stop.clone(), sent.clone(), seen.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(c) = conn else { continue };
                let (s, n, h) = (s.clone(), n.clone(), h.clone());
                std::thread::spawn(move || answer(c, behaviour, &s, &n, &h));
            }
        });
        Hostile { port, stop, sent, seen }
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// One connection of a [`Hostile`] endpoint.
fn answer(mut c: TcpStream, behaviour: Behaviour, stop: &AtomicBool, sent: &AtomicUsize, seen: &Mutex<Vec<String>>) {
    let Ok(request) = read_request(&mut c) else { return };
    let text = String::from_utf8_lossy(&request).into_owned();
    let head = text.split("\r\n\r\n").next().unwrap_or_default().to_string();
    seen.lock().unwrap().push(head.clone());
    let mut send = |bytes: &[u8]| -> bool {
        let ok = c.write_all(bytes).is_ok();
        if ok {
            sent.fetch_add(bytes.len(), Ordering::SeqCst);
        }
        ok
    };
    match behaviour {
        Behaviour::HugeError => {
            let total = 48 << 20;
            let head = format!(
                "HTTP/1.1 400 Bad Request\r\nContent-Type: text/html\r\nContent-Length: {total}\r\nConnection: close\r\n\r\n"
            );
            let chunk = "<html><body>Bad Request</body></html>\n".repeat(1700).into_bytes();
            if send(head.as_bytes()) {
                let mut left = total;
                while left > 0 && send(&chunk[..chunk.len().min(left)]) {
                    left -= chunk.len().min(left);
                }
            }
        }
        Behaviour::Echo => {
            let mut lines: Vec<&str> = head.lines().skip(1).collect();
            lines.sort_by_key(|l| !l.to_ascii_lowercase().starts_with("authorization"));
            let body = format!(
                "<?xml version=\"1.0\"?><Error><Code>InvalidRequest</Code><Message>You sent {}</Message></Error>",
                lines.join("\n")
            );
            let head = format!(
                "HTTP/1.1 400 Bad Request\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = send(head.as_bytes()) && send(body.as_bytes());
        }
        Behaviour::Trickle => {
            for b in b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n".iter().cycle() {
                if stop.load(Ordering::SeqCst) || !send(&[*b]) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    let _ = c.shutdown(Shutdown::Both);
}

/// A target for bucket `b` at a hostile endpoint, with fixed credentials.
fn hostile_target(port: u16, timeout_ms: u64, retry_for_ms: u64) -> S3Target {
    let cfg = S3Config {
        endpoint: Some(format!("http://127.0.0.1:{port}")),
        region: "us-east-1".into(),
        bucket: "b".into(),
        prefix: String::new(),
        access_key_id_env: "UNUSED".into(),
        secret_access_key_env: "UNUSED".into(),
        retry_for_ms,
    };
    let creds = Credentials { access_key_id: "AKIAHOSTILE000000001".into(), secret_access_key: "s3cr3t-value".into() };
    S3Target::with_credentials(&cfg, timeout_ms, creds).expect("target")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_error_page_is_read_in_part_and_its_reason_is_short() {
    let hostile = Hostile::start(Behaviour::HugeError);
    let t = hostile_target(hostile.port, 10_000, 0);
    let bytes = image("huge error");
    let sha = sha256_hex(&bytes);
    let err = t.put("x.jpg", bytes, &sha).await.unwrap_err();
    let TargetError::Permanent(why) = &err else { panic!("a 400 is permanent: {err:?}") };
    assert!(why.chars().count() <= WHY_MAX_CHARS && why.contains("refused"), "{why}");
    // The client stopped reading: most of the 48 MB were never taken (what was sent sits in
    // the loopback's socket buffers, a few MB at most).
    let sent = hostile.sent.load(Ordering::SeqCst);
    assert!(sent < 16 << 20, "{sent} bytes of the 48 MB error page were read");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickling_endpoint_holds_a_file_no_longer_than_its_deadline() {
    let hostile = Hostile::start(Behaviour::Trickle);
    // Deadline: retry_for_ms + timeout_ms = 3 s. A timeout per step (write, read-backs) would
    // be 1.5 s each, for 4.5 s or more.
    let t = hostile_target(hostile.port, 1_500, 1_500);
    let bytes = image("trickle");
    let sha = sha256_hex(&bytes);
    let started = Instant::now();
    let err = t.put("x.jpg", bytes, &sha).await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(&err, TargetError::Ambiguous(_)), "a write with no answer and no read-back: {err:?}");
    assert!(took < Duration::from_millis(3_600), "the item took {took:?}, past its 3 s deadline");
    assert!(hostile.seen.lock().unwrap().len() >= 2, "the write and at least one read-back were tried");
}

/// An endpoint that echoes the request (the access key id and the signature in its
/// `Authorization` header) into its error: neither appears in the delivery's JSON, the
/// daemon's log or its data directory.
#[test]
fn an_endpoint_echoing_the_request_leaks_no_credentials() {
    let hostile = Hostile::start(Behaviour::Echo);
    let (key_id, secret) = ("AKIATALLYECHO0000001", "echo-secret-do-not-show");
    let mut d = Daemon::configure(&format!(
        "{FAST_DEMO}\n[[delivery.targets]]\nname = \"echo\"\nkind = \"s3\"\nendpoint = \"http://127.0.0.1:{}\"\n\
         region = \"us-east-1\"\nbucket = \"b\"\naccess_key_id_env = \"TALLY_TEST_S3_KEY\"\n\
         secret_access_key_env = \"TALLY_TEST_S3_SECRET\"\nretry_for_ms = 0\n",
        hostile.port
    ));
    d.env.push(("TALLY_TEST_S3_KEY".into(), key_id.into()));
    d.env.push(("TALLY_TEST_S3_SECRET".into(), secret.into()));
    d.spawn();
    let (set, _) = chosen_set(&d, true);
    let id = deliver(&d, &set, "original", "echo", false);
    let done = ended(&d, &id);
    assert_eq!(done["state"], "failed", "{done}");
    // The echo did carry them: the test can fail.
    let seen = hostile.seen.lock().unwrap().clone();
    let auth = seen.iter().flat_map(|h| h.lines()).find(|l| l.to_ascii_lowercase().starts_with("authorization"));
    let auth = auth.expect("a signed request").to_string();
    let signature = auth.rsplit("Signature=").next().expect("a signature").trim().to_string();
    assert!(auth.contains(key_id) && signature.len() >= 32, "{auth}");
    let why = done["items"][0]["why"].as_str().expect("a reason").to_string();
    assert!(why.contains("InvalidRequest") && why.chars().count() <= WHY_MAX_CHARS, "{why}");
    let shown = d.call("GET", &format!("/v1/deliveries/{id}"), None);
    let listed = d.call("GET", &format!("/v1/sets/{set}/deliveries"), None);
    let targets = d.call("GET", "/v1/delivery/targets", None);
    let mut places: Vec<(String, Vec<u8>)> = vec![
        ("GET /v1/deliveries/{id}".into(), shown.body),
        ("GET /v1/sets/{id}/deliveries".into(), listed.body),
        ("GET /v1/delivery/targets".into(), targets.body),
        ("the daemon's log".into(), d.stderr().into_bytes()),
    ];
    for e in walk(&d.data) {
        places.push((e.display().to_string(), std::fs::read(&e).unwrap_or_default()));
    }
    for (place, bytes) in &places {
        for secret in [key_id, secret, signature.as_str()] {
            let found = bytes.windows(secret.len()).any(|w| w == secret.as_bytes());
            assert!(!found, "{secret} is in {place}");
        }
    }
    assert_eq!(json!(done["items"].as_array().map(Vec::len)), json!(2));
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
