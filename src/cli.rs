//! The command line: one binary, clap subcommands, exit codes mapped in one place
//! ([`Exit`]), errors printed as `tally: <message>`. Client subcommands talk to the daemon
//! over HTTP ([`crate::client`]); `backup`, `check` and `token` work on files directly.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use base64::prelude::*;
use clap::{ArgGroup, Parser, Subcommand};
use serde_json::{Value, json};

use crate::app::{self, LogFormat};
use crate::client::Client;
use crate::config::Config;

/// Every exit code tally uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Everything worked (and a waited-for task succeeded).
    Ok = 0,
    /// An error: bad input, unreachable daemon, refused request, locked data dir, …
    Error = 1,
    /// The command line could not be parsed.
    Usage = 2,
    /// A waited-for task failed or was canceled.
    NotSucceeded = 3,
    /// A waited-for task ended `unknown`: its outcome cannot be confirmed.
    Unknown = 4,
    /// `check` found problems.
    Problems = 5,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e as u8)
    }
}

/// A command that did not succeed: what to print and which exit code to use.
#[derive(Debug)]
pub struct Failure {
    pub exit: Exit,
    pub message: String,
}

impl Failure {
    /// A plain error (exit code 1).
    pub fn error(message: impl Into<String>) -> Self {
        Failure { exit: Exit::Error, message: message.into() }
    }
}

/// tally runs paid AI image generation jobs and never lets a retry pay twice without you
/// knowing.
#[derive(Debug, Parser)]
#[command(name = "tally", version, about, max_term_width = 100)]
pub struct Cli {
    /// Configuration file (default: built-in defaults).
    #[arg(long, global = true, env = "TALLY_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Data directory (overrides `storage.data_dir`).
    #[arg(long, global = true, env = "TALLY_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Print the raw JSON answers, for scripts.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon (HTTP API, engine) until SIGINT or SIGTERM.
    Serve {
        /// Log format on stderr.
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
    },
    /// Submit a generation task.
    Submit {
        /// What to generate.
        prompt: String,
        /// Provider name (default: the first configured).
        #[arg(long)]
        provider: Option<String>,
        /// Makes resubmitting safe: the same key and prompt return the same task.
        #[arg(long)]
        idempotency_key: Option<String>,
        /// Wait for the result, showing progress; exit 0 only if it succeeded.
        #[arg(long)]
        wait: bool,
    },
    /// Show one task.
    Status { id: String },
    /// List tasks, newest first.
    List {
        /// Only tasks with this status (queued, waiting, running, succeeded, failed, unknown, canceled).
        #[arg(long)]
        status: Option<String>,
        /// How many (default 50, at most 500).
        #[arg(long)]
        limit: Option<usize>,
        /// Only tasks created before this task id (the `next` cursor of a previous page).
        #[arg(long)]
        before: Option<String>,
    },
    /// Cancel a task.
    Cancel { id: String },
    /// Retry a failed, unknown or canceled task as a new task.
    Retry {
        id: String,
        /// Accept that generating again may be charged again (needed when the first request
        /// may have been charged).
        #[arg(long)]
        accept_possible_charge: bool,
    },
    /// Resolve an `unknown` task by hand, as failed or with the image you found.
    #[command(group(ArgGroup::new("outcome").required(true).args(["failed", "image"])))]
    Resolve {
        id: String,
        /// You confirmed the generation failed.
        #[arg(long)]
        failed: bool,
        /// The image you found at the provider: the task becomes succeeded.
        #[arg(long, value_name = "FILE")]
        image: Option<PathBuf>,
        /// A note for the timeline.
        #[arg(long)]
        note: Option<String>,
    },
    /// Show a task's timeline.
    Events { id: String },
    /// Copy the database consistently (works while the daemon runs).
    Backup { dest: PathBuf },
    /// Verify a database (default: this data directory's); exit non-zero listing problems.
    Check { db: Option<PathBuf> },
    /// Print the API token.
    Token,
    /// Print a new one-time URL that signs a browser in to the web page (valid 15 minutes).
    SignIn,
    /// A product's image set: reference photos, a shot list, one image at a time.
    #[command(subcommand)]
    Set(SetCommand),
    /// Run the mock image provider (all three API styles) with its ledger of charges.
    MockProvider(crate::mock::MockArgs),
    /// Measure the engine end to end (see BENCHMARKS.md).
    Bench(crate::bench::BenchArgs),
}

