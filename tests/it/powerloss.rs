//! Power loss in the suite: the daemon's data dir lives on LazyFS, a FUSE file system that
//! keeps every write in its own cache until it is fsynced and drops whatever is unsynced on
//! `lazyfs::clear-cache` — what a power cut does to the page cache (the way Jepsen tests
//! databases). A client submits tasks across every provider kind against the mock provider
//! (whose ledger is on the real disk: the outside world survives the cut); a driver cuts power
//! at random moments — after a random delay, right after a paid request reached the mock, and
//! during start-up recovery — by SIGKILLing the daemon and clearing LazyFS's cache, then starts
//! it again on what the "disk" kept.
//!
//! With `durability = "full"` it asserts: no answered task is lost, no prompt is charged twice
//! (mock ledger), no restart holds a job as if the database were an older copy, no settled
//! outcome a client saw changes, no task's final state contradicts
//! the ledger, and `tally check` is clean. A `durability = "normal"` control run must lose
//! something, proving that the harness really drops unsynced data.
//!
//! Bounded for the test command (`TALLY_POWERLOSS_CUTS`, default 12); a long run:
//! `TALLY_POWERLOSS_CUTS=300 cargo test --features failpoints --test it powerloss:: -- --nocapture`.
//! Needs LazyFS (`scripts/install-lazyfs.sh` builds it; `TALLY_LAZYFS` names the binary) and
//! root for FUSE; without them the tests fail under `CI=true` and say loudly that they did not
//! run elsewhere.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Daemon, EXE, Mock, TempDir, providers, submit, wait_for};

/// The LazyFS binary, if it is installed.
fn lazyfs_binary() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("TALLY_LAZYFS") {
        return Some(PathBuf::from(p)).filter(|p| p.exists());
    }
    let home = std::env::var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|_| std::env::var("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .ok()?;
    Some(home.join("tally/lazyfs/lazyfs/build/lazyfs")).filter(|p| p.exists())
}

fn available(what: &str) -> Option<PathBuf> {
    let bin = lazyfs_binary();
    let fuse = Path::new("/dev/fuse").exists();
    if let (Some(bin), true) = (&bin, fuse) {
        return Some(bin.clone());
    }
    let why = if fuse { "LazyFS is not built (bash scripts/install-lazyfs.sh)" } else { "/dev/fuse is missing" };
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{what}: {why}");
    eprintln!("NOT RUN: {what}: {why}");
    None
}

/// A mounted LazyFS with its fault FIFOs.
struct LazyFs {
    mnt: PathBuf,
    child: Child,
    fifo: PathBuf,
    done: std::sync::mpsc::Receiver<String>,
    _dir: TempDir,
}

impl LazyFs {
    fn mount(bin: &Path) -> LazyFs {
        let dir = TempDir::new();
        let (mnt, root) = (dir.path().join("mnt"), dir.path().join("root"));
        std::fs::create_dir_all(&mnt).expect("mnt");
        std::fs::create_dir_all(&root).expect("root");
        let (fifo, done_fifo) = (dir.path().join("faults.fifo"), dir.path().join("done.fifo"));
        let config = dir.path().join("lazyfs.toml");
        std::fs::write(
            &config,
            format!(
                "[faults]\nfifo_path=\"{}\"\nfifo_path_completed=\"{}\"\n[cache]\napply_eviction=false\n\
                 [cache.simple]\ncustom_size=\"512mb\"\nblocks_per_page=1\n[filesystem]\nlog_all_operations=false\n\
                 logfile=\"{}\"\n",
                fifo.display(),
                done_fifo.display(),
                dir.path().join("lazyfs.log").display()
            ),
        )
        .expect("lazyfs config");
        let child = Command::new(bin)
            .arg(&mnt)
            .arg("--config-path")
            .arg(&config)
            .args(["-o", "allow_other", "-o", "modules=subdir", "-o"])
            .arg(format!("subdir={}", root.display()))
            .arg("-f")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start lazyfs");
        let mounted = wait_for(Duration::from_secs(20), || {
            let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
            (mounts.contains(&mnt.display().to_string()) && done_fifo.exists()).then_some(())
        });
        assert!(mounted.is_some(), "LazyFS did not mount on {}", mnt.display());
        // LazyFS opens the completion FIFO for writing when it starts; read it on a thread.
        let (tx, done) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let Ok(f) = std::fs::File::open(&done_fifo) else { return };
            for line in std::io::BufReader::new(f).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        LazyFs { mnt, child, fifo, done, _dir: dir }
    }

