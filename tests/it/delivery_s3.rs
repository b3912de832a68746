//! The `s3` delivery target against a real S3-compatible server: moto's server mode (pinned,
//! from PyPI: `scripts/install-moto.sh`), started by each test on a free loopback port with
//! SigV4 credentials enforced (its IAM mode: after the first four unauthenticated calls, which
//! make a user, its key, its policy and the bucket, every request must be signed with that
//! key), and killed when the test ends.
//!
//! Between the target and moto, a test can put [`Proxy`], a TCP proxy that follows a plan per
//! connection: pass through, forward the request and then drop the connection before the
//! answer (the object has landed, the answer is lost), forward and never answer (a timeout
//! after sending), swallow the request (lost before landing), hold it unforwarded (a timeout
//! before landing), or answer 503 SlowDown itself. `delivery_s3_faults` uses it too, for the
//! faults S3 documents (issue #38).
//!
//! What is asserted is the bucket itself, read independently with boto3 (the bytes, the
//! sha256 metadata), and moto's own request log (how many writes of a name it accepted).
//! Run alone: `cargo test --features failpoints --test it delivery_s3`.
//!
//! Longer than 600 lines on purpose: the harness (moto, its Python probes, the proxy) and the
//! tests that use it read best in one place; `delivery_crash` reuses [`Moto`] from here.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use tally::delivery::s3::{Credentials, S3Target};
use tally::delivery::target::{Look, Put, S3Config, TargetError};

use crate::common::{sha256_hex, wait_for};

/// The moto venv's directory, or why there is none (never a silent skip: see [`Moto::start`]).
fn moto_venv() -> Result<PathBuf, String> {
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/moto-venv");
    if venv.join("bin/moto_server").exists() && venv.join("bin/python").exists() {
        Ok(venv)
    } else {
        Err(format!(
            "{}/bin/moto_server is missing: run scripts/install-moto.sh (scripts/test.sh does)",
            venv.display()
        ))
    }
}

/// Makes the user, its access key, its policy (all of S3) and the bucket, in moto's four
/// unauthenticated calls, and prints the key as JSON. Arguments: endpoint, bucket.
const SETUP: &str = r#"
import sys, json, boto3
endpoint, bucket = sys.argv[1], sys.argv[2]
iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1",
                   aws_access_key_id="setup", aws_secret_access_key="setup")