/// `tally set …`.
#[derive(Debug, Subcommand)]
pub enum SetCommand {
    /// Upload the reference photos and create a set; one task per shot, run one at a time.
    Create {
        /// The product's name.
        #[arg(long)]
        product: String,
        /// A reference photo of the product (PNG, JPEG or WebP); repeat for several.
        #[arg(long = "ref", value_name = "FILE")]
        refs: Vec<PathBuf>,
        /// A shot as ROLE:PROMPT, ROLE one of main, selling_point, scene; repeat, in order.
        #[arg(long = "shot", value_name = "ROLE:PROMPT", required = true)]
        shots: Vec<String>,
        /// Style notes shared by every shot.
        #[arg(long)]
        style: Option<String>,
        #[arg(long)]
        provider: Option<String>,
        #[arg(long)]
        idempotency_key: Option<String>,
        /// Wait until every shot is settled, showing per-shot progress.
        #[arg(long)]
        wait: bool,
    },
    /// Show a set and its shots.
    Status { id: String },
    /// Cancel the shots not yet sent; a running shot finishes and is kept.
    Cancel { id: String },
}

/// Parse the command line and run it; print errors as `tally: <message>`.
pub fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(f) => {
            eprintln!("tally: {}", f.message);
            f.exit.into()
        }
    }
}

/// Parse the command line and run one subcommand.
pub fn run() -> Result<ExitCode, Failure> {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return Ok(if e.use_stderr() { Exit::Usage.into() } else { Exit::Ok.into() });
        }
    };
    if let Command::Bench(args) = cli.command {
        crate::bench::run(args).map_err(Failure::error)?;
        return Ok(Exit::Ok.into());
    }
    if let Command::MockProvider(args) = cli.command {
        runtime()?.block_on(crate::mock::run(args)).map_err(|e| Failure::error(format!("mock provider: {e}")))?;
        return Ok(Exit::Ok.into());
    }
    let cfg = app::load_config(cli.config.as_deref(), cli.data_dir.as_deref())?;
    let json = cli.json;
    match cli.command {
        Command::Backup { dest } => backup(&cfg, &dest),
        Command::Check { db } => check(&cfg, db.as_deref()),
        Command::Token => token(&cfg),
        Command::Serve { log_format } => {
            // Crash points (DESIGN §9) read FAILPOINTS in builds with the `failpoints` feature.
            #[cfg(feature = "failpoints")]
            let _failpoints = fail::FailScenario::setup();
            app::init_logging(log_format);
            runtime()?.block_on(app::serve(cfg))?;
            Ok(Exit::Ok.into())
        }
        other => runtime()?.block_on(client_command(&cfg, other, json)),
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::error(format!("cannot start the async runtime: {e}")))
}

/// Percent-encode an id for use as one path segment.
fn seg(id: &str) -> String {
    id.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn print_json(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string()));
}

fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

