//! The command line: one binary, clap subcommands, exit codes mapped in one place
//! ([`Exit`]), errors printed as `tally: <message>`. Client subcommands talk to the daemon
//! over HTTP ([`crate::client`]); `backup`, `check` and `token` work on files directly.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgGroup, Parser, Subcommand};
use serde_json::Value;

mod files;
mod sets;
mod spend;
mod tasks;

use files::{backup, check, token};
use tasks::client_command;

use crate::app::{self, LogFormat};

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
        /// Only the tasks that need you: unknown, and neither resolved nor retried yet.
        #[arg(long)]
        needs_attention: bool,
    },
    /// Cancel a task.
    Cancel { id: String },
    /// Retry a failed, unknown or canceled task as a new task.
    Retry {
        id: String,
        /// Accept that generating again may be charged again (needed when a request of the
        /// task was possibly charged or charged).
        #[arg(long)]
        accept_possible_charge: bool,
        /// Retry a task that was already retried: name its latest retry, to show you mean a
        /// second new task (needed once the task has a retry).
        #[arg(long, value_name = "RETRY_ID")]
        acknowledge_retried_as: Option<String>,
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
    /// What was spent: charged and possibly charged requests with their estimated cost,
    /// refusals, and how much of each budget is used.
    Spend {
        /// From this UTC date (2026-12-01) or RFC 3339 time; default: the beginning.
        #[arg(long)]
        from: Option<String>,
        /// Up to this UTC date (included) or RFC 3339 time (excluded); default: now.
        #[arg(long)]
        to: Option<String>,
        /// Rows per day, month or provider.
        #[arg(long, value_enum, default_value_t = spend::By::Day)]
        by: spend::By,
        /// Print every paid request as CSV (time, task, provider, model, state, estimated
        /// cost, currency), for the accounts.
        #[arg(long)]
        csv: bool,
    },
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
            runtime()?.block_on(app::serve(cfg, cli.config.clone()))?;
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
pub(super) fn seg(id: &str) -> String {
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

pub(super) fn print_json(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string()));
}

pub(super) fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}