iam.create_user(UserName="tally")
key = iam.create_access_key(UserName="tally")["AccessKey"]
iam.put_user_policy(UserName="tally", PolicyName="s3", PolicyDocument=json.dumps({
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
s3.create_bucket(Bucket=bucket)
print(json.dumps({"id": key["AccessKeyId"], "secret": key["SecretAccessKey"]}))
"#;

/// Reads one object and prints JSON: found, body (hex), metadata, content type. Arguments:
/// endpoint, key id, secret, bucket, key.
const READ: &str = r#"
import sys, json, boto3, botocore
endpoint, kid, secret, bucket, key = sys.argv[1:6]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  aws_access_key_id=kid, aws_secret_access_key=secret)
try:
    o = s3.get_object(Bucket=bucket, Key=key)
except botocore.exceptions.ClientError as e:
    if e.response["Error"]["Code"] == "NoSuchKey":
        print(json.dumps({"found": False}))
        sys.exit(0)
    raise
print(json.dumps({"found": True, "body": o["Body"].read().hex(), "metadata": o["Metadata"],
                  "content_type": o.get("ContentType")}))
"#;

/// Lists the objects under a prefix and prints them as JSON: key, body (hex), metadata.
/// Arguments: endpoint, key id, secret, bucket, prefix.
const LIST: &str = r#"
import sys, json, boto3
endpoint, kid, secret, bucket, prefix = sys.argv[1:6]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  aws_access_key_id=kid, aws_secret_access_key=secret)
out = []
for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
    for item in page.get("Contents", []):
        o = s3.get_object(Bucket=bucket, Key=item["Key"])
        out.append({"key": item["Key"], "body": o["Body"].read().hex(), "metadata": o["Metadata"]})
print(json.dumps(out))
"#;

/// `line` without ANSI colour codes (werkzeug colours the request line of a 4xx).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // ESC [ parameters… final letter
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A running moto server with a bucket and a key that may write to it; killed on drop (the
/// delivery crash matrix, `delivery_crash`, runs the engine against it too).
pub(crate) struct Moto {
    child: Child,
    venv: PathBuf,
    pub(crate) port: u16,
    pub(crate) bucket: String,
    pub(crate) creds: Credentials,
    /// moto's stderr so far: werkzeug's request log, one line per request.
    log: Arc<Mutex<String>>,
}

impl Moto {
    /// Start moto on a free port (it binds port 0 and says which), wait until it accepts
    /// connections (bounded), and make the bucket and the key.
    pub(crate) fn start() -> Moto {
        let venv = match moto_venv() {
            Ok(v) => v,
            Err(why) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("{why}"),
            Err(why) => panic!("{why} (this test never skips; outside CI too, install it first)"),
        };
        let mut child = Command::new(venv.join("bin/moto_server"))
            .args(["-H", "127.0.0.1", "-p", "0"])
            .env("INITIAL_NO_AUTH_ACTION_COUNT", "4")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn moto_server");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().expect("moto's stderr");
        let sink = log.clone();
        // Drains stderr for moto's whole life (a full pipe would stall it), and reports the port.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("Running on http://127.0.0.1:").nth(1) {
                    let port: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
                    let _ = tx.send(port.parse::<u16>().ok());
                }
                let mut l = sink.lock().unwrap();
                l.push_str(&strip_ansi(&line));
                l.push('\n');
            }
        });
        let port = match rx.recv_timeout(Duration::from_secs(90)) {
            Ok(Some(p)) => p,
            _ => {
                let _ = child.kill();
                panic!("moto_server did not say which port it listens on within 90 s:\n{}", log.lock().unwrap());
            }
        };
        let ready = wait_for(Duration::from_secs(30), || TcpStream::connect(("127.0.0.1", port)).ok());
        if ready.is_none() {
            let _ = child.kill();
            panic!("moto_server does not accept connections on port {port}:\n{}", log.lock().unwrap());
        }
        let bucket = format!("tally-{}", uuid::Uuid::new_v4().simple());
        let mut moto = Moto {
            child,
            venv,
            port,
            bucket: bucket.clone(),
            creds: Credentials { access_key_id: String::new(), secret_access_key: String::new() },
            log,
        };
        let out = moto.python(SETUP, &[&bucket]);
        moto.creds = Credentials {
            access_key_id: out["id"].as_str().expect("key id").to_string(),
            secret_access_key: out["secret"].as_str().expect("secret").to_string(),
        };
        moto
    }

    pub(crate) fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Run a script of the venv's Python with the endpoint first, and parse what it prints.
    fn python(&self, script: &str, args: &[&str]) -> serde_json::Value {
        let out = Command::new(self.venv.join("bin/python"))
            .arg("-c")
            .arg(script)
            .arg(self.endpoint())
            .args(args)
            .output()
            .expect("run the venv's python");
        assert!(
            out.status.success(),
            "python failed: {}\nmoto's log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log.lock().unwrap()
        );
        serde_json::from_slice(&out.stdout).expect("python printed JSON")
    }

    /// The object at `key` as moto holds it: its bytes and its sha256 metadata, or `None`.
    pub(crate) fn object(&self, key: &str) -> Option<(Vec<u8>, Option<String>, Option<String>)> {
        let c = &self.creds;
        let v = self.python(READ, &[&c.access_key_id, &c.secret_access_key, &self.bucket, key]);
        if v["found"] != true {
            return None;
        }
        let hex = v["body"].as_str().expect("body");
        let bytes = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex")).collect();
        let sha = v["metadata"]["sha256"].as_str().map(str::to_string);
        let ct = v["content_type"].as_str().map(str::to_string);
        Some((bytes, sha, ct))
    }

    /// Every object under `prefix`, by key: its bytes and its sha256 metadata (one listing
    /// and read, in one run of the venv's Python).
    pub(crate) fn objects(&self, prefix: &str) -> std::collections::BTreeMap<String, (Vec<u8>, Option<String>)> {
        let c = &self.creds;
        let v = self.python(LIST, &[&c.access_key_id, &c.secret_access_key, &self.bucket, prefix]);
        let mut out = std::collections::BTreeMap::new();
        for o in v.as_array().expect("a list") {
            let hex = o["body"].as_str().expect("body");
            let bytes =
                (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex")).collect();
            let sha = o["metadata"]["sha256"].as_str().map(str::to_string);
            out.insert(o["key"].as_str().expect("key").to_string(), (bytes, sha));
        }
        out
    }

    /// moto's request log so far.
    pub(crate) fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// How many PUTs of `key` moto answered with `status` (from its request log).
    pub(crate) fn puts(&self, key: &str, status: u16) -> usize {
        let needle = format!("\"PUT /{}/{key} HTTP/1.1\" {status} ", self.bucket);
        self.log.lock().unwrap().matches(&needle).count()
    }

    /// Wait (bounded) until moto's log shows a PUT of `key` answered `status`: werkzeug logs a
    /// request after answering it, so the log can trail the client by a moment.
    pub(crate) fn await_put(&self, key: &str, status: u16) {
        let seen = wait_for(Duration::from_secs(10), || (self.puts(key, status) > 0).then_some(()));
        assert!(seen.is_some(), "moto never logged PUT {key} → {status}:\n{}", self.log.lock().unwrap());
    }

    /// The target's config for this bucket at `port` (moto's own, or a proxy's), trying busy
    /// or lost answers again for 10 s.
    pub(crate) fn config(&self, port: u16) -> S3Config {
        S3Config {
            endpoint: Some(format!("http://127.0.0.1:{port}")),
            region: "us-east-1".into(),
            bucket: self.bucket.clone(),
            prefix: "shop/".into(),
            access_key_id_env: "TALLY_TEST_UNUSED_KEY".into(),
            secret_access_key_env: "TALLY_TEST_UNUSED_SECRET".into(),
            retry_for_ms: 10_000,
        }
    }

    /// A target that talks to moto directly.
    pub(crate) fn target(&self) -> S3Target {
        self.target_via(self.port, 10_000)
    }

    /// A target that talks to `port` (a [`Proxy`] in front of moto), with this timeout.
    pub(crate) fn target_via(&self, port: u16, timeout_ms: u64) -> S3Target {
        S3Target::with_credentials(&self.config(port), timeout_ms, self.creds.clone()).expect("target")
    }

    /// [`Self::target_via`] trying busy or lost answers again for `retry_for_ms` only.
    pub(crate) fn target_retrying(&self, port: u16, timeout_ms: u64, retry_for_ms: u64) -> S3Target {
        let cfg = S3Config { retry_for_ms, ..self.config(port) };
        S3Target::with_credentials(&cfg, timeout_ms, self.creds.clone()).expect("target")
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the proxy does with one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Pass everything through both ways.
    Forward,
    /// Forward the request; once moto starts answering (so it has acted), close the
    /// connection to the target without passing the answer on.
    DropAnswer,
    /// Forward the request and never answer (the connection is held open).
    Hold,
    /// Read the request and close the connection without forwarding it.
    Swallow,
    /// Read the request and answer 503 SlowDown without forwarding it.
    SlowDown,
    /// Read the request and hold the connection open without forwarding it (an answer that
    /// never comes, for a write that never landed).
    Stall,
}

/// A TCP proxy in front of moto whose connections follow a plan: the n-th connection it
/// accepts gets the plan's n-th mode, and every later one [`Mode::Forward`].
pub(crate) struct Proxy {
    pub(crate) port: u16,
    stop: Arc<AtomicBool>,
    /// The non-forwarding modes given to connections so far, in order (recorded on accept,
    /// before the connection is served).
    used: Arc<Mutex<Vec<Mode>>>,
    /// Connections held open by [`Mode::Hold`], closed on drop.
    held: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    pub(crate) fn start(upstream: u16, plan: &[Mode]) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().expect("proxy addr").port();
        let plan = Arc::new(Mutex::new(plan.iter().copied().collect::<VecDeque<_>>()));
        let stop = Arc::new(AtomicBool::new(false));
        let used = Arc::new(Mutex::new(Vec::new()));
        let held = Arc::new(Mutex::new(Vec::new()));
        let (s, u, h) = (stop.clone(), used.clone(), held.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = conn else { continue };
                let mode = plan.lock().unwrap().pop_front().unwrap_or(Mode::Forward);
                if mode != Mode::Forward {
                    u.lock().unwrap().push(mode);
                }
                let h = h.clone();
                std::thread::spawn(move || serve(client, upstream, mode, &h));
            }
        });
        Proxy { port, stop, used, held }
    }

    /// The non-forwarding modes given to connections so far, in order.
    pub(crate) fn used(&self) -> Vec<Mode> {
        self.used.lock().unwrap().clone()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        for s in self.held.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// One proxied connection.
fn serve(mut client: TcpStream, upstream: u16, mode: Mode, held: &Mutex<Vec<TcpStream>>) {
    match mode {
        Mode::Stall => {
            let _ = read_request(&mut client);
            held.lock().unwrap().push(client);
        }
        Mode::Swallow | Mode::SlowDown => {
            let _ = read_request(&mut client);
            if mode == Mode::SlowDown {
                let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>\
                            <Message>Please reduce your request rate.</Message></Error>";
                let head = format!(
                    "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n",
                    body.len()
                );
                let _ = client.write_all(head.as_bytes());
                let _ = client.write_all(body.as_bytes());
                let _ = client.flush();
            }
            let _ = client.shutdown(Shutdown::Both);
        }
        Mode::Forward | Mode::DropAnswer | Mode::Hold => {
            let Ok(mut up) = TcpStream::connect(("127.0.0.1", upstream)) else {
                let _ = client.shutdown(Shutdown::Both);
                return;
            };
            let (Ok(mut client_r), Ok(mut up_w)) = (client.try_clone(), up.try_clone()) else { return };
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut client_r, &mut up_w);
                let _ = up_w.shutdown(Shutdown::Write);
            });
            match mode {
                Mode::Forward => {
                    let _ = std::io::copy(&mut up, &mut client);
                    let _ = client.shutdown(Shutdown::Write);
                }
                _ => {
                    // The first byte of moto's answer: the request has been acted on.
                    let mut first = [0u8; 1];
                    let _ = up.read(&mut first);
                    let _ = up.shutdown(Shutdown::Both);
                    if mode == Mode::Hold {
                        held.lock().unwrap().push(client);
                    } else {
                        let _ = client.shutdown(Shutdown::Both);
                    }
                }
            }
        }
    }
}