async fn client_command(cfg: &Config, cmd: Command, json: bool) -> Result<ExitCode, Failure> {
    let client = Client::new(cfg)?;
    match cmd {
        Command::Submit { prompt, provider, idempotency_key, wait } => {
            let mut body = json!({ "prompt": prompt });
            if let Some(p) = provider {
                body["provider"] = json!(p);
            }
            if let Some(k) = idempotency_key {
                body["idempotency_key"] = json!(k);
            }
            let task = client.post("/v1/tasks", &body).await?.into_ok()?;
            if !wait {
                show_task(cfg, &client, &task, json);
                return Ok(Exit::Ok.into());
            }
            wait_for(cfg, &client, task, json).await
        }
        Command::Set(cmd) => set_command(&client, cmd, json).await,
        Command::Status { id } => {
            let task = client.get(&format!("/v1/tasks/{}", seg(&id))).await?.into_ok()?;
            show_task(cfg, &client, &task, json);
            Ok(Exit::Ok.into())
        }
        Command::List { status, limit, before } => {
            let mut q = Vec::new();
            if let Some(s) = status {
                q.push(format!("status={}", seg(&s)));
            }
            if let Some(n) = limit {
                q.push(format!("limit={n}"));
            }
            if let Some(b) = before {
                q.push(format!("before={}", seg(&b)));
            }
            let path = if q.is_empty() { "/v1/tasks".to_string() } else { format!("/v1/tasks?{}", q.join("&")) };
            let page = client.get(&path).await?.into_ok()?;
            if json {
                print_json(&page);
            } else {
                let tasks = page.get("tasks").and_then(Value::as_array).cloned().unwrap_or_default();
                if tasks.is_empty() {
                    println!("no tasks");
                }
                for t in &tasks {
                    let prompt: String = s(t, "prompt").chars().take(50).collect();
                    println!("{}  {:<9}  {}  {}", s(t, "id"), s(t, "status"), s(t, "created_at"), prompt);
                }
                if let Some(next) = page.get("next").and_then(Value::as_str) {
                    println!("more: tally list --before {next}");
                }
            }
            Ok(Exit::Ok.into())
        }
        Command::Cancel { id } => {
            let task = client.post(&format!("/v1/tasks/{}/cancel", seg(&id)), &json!({})).await?.into_ok()?;
            show_task(cfg, &client, &task, json);
            Ok(Exit::Ok.into())
        }
        Command::Retry { id, accept_possible_charge } => {
            let body = json!({ "acknowledge_possible_charge": accept_possible_charge });
            let answer = client.post(&format!("/v1/tasks/{}/retry", seg(&id)), &body).await?;
            if answer.error_code() == Some("cost_acknowledgement_required") {
                let msg = answer.into_ok().err().map(|f| f.message).unwrap_or_default();
                return Err(Failure::error(format!("{msg}\nRun again with --accept-possible-charge to retry anyway.")));
            }
            let task = answer.into_ok()?;
            if !json {
                println!("retried as a new task:");
            }
            show_task(cfg, &client, &task, json);
            Ok(Exit::Ok.into())
        }
        Command::Resolve { id, failed, image, note } => {
            let mut body = json!({ "outcome": if failed { "failed" } else { "succeeded" } });
            if let Some(path) = image {
                let bytes = std::fs::read(&path)
                    .map_err(|e| Failure::error(format!("cannot read the image {}: {e}", path.display())))?;
                body["image_base64"] = json!(BASE64_STANDARD.encode(bytes));
            }
            if let Some(n) = note {
                body["note"] = json!(n);
            }
            let task = client.post(&format!("/v1/tasks/{}/resolve", seg(&id)), &body).await?.into_ok()?;
            show_task(cfg, &client, &task, json);
            Ok(Exit::Ok.into())
        }
        Command::SignIn => {
            let answer = client.post("/v1/session/sign-in-url", &json!({})).await?.into_ok()?;
            if json {
                print_json(&answer);
            } else {
                println!("{}", s(&answer, "url"));
            }
            Ok(Exit::Ok.into())
        }
        Command::Events { id } => {
            let page = client.get(&format!("/v1/tasks/{}/events", seg(&id))).await?.into_ok()?;
            if json {
                print_json(&page);
            } else {
                for e in page.get("events").and_then(Value::as_array).cloned().unwrap_or_default() {
                    println!("{}  {:<10}  {:<16}  {}", s(&e, "at"), s(&e, "actor"), s(&e, "kind"), s(&e, "message"));
                }
            }
            Ok(Exit::Ok.into())
        }
        Command::Serve { .. }
        | Command::Backup { .. }
        | Command::Check { .. }
        | Command::Token
        | Command::MockProvider(_)
        | Command::Bench(_) => Err(Failure::error("internal: not a client command")),
    }
}

/// Print a task for people (or its JSON).
fn show_task(cfg: &Config, client: &Client, t: &Value, json: bool) {
    if json {
        print_json(t);
        return;
    }
    println!("task      {}", s(t, "id"));
    println!("status    {}", s(t, "status"));
    println!("message   {}", s(t, "message"));
    println!("provider  {}", s(t, "provider"));
    println!("prompt    {}", s(t, "prompt"));
    println!("attempts  {}", t.get("attempts").and_then(Value::as_i64).unwrap_or(0));
    println!("created   {}", s(t, "created_at"));
    println!("updated   {}", s(t, "updated_at"));
    if let Some(r) = t.get("retry_of").and_then(Value::as_str) {
        println!("retry of  {r}");
    }
    for a in t.get("artifacts").and_then(Value::as_array).cloned().unwrap_or_default() {
        print_artifact(cfg, client, &a);
    }
    if let Some(note) = t.get("billing_note").and_then(Value::as_str) {
        println!("billing   {note}");
    }
    if t.pointer("/retry/allowed").and_then(Value::as_bool) == Some(true) {
        println!("retry     {}", t.pointer("/retry/note").and_then(Value::as_str).unwrap_or(""));
    }
}