    /// Drop every write LazyFS holds that was not fsynced, and wait until it is done.
    fn clear_cache(&self) {
        let mut f = std::fs::OpenOptions::new().write(true).open(&self.fifo).expect("fault fifo");
        f.write_all(b"lazyfs::clear-cache\n").expect("send clear-cache");
        drop(f);
        let got = self.done.recv_timeout(Duration::from_secs(60)).expect("LazyFS confirms the cleared cache");
        assert_eq!(got.trim(), "finished::clear-cache");
    }
}

impl Drop for LazyFs {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3").arg("-u").arg(&self.mnt).stderr(Stdio::null()).status();
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).stderr(Stdio::null()).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A small deterministic random source (xorshift64*), seeded and printed for reruns.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// One task as the client knows it.
struct Tracked {
    kind: String,
    key: String,
    /// The id, once an answer reached the client.
    id: Option<String>,
    /// The first settled status the client saw.
    settled: Option<String>,
}

/// What a run found.
#[derive(Debug, Default)]
struct Report {
    cuts: usize,
    answered: usize,
    /// Answered tasks the daemon no longer knew after a cut.
    lost: usize,
    /// Settled outcomes a client saw that a cut changed.
    changed: usize,
    duplicate_charges: usize,
    /// Final states the ledger contradicts.
    contradictions: Vec<String>,
    /// Restarts the daemon refused (a database it would not serve).
    refused_starts: usize,
    check_clean: bool,
    /// Jobs held after a restart because the database looked older than its data directory
    /// had seen (`store::sqlite::lineage`): never with `durability = "full"`, where a power cut cannot
    /// take back a commit the sidecar noted.
    held: u64,
}

const SETTLED: &[&str] = &["succeeded", "failed", "unknown", "canceled"];

/// Start the daemon; `false` if it exited instead of listening (it refused what the cut left).
fn start(d: &mut Daemon) -> bool {
    d.spawn_process();
    let port = d.port;
    let up = wait_for(Duration::from_secs(30), || {
        if let Some(Ok(Some(_))) = d.child.as_mut().map(|c| c.try_wait()) {
            return Some(false);
        }
        std::net::TcpStream::connect(("127.0.0.1", port)).ok().map(|_| true)
    });
    if up != Some(true) {
        let how = match d.child.take() {
            Some(mut c) => match c.try_wait() {
                Ok(Some(s)) => format!("it exited ({s})"),
                _ => {
                    // Hung: take a stack-less look at where, then end it.
                    let _ = c.kill();
                    let _ = c.wait();
                    "it neither listened nor exited within 30 s".to_string()
                }
            },
            None => "it was not running".into(),
        };
        eprintln!("powerloss: the daemon did not start: {how}; stderr:\n{}", d.stderr());
        return false;
    }
    true
}

/// Cut the power: the process dies at once and the disk keeps only what was fsynced.
fn cut(d: &mut Daemon, fs: &LazyFs) {
    if let Some(mut c) = d.child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
    fs.clear_cache();
}

fn status_of(d: &Daemon, id: &str) -> Option<String> {
    let r = crate::common::try_request(
        d.port,
        "GET",
        &format!("/v1/tasks/{id}"),
        &[("Authorization", &format!("Bearer {}", d.token()))],
        None,
    )?;
    match r.status {
        200 => r.json()["status"].as_str().map(str::to_string),
        404 => Some("missing".into()),
        _ => None,
    }
}

/// Complete lines in the mock's ledger (read while it may be appending one).
fn ledger_lines(mock: &Mock) -> usize {
    std::fs::read(&mock.ledger).map(|b| b.iter().filter(|c| **c == b'\n').count()).unwrap_or(0)
}

fn charged_by_prompt(mock: &Mock) -> HashMap<String, usize> {
    let mut charged = HashMap::new();
    for line in mock.lines() {
        if line["charged"] == true
            && let Some(p) = line["prompt"].as_str()
        {
            *charged.entry(p.to_string()).or_default() += 1;
        }
    }
    charged
}