/// Read one HTTP/1.1 request (head, then a Content-Length or chunked body) from `s`.
pub(crate) fn read_request(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Ok(buf);
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length =
        head.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse::<usize>().ok());
    let chunked = head.contains("transfer-encoding: chunked");
    loop {
        let body = &buf[head_end..];
        let complete = match length {
            Some(n) => body.len() >= n,
            None => !chunked || body.ends_with(b"0\r\n\r\n"),
        };
        if complete {
            return Ok(buf);
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Ok(buf);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Some bytes that stand for a delivered image (large enough to take more than one read).
pub(crate) fn image(seed: &str) -> Vec<u8> {
    seed.as_bytes().iter().copied().cycle().take(200_000).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn written_then_read_back() {
    let moto = Moto::start();
    let t = moto.target();
    let bytes = image("main photo");
    let sha = sha256_hex(&bytes);
    assert_eq!(t.look("main.jpg").await, Ok(Look::Absent));
    assert_eq!(t.put("main.jpg", bytes.clone(), &sha).await, Ok(Put::Written));
    // The bucket holds our bytes under the prefix, with the sha256 as metadata.
    let (there, meta_sha, ct) = moto.object("shop/main.jpg").expect("the object is there");
    assert!(there == bytes, "the stored bytes differ from the written ones");
    assert_eq!(meta_sha.as_deref(), Some(sha.as_str()));
    assert_eq!(ct.as_deref(), Some("image/jpeg"));
    let found = t.look("main.jpg").await;
    assert!(matches!(&found, Ok(Look::Present { sha256, remote_id: Some(_) }) if *sha256 == sha), "{found:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_bytes_again_are_already_there() {
    let moto = Moto::start();
    let t = moto.target();
    let bytes = image("side view");
    let sha = sha256_hex(&bytes);
    assert_eq!(t.put("side.png", bytes.clone(), &sha).await, Ok(Put::Written));
    assert_eq!(t.put("side.png", bytes.clone(), &sha).await, Ok(Put::AlreadyThere));
    // moto accepted one write and refused the second (If-None-Match: *).
    moto.await_put("shop/side.png", 200);
    moto.await_put("shop/side.png", 412);
    assert_eq!(moto.puts("shop/side.png", 200), 1);
    let (there, _, _) = moto.object("shop/side.png").expect("the object is there");
    assert!(there == bytes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_bytes_are_different_and_the_object_is_unchanged() {
    let moto = Moto::start();
    let t = moto.target();
    let first = image("first");
    let second = image("second");
    let (sha1, sha2) = (sha256_hex(&first), sha256_hex(&second));
    assert_eq!(t.put("hero.webp", first.clone(), &sha1).await, Ok(Put::Written));
    assert_eq!(t.put("hero.webp", second, &sha2).await, Ok(Put::Different { existing_sha256: Some(sha1.clone()) }));
    let (there, meta_sha, _) = moto.object("shop/hero.webp").expect("the object is there");
    assert!(there == first, "the first bytes were overwritten");
    assert_eq!(meta_sha, Some(sha1));
    moto.await_put("shop/hero.webp", 412);
    assert_eq!(moto.puts("shop/hero.webp", 200), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_after_the_object_landed_is_settled_by_reading_back() {
    let moto = Moto::start();
    let proxy = Proxy::start(moto.port, &[Mode::DropAnswer]);
    let t = moto.target_via(proxy.port, 10_000);
    let bytes = image("lifestyle scene");
    let sha = sha256_hex(&bytes);
    assert_eq!(t.put("scene.jpg", bytes.clone(), &sha).await, Ok(Put::Written));
    assert_eq!(proxy.used(), vec![Mode::DropAnswer], "the answer was not dropped: the test tested nothing");
    // The engine trying again finds it there; still one accepted write, and our bytes.
    assert_eq!(t.put("scene.jpg", bytes.clone(), &sha).await, Ok(Put::AlreadyThere));
    moto.await_put("shop/scene.jpg", 200);
    moto.await_put("shop/scene.jpg", 412);
    assert_eq!(moto.puts("shop/scene.jpg", 200), 1);
    let (there, _, _) = moto.object("shop/scene.jpg").expect("the object is there");
    assert!(there == bytes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_lost_before_landing_is_read_back_then_written_again_once() {
    let moto = Moto::start();
    let proxy = Proxy::start(moto.port, &[Mode::Swallow]);
    let t = moto.target_via(proxy.port, 10_000);
    let bytes = image("selling point");
    let sha = sha256_hex(&bytes);
    assert_eq!(t.put("point.jpg", bytes.clone(), &sha).await, Ok(Put::Written));
    assert_eq!(proxy.used(), vec![Mode::Swallow], "the request was not lost: the test tested nothing");
    moto.await_put("shop/point.jpg", 200);
    assert_eq!(moto.puts("shop/point.jpg", 200), 1);
    assert!(moto.object("shop/point.jpg").expect("there").0 == bytes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_retrying_a_request_lost_before_landing_is_transient() {
    let moto = Moto::start();
    let proxy = Proxy::start(moto.port, &[Mode::Swallow]);
    let t = moto.target_retrying(proxy.port, 10_000, 0);
    let bytes = image("selling point");
    let sha = sha256_hex(&bytes);
    let err = t.put("point.jpg", bytes.clone(), &sha).await.unwrap_err();
    assert!(matches!(&err, TargetError::Transient(m) if m.contains("not there")), "{err:?}");
    assert_eq!(moto.object("shop/point.jpg"), None);
    assert_eq!(t.put("point.jpg", bytes.clone(), &sha).await, Ok(Put::Written));
    assert!(moto.object("shop/point.jpg").expect("there").0 == bytes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_that_cannot_be_read_back_is_ambiguous() {
    let moto = Moto::start();
    // The write lands and its answer is lost; every read-back within the item's 1.5 s of
    // retrying is answered 503.
    let mut plan = vec![Mode::DropAnswer];
    plan.extend([Mode::SlowDown; 40]);
    let proxy = Proxy::start(moto.port, &plan);
    let t = moto.target_retrying(proxy.port, 10_000, 1_500);
    let bytes = image("packaging");
    let sha = sha256_hex(&bytes);
    let err = t.put("pack.jpg", bytes.clone(), &sha).await.unwrap_err();
    assert!(matches!(&err, TargetError::Ambiguous(m) if m.contains("may or may not")), "{err:?}");
    let used = proxy.used();
    assert!(used.len() >= 3 && used[0] == Mode::DropAnswer, "the read-back was tried again: {used:?}");
    assert_eq!(moto.puts("shop/pack.jpg", 200), 1, "never written again while it could not be read");
    // Looking later settles it.
    let found = moto.target().look("pack.jpg").await;
    assert!(matches!(&found, Ok(Look::Present { sha256, remote_id: Some(_) }) if *sha256 == sha), "{found:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_whose_read_back_is_refused_once_is_settled_by_reading_again() {
    let moto = Moto::start();
    let proxy = Proxy::start(moto.port, &[Mode::DropAnswer, Mode::SlowDown]);
    let t = moto.target_via(proxy.port, 10_000);
    let bytes = image("packaging");
    let sha = sha256_hex(&bytes);
    assert_eq!(t.put("pack.jpg", bytes.clone(), &sha).await, Ok(Put::Written));
    assert_eq!(proxy.used(), vec![Mode::DropAnswer, Mode::SlowDown]);
    moto.await_put("shop/pack.jpg", 200);
    assert_eq!(moto.puts("shop/pack.jpg", 200), 1);
    assert_eq!(moto.puts("shop/pack.jpg", 412), 0, "settled by reading, not by writing again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_retrying_a_503_is_transient_and_nothing_is_written() {
    let moto = Moto::start();
    let proxy = Proxy::start(moto.port, &[Mode::SlowDown, Mode::SlowDown]);
    let t = moto.target_retrying(proxy.port, 10_000, 0);
    let bytes = image("back view");
    let sha = sha256_hex(&bytes);
    let err = t.put("back.jpg", bytes, &sha).await.unwrap_err();
    assert!(matches!(&err, TargetError::Transient(m) if m.contains("503") && m.contains("SlowDown")), "{err:?}");
    // A HEAD's answer has no body, so only the status tells.
    let err = t.look("back.jpg").await.unwrap_err();
    assert!(matches!(&err, TargetError::Transient(m) if m.contains("503")), "{err:?}");
    assert_eq!(proxy.used(), vec![Mode::SlowDown, Mode::SlowDown]);
    assert_eq!(moto.object("shop/back.jpg"), None);
    assert_eq!(moto.puts("shop/back.jpg", 200), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_are_permanent() {
    let moto = Moto::start();
    // Permanent means at once: not tried again for the target's 10 s of `retry_for_ms`.
    let started = std::time::Instant::now();
    let bytes = image("main photo");
    let sha = sha256_hex(&bytes);
    let wrong_secret = Credentials { secret_access_key: "not-the-secret".into(), ..moto.creds.clone() };
    let t = S3Target::with_credentials(&moto.config(moto.port), 10_000, wrong_secret).expect("target");
    let err = t.put("main.jpg", bytes.clone(), &sha).await.unwrap_err();
    assert!(matches!(&err, TargetError::Permanent(m) if m.contains("SignatureDoesNotMatch")), "{err:?}");
    let err = t.look("main.jpg").await.unwrap_err();
    assert!(matches!(err, TargetError::Permanent(_)), "{err:?}");
    let unknown_key = Credentials { access_key_id: "AKIANOSUCHKEY0000000".into(), ..moto.creds.clone() };
    let t = S3Target::with_credentials(&moto.config(moto.port), 10_000, unknown_key).expect("target");
    let err = t.put("main.jpg", bytes, &sha).await.unwrap_err();
    assert!(matches!(&err, TargetError::Permanent(m) if m.contains("InvalidAccessKeyId")), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(8), "refusals were tried again: {:?}", started.elapsed());
    assert_eq!(moto.object("shop/main.jpg"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_bucket_is_permanent() {
    let moto = Moto::start();
    let mut cfg = moto.config(moto.port);
    cfg.bucket = "tally-no-such-bucket".into();
    let t = S3Target::with_credentials(&cfg, 10_000, moto.creds.clone()).expect("target");
    let bytes = image("main photo");
    let sha = sha256_hex(&bytes);
    let started = std::time::Instant::now();
    let err = t.put("main.jpg", bytes, &sha).await.unwrap_err();
    assert!(
        matches!(&err, TargetError::Permanent(m) if m.contains("tally-no-such-bucket") && m.contains("does not exist")),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(8), "a missing bucket was tried again: {:?}", started.elapsed());
}

/// A delivery through the daemon's engine to an `s3` target (issue #26): every chosen image
/// lands in the bucket under the prefix with its sha256, and the manifest beside them;
/// delivering again finds the objects there and writes nothing over them.
#[test]
fn a_set_is_delivered_to_a_bucket_through_the_engine() {
    use crate::common::{Daemon, FAST_DEMO};
    use serde_json::json;
    let moto = Moto::start();
    let target = format!(
        "{FAST_DEMO}\n[[delivery.targets]]\nname = \"shop\"\nkind = \"s3\"\nendpoint = \"{}\"\nregion = \"us-east-1\"\n\
         bucket = \"{}\"\nprefix = \"shop/\"\naccess_key_id_env = \"TALLY_TEST_S3_KEY\"\n\
         secret_access_key_env = \"TALLY_TEST_S3_SECRET\"\n",
        moto.endpoint(),
        moto.bucket
    );
    let mut d = Daemon::configure(&target);
    d.env.push(("TALLY_TEST_S3_KEY".into(), moto.creds.access_key_id.clone()));
    d.env.push(("TALLY_TEST_S3_SECRET".into(), moto.creds.secret_access_key.clone()));
    d.spawn();
    let body =
        json!({"product": "green teapot", "shots": [{"role": "main", "prompt": uuid::Uuid::new_v4().to_string()}]});
    let id = d.call("POST", "/v1/sets", Some(&body)).json()["id"].as_str().expect("set").to_string();
    let art = wait_for(Duration::from_secs(60), || {
        let s = d.call("GET", &format!("/v1/sets/{id}"), None).json();
        let a = s["shots"][0]["candidates"][0]["artifact"].clone();
        a["id"].is_string().then_some(a)
    })
    .expect("the shot's image");
    let r = d.call("PUT", &format!("/v1/sets/{id}/shots/0/choice"), Some(&json!({"artifact_id": art["id"]})));
    assert_eq!(r.status, 200);
    for round in 0..2 {
        let r = d.call(
            "POST",
            &format!("/v1/sets/{id}/deliveries"),
            Some(&json!({"profile": "original", "target": "shop"})),
        );
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        let did = r.json()["id"].as_str().expect("delivery").to_string();
        let done = wait_for(Duration::from_secs(60), || {
            let v = d.call("GET", &format!("/v1/deliveries/{did}"), None).json();
            (!["queued", "delivering"].contains(&v["state"].as_str().unwrap_or("queued"))).then_some(v)
        })
        .expect("the delivery ended");
        assert_eq!(done["state"], "delivered", "round {round}: {done}; daemon stderr:\n{}", d.stderr());
        let name = done["items"][0]["file_name"].as_str().expect("name");
        let (bytes, sha, _) = moto.object(&format!("shop/{name}")).expect("the object is in the bucket");
        assert_eq!(sha256_hex(&bytes), art["sha256"].as_str().expect("sha"), "round {round}: the chosen image");
        assert_eq!(sha.as_deref(), art["sha256"].as_str());
        let (csv, _, _) = moto.object("shop/manifest.csv").expect("manifest.csv in the bucket");
        assert!(String::from_utf8_lossy(&csv).contains(art["sha256"].as_str().expect("sha")));
        assert_eq!(done["items"][0]["attempts"], 1);
    }
}