fn print_artifact(cfg: &Config, client: &Client, a: &Value) {
    println!(
        "image     sha256 {}  ({} bytes, {})",
        s(a, "sha256"),
        a.get("bytes").and_then(Value::as_i64).unwrap_or(0),
        s(a, "media_type")
    );
    let file = cfg.storage.data_dir.join(s(a, "path"));
    if file.is_file() {
        println!("file      {}", file.display());
    }
    println!("url       {}{}", client.base(), s(a, "url"));
}

/// Poll a task every 250 ms, printing each status change, until it settles.
async fn wait_for(cfg: &Config, client: &Client, mut task: Value, json: bool) -> Result<ExitCode, Failure> {
    let id = s(&task, "id").to_string();
    let mut last = String::new();
    loop {
        let status = s(&task, "status").to_string();
        if status != last {
            let line = format!("{id}: {status} — {}", s(&task, "message"));
            if json {
                eprintln!("{line}");
            } else {
                println!("{line}");
                let _ = std::io::stdout().flush();
            }
            last = status.clone();
        }
        let exit = match status.as_str() {
            "succeeded" => Some(Exit::Ok),
            "failed" | "canceled" => Some(Exit::NotSucceeded),
            "unknown" => Some(Exit::Unknown),
            _ => None,
        };
        if let Some(exit) = exit {
            if json {
                print_json(&task);
            } else {
                for a in task.get("artifacts").and_then(Value::as_array).cloned().unwrap_or_default() {
                    print_artifact(cfg, client, &a);
                }
                if exit != Exit::Ok {
                    show_task(cfg, client, &task, false);
                }
            }
            return Ok(exit.into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        task = client.get(&format!("/v1/tasks/{}", seg(&id))).await?.into_ok()?;
    }
}

/// `tally backup DEST`: a consistent copy of this data directory's database.
fn backup(cfg: &Config, dest: &Path) -> Result<ExitCode, Failure> {
    let src = cfg.db_path();
    if !src.is_file() {
        return Err(Failure::error(format!("there is no database at {}", src.display())));
    }
    let dest = if dest.is_dir() { dest.join("tally.db") } else { dest.to_path_buf() };
    if app::same_file(&src, &dest) {
        return Err(Failure::error("the backup destination is the database itself"));
    }
    crate::store::backup(&src, &dest).map_err(|e| Failure::error(format!("backup failed: {e}")))?;
    println!("backed up {} to {}", src.display(), dest.display());
    Ok(Exit::Ok.into())
}

/// `tally check [DB]`: verify a database; artifact files too when they are beside it.
fn check(cfg: &Config, db: Option<&Path>) -> Result<ExitCode, Failure> {
    let own = cfg.db_path();
    let db = db.map(Path::to_path_buf).unwrap_or_else(|| own.clone());
    if !db.is_file() {
        return Err(Failure::error(format!("there is no database at {}", db.display())));
    }
    let data_dir = if app::same_file(&db, &own) {
        Some(cfg.storage.data_dir.clone())
    } else {
        db.parent().filter(|p| p.join("artifacts").is_dir()).map(Path::to_path_buf)
    };
    let problems = crate::store::check(&db, data_dir.as_deref())
        .map_err(|e| Failure::error(format!("cannot check {}: {e}", db.display())))?;
    if problems.is_empty() {
        let files = if data_dir.is_some() { " (artifact files verified)" } else { "" };
        println!("ok: {} passed every check{files}", db.display());
        return Ok(Exit::Ok.into());
    }
    for p in &problems {
        println!("problem: {p}");
    }
    Err(Failure { exit: Exit::Problems, message: format!("{} problem(s) found in {}", problems.len(), db.display()) })
}

/// `tally token`: print the API token.
fn token(cfg: &Config) -> Result<ExitCode, Failure> {
    let path = cfg.token_path();
    let t = crate::api::auth::read_token(&path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Failure::error(format!("no API token at {} yet; start `tally serve` once to create it", path.display()))
        } else {
            Failure::error(format!("cannot read the API token {}: {e}", path.display()))
        }
    })?;
    println!("{t}");
    Ok(Exit::Ok.into())
}