fn run(durability: &str, cuts: usize, bin: &Path) -> Report {
    let seed = env_or("TALLY_POWERLOSS_SEED", uuid::Uuid::new_v4().as_u128() as u64 | 1);
    eprintln!("powerloss {durability}: seed={seed} (TALLY_POWERLOSS_SEED to rerun)");
    let mut rng = Rng(seed);
    let fs = LazyFs::mount(bin);
    let mock = Mock::start(&["--job-duration-ms", "150", "--honor-idempotency-key"]);
    let engine = "dispatch_grace_secs = 1\nmax_attempts = 3\nbackoff_base_ms = 50\nbackoff_max_ms = 400\nrecovery_deadline_secs = 20\n";
    let mut d = Daemon::configure_with(engine, &providers(&mock));
    let data = fs.mnt.join("data");
    let text = std::fs::read_to_string(&d.config).expect("config");
    let old = format!("data_dir = \"{}\"", d.data.display());
    let new = format!("data_dir = \"{}\"\ndurability = \"{durability}\"", data.display());
    std::fs::write(&d.config, text.replace(&old, &new)).expect("config");
    d.data = data;
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-power".into()));
    assert!(start(&mut d), "the first start failed:\n{}", d.stderr());

    // Generations, and edits and cutouts (issue #35), on each kind of recovery.
    let kinds = ["openai", "replicate", "fal", "idem", "openai:edit", "kontext:edit", "photoroom:cutout"];
    let mut tasks: Vec<(String, Tracked)> = Vec::new();
    let mut report = Report::default();
    let mut n = 0;
    // One clean stop first: its checkpoint fsyncs the database file whatever the durability,
    // so the `normal` control shows what a cut loses of a shop that exists (not only that a
    // never-synced database is gone, which start-up then refuses).
    let first = submit(&d, "openai", "power warm-up", "warm-up").map(|(_, id)| id).expect("warm-up answered");
    d.wait_status(&first, SETTLED);
    assert!(d.term().success(), "clean stop");
    assert!(start(&mut d), "restart after a clean stop:\n{}", d.stderr());
    'cuts: for _ in 0..cuts {
        // A burst of submits.
        for _ in 0..1 + rng.below(4) {
            let kind = kinds[rng.below(kinds.len() as u64) as usize].to_string();
            let prompt = format!("power {n} {kind} {}", uuid::Uuid::new_v4().simple());
            let key = uuid::Uuid::new_v4().to_string();
            n += 1;
            let id = submit(&d, &kind, &prompt, &key).map(|(_, id)| id);
            tasks.push((prompt, Tracked { kind, key, id, settled: None }));
        }
        // Pick the moment.
        match rng.below(3) {
            0 => std::thread::sleep(Duration::from_millis(rng.below(600))),
            1 => {
                // Right after a paid request reached the provider.
                let before = ledger_lines(&mock);
                wait_for(Duration::from_secs(3), || (ledger_lines(&mock) > before).then_some(()));
            }
            _ => {}
        }
        // What a client sees settled now is a promise.
        for (_, t) in tasks.iter_mut().filter(|(_, t)| t.settled.is_none()) {
            if let Some(id) = &t.id
                && let Some(s) = status_of(&d, id).filter(|s| SETTLED.contains(&s.as_str()))
            {
                t.settled = Some(s);
            }
        }
        cut(&mut d, &fs);
        report.cuts += 1;
        if rng.below(3) == 0 {
            // During start-up recovery.
            if !start(&mut d) {
                report.refused_starts += 1;
                break 'cuts;
            }
            std::thread::sleep(Duration::from_millis(rng.below(150)));
            cut(&mut d, &fs);
            report.cuts += 1;
        }
        if !start(&mut d) {
            report.refused_starts += 1;
            break 'cuts;
        }
        report.held += d.call("GET", "/v1/held", None).json()["total"].as_u64().unwrap_or(0);
        // Nothing answered is gone, nothing settled has changed.
        for (prompt, t) in tasks.iter_mut() {
            let Some(id) = &t.id else { continue };
            match status_of(&d, id).as_deref() {
                Some("missing") => {
                    report.lost += 1;
                    eprintln!("powerloss {durability}: lost {id} ({prompt})");
                    t.id = None;
                    t.settled = None;
                }
                Some(now) if t.settled.as_deref().is_some_and(|s| s != now) => {
                    report.changed += 1;
                    eprintln!("powerloss {durability}: {id} was {:?}, now {now}", t.settled);
                    t.settled = Some(now.to_string());
                }
                _ => {}
            }
        }
    }

    if d.child.is_none() && !start(&mut d) {
        report.refused_starts += 1;
    }
    let running = d.child.is_some();
    if running {
        // The client resends what it never got an answer for, with the same key.
        for (prompt, t) in tasks.iter_mut().filter(|(_, t)| t.id.is_none()) {
            t.id = submit(&d, &t.kind, prompt, &t.key).map(|(_, id)| id);
        }
    }
    report.answered = tasks.iter().filter(|(_, t)| t.id.is_some()).count();
    let mut finals = HashMap::new();
    if running {
        for (prompt, t) in &tasks {
            let Some(id) = &t.id else { continue };
            let s = wait_for(Duration::from_secs(60), || status_of(&d, id).filter(|s| SETTLED.contains(&s.as_str())));
            let key = crate::common::ledger_prompt(&t.kind, prompt);
            finals.insert(key, (id.clone(), s.unwrap_or_else(|| "never settled".into())));
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let charged = charged_by_prompt(&mock);
    report.duplicate_charges = charged.values().map(|c| c.saturating_sub(1)).sum();
    for (prompt, c) in charged.iter().filter(|(_, c)| **c > 1) {
        eprintln!("powerloss {durability}: charged {c} times: {prompt}");
        for l in mock.lines().into_iter().filter(|l| l["prompt"].as_str() == Some(prompt.as_str())) {
            eprintln!("    {l}");
        }
    }
    for (prompt, (id, status)) in &finals {
        let paid = charged.get(prompt).copied().unwrap_or(0);
        let view = d.call("GET", &format!("/v1/tasks/{id}"), None).json();
        let kind = view["failure_kind"].as_str().unwrap_or("");
        let contradiction = match status.as_str() {
            "succeeded" if paid != 1 => Some(format!("succeeded, but charged {paid} times")),
            "canceled" if paid > 0 => Some("canceled, but the provider charged it".into()),
            "failed" if paid > 0 && ["not_sent", "undeliverable", "configuration"].contains(&kind) => {
                Some(format!("failed as {kind}, but the provider charged it"))
            }
            "never settled" => Some("never settled".into()),
            _ => None,
        };
        if let Some(c) = contradiction {
            report.contradictions.push(format!("{id} ({prompt}): {c}"));
        }
        if status == "succeeded" {
            let art = &view["artifacts"][0];
            let img = d.call("GET", art["url"].as_str().unwrap_or("/"), None);
            if crate::common::sha256_hex(&img.body) != art["sha256"].as_str().unwrap_or("") {
                report.contradictions.push(format!("{id}: its image does not match its sha256"));
            }
        }
    }
    if running {
        let stopped = d.term();
        let check = Command::new(EXE).args(["check", "--config"]).arg(&d.config).output().expect("check");
        report.check_clean = stopped.success() && check.status.success();
        if !report.check_clean {
            eprintln!("powerloss {durability}: stop {stopped}; check:\n{}", String::from_utf8_lossy(&check.stdout));
        }
    }
    println!(
        "powerloss {durability}: cuts={} answered={} lost={} changed={} duplicate_charges={} contradictions={} refused_starts={} check_clean={} held={}",
        report.cuts,
        report.answered,
        report.lost,
        report.changed,
        report.duplicate_charges,
        report.contradictions.len(),
        report.refused_starts,
        report.check_clean,
        report.held
    );
    report
}

#[test]
fn power_loss_with_full_durability_loses_and_double_charges_nothing() {
    let Some(bin) = available("the power-loss test") else { return };
    let started = Instant::now();
    let r = run("full", env_or("TALLY_POWERLOSS_CUTS", 12) as usize, &bin);
    eprintln!("powerloss full: {:?}", started.elapsed());
    assert_eq!(r.refused_starts, 0, "a restart refused the database a power cut left");
    assert_eq!(r.lost, 0, "answered tasks were lost");
    assert_eq!(r.changed, 0, "settled outcomes changed");
    assert_eq!(r.held, 0, "a power cut with durability = full made the database look like an older copy");
    assert!(r.contradictions.is_empty(), "states the ledger contradicts: {:#?}", r.contradictions);
    assert_eq!(r.duplicate_charges, 0, "a prompt was charged twice");
    assert!(r.contradictions.is_empty(), "states the ledger contradicts: {:#?}", r.contradictions);
    assert!(r.check_clean, "tally check failed after the run");
    assert!(r.answered > 0);
}

/// The control: with `durability = "normal"` nothing is fsynced per commit, so a cut must
/// lose something (answered tasks, settled outcomes, or the whole database) — else the
/// harness is not dropping unsynced data and the run above proves nothing.
#[test]
fn power_loss_control_with_normal_durability_loses_something() {
    let Some(bin) = available("the power-loss control") else { return };
    let r = run("normal", env_or("TALLY_POWERLOSS_CONTROL_CUTS", 4) as usize, &bin);
    assert!(
        r.lost + r.changed + r.refused_starts > 0,
        "a power cut with durability = normal lost nothing: the harness does not drop unsynced writes ({r:?})"
    );
}

/// A gauge of `GET /metrics` (`tally_sidecar_seq{state="…"}`), if the daemon reports it.
fn sidecar_seq(d: &Daemon, state: &str) -> Option<i64> {
    let r = crate::common::try_request(d.port, "GET", "/metrics", &[], None)?;
    let text = String::from_utf8_lossy(&r.body).into_owned();
    let prefix = format!("tally_sidecar_seq{{state=\"{state}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.trim().parse().ok())
}

/// Issue #43: a power cut that takes commits back from the database (`durability = "normal"`,
/// where commits are not fsynced one by one) is said where the owner looks, as a deleted WAL is
/// (`hostile3::a_lost_write_ahead_log_is_said_in_held_until_dismissed`): the sidecar's notes are
/// fsynced within a second (`store::sqlite::lineage::Syncer`), so after the cut the directory has
/// seen more than the database kept. The outside world: the mock charged the four requests,
/// they are gone from tally, and nothing is sent again.
#[test]
fn a_power_cut_that_takes_commits_back_is_said_in_held() {
    let Some(bin) = available("the power-cut lost-tail test") else { return };
    let fs = LazyFs::mount(&bin);
    let mock = Mock::start(&["--job-duration-ms", "60000"]);
    let providers = format!(
        "[[providers]]\nname = \"rep\"\nkind = \"replicate\"\nbase_url = \"{}\"\nmodel = \"acme/flux\"\n\
         api_key_env = \"TALLY_TEST_KEY\"\nmax_concurrency = 8\n",
        mock.base()
    );
    let mut d = Daemon::configure(&providers);
    let data = fs.mnt.join("data");
    let text = std::fs::read_to_string(&d.config).expect("config");
    let old = format!("data_dir = \"{}\"", d.data.display());
    let new = format!("data_dir = \"{}\"\ndurability = \"normal\"", data.display());
    std::fs::write(&d.config, text.replace(&old, &new)).expect("config");
    d.data = data;
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-power".into()));
    // A clean stop and start first, so the database file itself is on the "disk".
    assert!(start(&mut d), "first start:\n{}", d.stderr());
    assert!(d.term().success(), "clean stop");
    assert!(start(&mut d), "restart:\n{}", d.stderr());
    let mut ids = Vec::new();
    for i in 0..4 {
        let r = d.call(
            "POST",
            "/v1/tasks",
            Some(&serde_json::json!({"prompt": format!("cut tail {i}"), "provider": "rep"})),
        );
        assert_eq!(r.status, 201);
        ids.push(r.json()["id"].as_str().expect("id").to_string());
    }
    let sent = wait_for(Duration::from_secs(20), || (mock.count("cut tail").1 >= 4).then_some(()));
    assert!(sent.is_some(), "the mock was not asked for all four");
    // The sidecar has made durable what it noted after the four were sent.
    let noted = wait_for(Duration::from_secs(10), || sidecar_seq(&d, "noted")).expect("the sidecar's gauge");
    let durable = wait_for(Duration::from_secs(10), || sidecar_seq(&d, "durable").filter(|s| *s >= noted));
    assert!(durable.is_some(), "the sidecar never reported {noted} durable");
    cut(&mut d, &fs);
    assert!(start(&mut d), "start after the cut:\n{}", d.stderr());
    // The cut took the submits back: they are gone from tally…
    let gone = ids.iter().filter(|id| status_of(&d, id).as_deref() == Some("missing")).count();
    assert!(gone > 0, "the cut lost nothing, so this run proves nothing about the notice");
    // …and the owner is told, with the providers to check.
    let held = d.call("GET", "/v1/held", None).json();
    let notices = held["notices"].as_array().cloned().unwrap_or_default();
    assert_eq!(notices.len(), 1, "{held}");
    let n = &notices[0];
    assert_eq!(n["kind"], "lost_tail", "{n}");
    assert!(n["missing_commits"].as_i64().unwrap_or(0) >= 1, "{n}");
    assert_eq!(n["providers"], serde_json::json!(["rep"]), "{n}");
    let out = d.cli(&["held", "list"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("commit(s) were lost") && text.contains("rep"), "{text}");
    // Charged once each at the provider, never sent again.
    assert_eq!(mock.count("cut tail").1, 4, "nothing sent twice");
    assert!(d.term().success(), "clean stop");
}