/// Parse `ROLE:PROMPT`.
fn parse_shot(s: &str) -> Result<Value, Failure> {
    let (role, prompt) = s
        .split_once(':')
        .ok_or_else(|| Failure { exit: Exit::Usage, message: format!("--shot `{s}`: write it as ROLE:PROMPT") })?;
    Ok(json!({ "role": role.trim(), "prompt": prompt.trim() }))
}

async fn set_command(client: &Client, cmd: SetCommand, json_out: bool) -> Result<ExitCode, Failure> {
    match cmd {
        SetCommand::Create { product, refs, shots, style, provider, idempotency_key, wait } => {
            let shots = shots.iter().map(|s| parse_shot(s)).collect::<Result<Vec<_>, _>>()?;
            let mut references = Vec::new();
            for path in &refs {
                let bytes =
                    std::fs::read(path).map_err(|e| Failure::error(format!("cannot read {}: {e}", path.display())))?;
                let ct = crate::providers::sniff_image(&bytes)
                    .ok_or_else(|| Failure::error(format!("{} is not a PNG, JPEG or WebP image", path.display())))?;
                let up = client.post_bytes("/v1/uploads", ct, bytes).await?.into_ok()?;
                references.push(up["id"].clone());
            }
            let mut body = json!({ "product": product, "references": references, "shots": shots });
            for (k, v) in [("style", style), ("provider", provider), ("idempotency_key", idempotency_key)] {
                if let Some(v) = v {
                    body[k] = json!(v);
                }
            }
            let set = client.post("/v1/sets", &body).await?.into_ok()?;
            if !wait {
                show_set(&set, json_out);
                return Ok(Exit::Ok.into());
            }
            let id = set["id"].as_str().unwrap_or_default().to_string();
            let mut last = String::new();
            loop {
                let set = client.get(&format!("/v1/sets/{}", seg(&id))).await?.into_ok()?;
                let line = set_progress_line(&set);
                if line != last {
                    eprintln!("{line}");
                    last = line;
                }
                if set["status"] != "running" {
                    show_set(&set, json_out);
                    return Ok(if set["status"] == "done" { Exit::Ok } else { Exit::NotSucceeded }.into());
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        SetCommand::Status { id } => {
            let set = client.get(&format!("/v1/sets/{}", seg(&id))).await?.into_ok()?;
            show_set(&set, json_out);
            Ok(Exit::Ok.into())
        }
        SetCommand::Cancel { id } => {
            let set = client.post(&format!("/v1/sets/{}/cancel", seg(&id)), &json!({})).await?.into_ok()?;
            show_set(&set, json_out);
            Ok(Exit::Ok.into())
        }
    }
}

/// One line of per-shot progress: `3 of 5 done — [✓ main] [✓ selling_point] [… scene] …`.
fn set_progress_line(set: &Value) -> String {
    let shots: Vec<String> = set["shots"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| {
                    let mark = match s["status"].as_str().unwrap_or("") {
                        "succeeded" => "done",
                        "running" => "generating",
                        "unknown" => "UNKNOWN",
                        "failed" => "failed",
                        "canceled" => "canceled",
                        _ => "waiting",
                    };
                    format!("{}: {mark}", s["role"].as_str().unwrap_or("shot"))
                })
                .collect()
        })
        .unwrap_or_default();
    format!("{} — {}", set["progress"].as_str().unwrap_or(""), shots.join(", "))
}

fn show_set(set: &Value, json_out: bool) {
    if json_out {
        println!("{set}");
        return;
    }
    println!(
        "set {}  {}  ({})",
        set["id"].as_str().unwrap_or(""),
        set["status"].as_str().unwrap_or(""),
        set["product"].as_str().unwrap_or("")
    );
    println!("  {}", set["progress"].as_str().unwrap_or(""));
    println!("  {}", set["message"].as_str().unwrap_or(""));
    for s in set["shots"].as_array().into_iter().flatten() {
        let art = s["artifacts"][0]["url"].as_str().map(|u| format!("  {u}")).unwrap_or_default();
        println!(
            "  {:>2}. {:<13} {:<9} {}{art}",
            s["position"].as_i64().unwrap_or(0) + 1,
            s["role"].as_str().unwrap_or(""),
            s["status"].as_str().unwrap_or(""),
            s["id"].as_str().unwrap_or("")
        );
        if s["status"] == "unknown" {
            println!("      {}", s["message"].as_str().unwrap_or(""));
        }
    }
}
