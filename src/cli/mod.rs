//! The command line: one binary, clap subcommands, exit codes mapped in one place
//! ([`Exit`]), errors printed as `tally: <message>`. Client subcommands talk to the daemon
//! over HTTP ([`client`]); `backup`, `check`, `restore` and `token` work on the
//! database file directly.
//!
//! Words: the CLI and the web page call the unit of work a **job** (the API's resource name
//! for it is a *task*, `/v1/tasks`). Text that came from a prompt, a provider or the daemon is
//! printed through [`term_safe`], so it cannot move the cursor or recolour the terminal.
//!
//! A little over 600 lines: the clap command tree (every subcommand with its flags and help) is
//! declared here whole, so `tally --help` is read from one place; larger argument sets live
//! beside their commands (`set_edit`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgGroup, Parser, Subcommand};
use serde_json::Value;

pub mod client;
mod deliveries;
mod drafts;
mod files;
mod held;
mod provider;
mod say;
mod service;
pub mod set_edit;
mod sets;
mod spend;
mod tasks;
mod times;

use files::{backup, check, prune, restore, token};
use tasks::client_command;

use crate::app::{self, LogFormat};

pub use crate::app::{Exit, Failure};

/// tally runs paid AI image generation jobs and never lets a retry pay twice without you
/// knowing.
#[derive(Debug, Parser)]
#[command(
    name = "tally",
    version,
    about,
    max_term_width = 100,
    after_help = "Exit codes: 0 ok; 1 error; 2 bad command line; 3 a waited-for job failed or was canceled; \
                  4 a waited-for job ended unknown; 5 `check` found problems; 130 Ctrl-C stopped a wait \
                  (the job keeps running)."
)]
#[allow(missing_docs)]
pub struct Cli {
    // The environment variables are read by `run`, not by clap: clap would name an argument
    // taken from the environment in every usage line, as if it had been typed.
    /// Configuration file (default: $TALLY_CONFIG, else built-in defaults).
    #[arg(long, global = true, value_name = "FILE", display_order = 900)]
    pub config: Option<PathBuf>,
    /// Data directory, overriding `storage.data_dir` (default: $TALLY_DATA_DIR).
    #[arg(long, global = true, value_name = "DIR", display_order = 901)]
    pub data_dir: Option<PathBuf>,
    /// Print the raw JSON answers, for scripts.
    #[arg(long, global = true, display_order = 902)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon (HTTP API, web page, engine) until SIGINT or SIGTERM.
    Serve {
        /// Listen on this address instead of `server.listen` (e.g. 127.0.0.1:7801). Other
        /// commands using the same data directory find it there.
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
        /// Log format on stderr.
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
        /// Do not open the sign-in link in the default browser. (It is opened only in a
        /// desktop session, never when run as a service.)
        #[arg(long)]
        no_browser: bool,
        /// Listen on this computer's address on the shop's network too (as well as loopback),
        /// so that a phone on the same Wi-Fi can use the page once paired (`tally sign-in
        /// --qr`). Same as `server.lan = true`.
        #[arg(long)]
        lan: bool,
    },
    /// Providers added without editing the config file: list, add, edit, remove, test.
    #[command(subcommand)]
    Provider(provider::ProviderCommand),
    /// Run tally with the computer: install, uninstall or check a per-user service.
    #[command(subcommand)]
    Service(service::ServiceCommand),
    /// Submit an image generation job.
    #[command(after_help = "With --wait the exit code says how it ended: 0 the image is ready; 3 failed or \
                            canceled; 4 unknown (it may have been charged: check the provider, then \
                            `tally resolve`); 130 Ctrl-C stopped waiting (the job keeps running).")]
    Submit {
        /// What the image should show (for `--operation edit`, the instruction; a cutout
        /// takes none).
        prompt: Option<String>,
        /// What the call makes: generate (default), edit or cutout.
        #[arg(long, value_name = "OPERATION")]
        operation: Option<String>,
        /// The image an edit or cutout works on: the id of an image, of an uploaded photo or
        /// of a job (its image), or a file to upload first.
        #[arg(long, value_name = "ID|FILE")]
        image: Option<String>,
        /// Provider name (default: the first configured).
        #[arg(long, value_name = "NAME")]
        provider: Option<String>,
        /// Makes resubmitting safe: the same key and prompt return the same job.
        #[arg(long, value_name = "KEY")]
        idempotency_key: Option<String>,
        /// Jobs of one group take turns with other jobs: a big batch submitted with a group
        /// does not hold back a single job submitted meanwhile.
        #[arg(long, value_name = "NAME")]
        group: Option<String>,
        /// Wait for the result, showing progress; exit 0 only if the image is ready.
        #[arg(long)]
        wait: bool,
    },
    /// Show one job.
    Status {
        /// The job's id (from `tally submit` or `tally list`).
        id: String,
    },
    /// List jobs, newest first.
    List {
        /// Only jobs with this status (queued, waiting, running, succeeded, failed, unknown, canceled).
        #[arg(long)]
        status: Option<String>,
        /// How many (default 50, at most 500).
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        /// Only jobs created before this job id (the `more:` line of a previous page).
        #[arg(long, value_name = "ID")]
        before: Option<String>,
        /// Only the tasks that need you: unknown and neither resolved nor retried yet, or held
        /// (`tally held list`).
        #[arg(long)]
        needs_attention: bool,
        /// Only jobs whose prompt, or whose image set's product, contains TEXT.
        #[arg(long, value_name = "TEXT")]
        search: Option<String>,
    },
    /// Cancel a job that has not finished (one already sent to the provider finishes and is kept).
    Cancel {
        /// The job's id.
        id: String,
    },
    /// Retry a failed, unknown or canceled job as a new job.
    Retry {
        /// The id of the job to generate again.
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
    /// Resolve an `unknown` job by hand, as failed or with the image you found.
    #[command(group(ArgGroup::new("outcome").required(true).args(["failed", "image"])))]
    Resolve {
        /// The id of the unknown job.
        id: String,
        /// You confirmed at the provider that the generation failed.
        #[arg(long)]
        failed: bool,
        /// The image you found at the provider: the job becomes succeeded.
        #[arg(long, value_name = "FILE")]
        image: Option<PathBuf>,
        /// What the provider's dashboard shows about the charge: the job's charge, `tally
        /// spend` and the CSV then follow your record (marked as recorded by hand).
        #[arg(long, value_enum, value_name = "CHARGE")]
        charge: Option<ChargeRecord>,
        /// A note for the timeline.
        #[arg(long)]
        note: Option<String>,
    },
    /// Show a job's timeline: what happened, when, and who did it.
    Events {
        /// The job's id.
        id: String,
    },
    /// What was spent: charged and possibly charged requests with their estimated cost,
    /// refusals, and how much of each budget is used.
    Spend {
        /// From this date (2026-12-01, in [ui] time_zone) or RFC 3339 time; default: the beginning.
        #[arg(long, value_name = "DATE")]
        from: Option<String>,
        /// Up to this date (in [ui] time_zone, included) or RFC 3339 time (excluded); default: now.
        #[arg(long, value_name = "DATE")]
        to: Option<String>,
        /// Rows per day, month or provider.
        #[arg(long, value_enum, default_value_t = spend::By::Day)]
        by: spend::By,
        /// Print every paid request as CSV (time, task, provider, model, state, estimated
        /// cost, currency), for the accounts.
        #[arg(long)]
        csv: bool,
    },
    /// Show or change the budget: daily and monthly limits, for all providers or one.
    #[command(subcommand)]
    Budget(BudgetCommand),
    /// Show or set the shop's time zone (also in the page's Settings): budget days and months
    /// begin at its midnight, and the page and the CLI show times in it.
    TimeZone {
        /// An IANA name such as Asia/Shanghai; without one, the zone in force is shown.
        #[arg(value_name = "NAME", conflicts_with = "reset")]
        name: Option<String>,
        /// Go back to the configuration's zone ([ui] time_zone, else the computer's).
        #[arg(long)]
        reset: bool,
    },
    /// Write one self-contained copy of the shop's work: every job, image and reference photo.
    ///
    /// Works while `tally serve` runs: the copy is one consistent snapshot (SQLite's `VACUUM
    /// INTO`, which does not start over when the daemon commits), checked (every image against
    /// its sha256) under a temporary name and only then renamed to DEST. DEST must be outside
    /// the data directory. One backup to DEST at a time: a second one is refused ("another
    /// backup to DEST is running"). On any failure (a full disk included) no temporary file
    /// is left beside DEST. Without the daemon, copying tally.db after `tally serve` has stopped
    /// is just as good: a clean stop leaves it one self-contained file.
    ///
    /// With `[storage] backend = "postgres"` it copies nothing and says how to use pg_dump.
    #[command(verbatim_doc_comment)]
    Backup {
        /// Where to write the copy (a file, or a directory to put `tally.db` in); replaced if
        /// it exists.
        dest: PathBuf,
    },
    /// Verify a database: SQLite's integrity check, tally's invariants, and every stored image
    /// against its sha256; prints how many were verified; exits 5 listing problems.
    Check {
        /// The database file to check (default: this data directory's `tally.db`).
        db: Option<PathBuf>,
    },
    /// Restore a backup (SRC) as this data directory's database (stop `tally serve` first).
    ///
    /// Checks SRC like `tally check` first and changes nothing if it fails. Then copies it in
    /// as one file, keeps a database already there (its WAL folded in) as
    /// tally.db.before-restore-<UTC time>, e.g. tally.db.before-restore-20261201T224512Z (every
    /// restore keeps its own, never overwriting one; it prints the name), and removes stale
    /// tally.db-wal and tally.db-shm files (an old WAL must never meet a new database).
    /// Refused while a daemon uses the data directory. Copying a backup to tally.db by hand
    /// also works, after `tally serve` has stopped, if you delete tally.db-wal and
    /// tally.db-shm beside it.
    ///
    /// Queued and in-flight work: a backup is older than the daemon it came from, which may
    /// have sent its queued jobs since. When `tally serve` starts on a restored backup (or on
    /// any copy older than what this data directory has seen, tally.db.seen), nothing that was
    /// not settled in it is sent on its own: queued jobs, and jobs claimed but not yet sent,
    /// are held (`tally held list`; `tally held release ID...` or `--all` sends them, each
    /// possibly a second charge); jobs whose request had already left are recovered as after
    /// a crash (replayed with their idempotency key or looked up where the provider can,
    /// otherwise unknown), never sent blind. This command prints how many jobs would be held.
    /// At start-up (and on `tally held check`) a held job is looked up at its provider where
    /// the provider can show it (a listing that shows a mark of the job): one found
    /// there is fetched, not sent again; the others stay held, saying what the look found.
    /// A tally.db copied after a clean stop, never seen here, holds nothing.
    #[command(verbatim_doc_comment)]
    Restore {
        /// The backup file (made by `tally backup`, or a tally.db copied after a clean stop).
        src: PathBuf,
    },
    /// Delete settled jobs older than an age, with their images, executions and events.
    ///
    /// Never a job whose outcome is unknown and that nobody has resolved, never a shot of a
    /// set that is still in progress (a set goes whole or not at all), never a job a kept job
    /// is a retry of. Age is when a job last changed (settled, resolved). Works while `tally
    /// serve` runs (through its API) and without it (on the file). The freed space is given
    /// back to the file system. Make a `tally backup` first if you may want the images again.
    #[command(verbatim_doc_comment)]
    Prune {
        /// The age: `90d`, `12h`, `30m`, `0s` (everything settled).
        #[arg(long, value_name = "AGE")]
        older_than: String,
        /// Only say what would be deleted.
        #[arg(long)]
        dry_run: bool,
    },
    /// Print the API token.
    Token,
    /// Print a new one-time URL that signs a browser in to the web page (valid 15 minutes).
    /// A browser stays signed in across restarts of the daemon, until 30 days without use.
    /// With `--qr`, pair a phone instead: a QR code drawn here, a link and a short code, valid
    /// 10 minutes and once (start the daemon with `--lan` so that a phone can reach it).
    SignIn {
        /// Draw a QR code of a pairing link for a phone's camera, with its short code.
        #[arg(long)]
        qr: bool,
    },
    /// Sign browsers out of the web page.
    #[command(group(ArgGroup::new("whom").required(true).args(["all"])))]
    SignOut {
        /// End every browser's session (each then needs a new link from `tally sign-in`).
        #[arg(long)]
        all: bool,
    },
    /// A product's image set: reference photos, a shot list, one shot after another.
    #[command(subcommand)]
    Set(SetCommand),
    /// A draft from the product's photos: a plan of shots and listing copy a provider
    /// proposes, which you edit and confirm; only a confirmation creates the image set.
    #[command(subcommand)]
    Draft(drafts::DraftCommand),
    /// Jobs held, not sent, because the database was older than what this data directory had
    /// seen (a restored backup, a copy taken while tally ran, a deleted tally.db-wal): each may
    /// have been sent already by the daemon the copy came from.
    #[command(subcommand)]
    Held(held::HeldCommand),
    /// A set's delivery: its files at a target, each delivered, failed or unknown.
    #[command(subcommand)]
    Delivery(deliveries::DeliveryCommand),
    /// Run the mock image provider (the API style of every provider kind) with its ledger of charges.
    MockProvider(crate::mock::MockArgs),
    /// Measure the engine end to end (see BENCHMARKS.md).
    Bench(crate::bench::BenchArgs),
}

/// `tally resolve --charge`: what the provider's dashboard shows about the charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ChargeRecord {
    /// The dashboard shows a charge.
    Charged,
    /// The dashboard shows no charge.
    NotCharged,
    /// You could not tell (the default: it stays possibly charged).
    Unknown,
}

impl ChargeRecord {
    /// The API's word.
    pub fn as_str(self) -> &'static str {
        match self {
            ChargeRecord::Charged => "charged",
            ChargeRecord::NotCharged => "not_charged",
            ChargeRecord::Unknown => "unknown",
        }
    }
}

/// `tally budget …`.
#[derive(Debug, Subcommand)]
pub enum BudgetCommand {
    /// The limits in force, where they come from (the config file or set here), and what
    /// today and this month have used.
    Show,
    /// Set, raise or remove limits, at once and kept across restarts (they replace the config
    /// file's `[budget]` until `tally budget reset`). AMOUNT is a number in the budget's
    /// currency, or `none` to remove that limit.
    #[command(group(ArgGroup::new("limit").required(true).multiple(true).args(["daily", "monthly"])))]
    Set {
        /// The daily limit (days of [ui] time_zone), or `none`.
        #[arg(long, value_name = "AMOUNT")]
        daily: Option<String>,
        /// The monthly limit (months of [ui] time_zone), or `none`.
        #[arg(long, value_name = "AMOUNT")]
        monthly: Option<String>,
        /// Only this provider's limits (default: the whole daemon's).
        #[arg(long, value_name = "NAME")]
        provider: Option<String>,
    },
    /// Forget the limits set with `tally budget set` (or in the page): the config file's
    /// `[budget]` applies again.
    Reset,
}

/// `tally set …`.
#[derive(Debug, Subcommand)]
pub enum SetCommand {
    /// Upload the reference photos and create a set; one job per candidate, the shots one after
    /// another, the candidates of a shot together.
    #[command(after_help = "With --wait the exit code says how the set ended: 0 every shot's image is ready; \
                            3 a shot failed or was canceled; 4 a shot ended unknown (it may have been \
                            charged); 130 Ctrl-C stopped waiting (the set keeps running).")]
    Create {
        /// The product's name.
        #[arg(long)]
        product: String,
        /// A reference photo of the product (PNG, JPEG or WebP); repeat for several.
        #[arg(long = "ref", value_name = "FILE")]
        refs: Vec<PathBuf>,
        /// A shot as ROLE:PROMPT, ROLE one of main, selling_point, scene, detail, size; repeat, in order.
        /// `main_white:@PHOTO` makes a white main image from that photo of the real product (cut
        /// out, then composed on pure white when delivered).
        #[arg(long = "shot", value_name = "ROLE:PROMPT", required = true)]
        shots: Vec<String>,
        /// Words tally draws on a shot's image, as SHOT:TEMPLATE:LINE (SHOT a role, or #N for
        /// the shot's number from 0; templates: `GET /v1/overlays`); repeat to add lines.
        #[arg(long = "overlay", value_name = "SHOT:TEMPLATE:LINE")]
        overlays: Vec<String>,
        /// Style notes shared by every shot.
        #[arg(long)]
        style: Option<String>,
        /// How many candidate images to make per shot, 1 to 4 (each is its own job; choose
        /// one per shot with `tally set choose`).
        #[arg(long, value_name = "N", default_value_t = 1)]
        candidates: u32,
        /// Provider name (default: the first configured).
        #[arg(long, value_name = "NAME")]
        provider: Option<String>,
        /// Makes resubmitting safe: the same key and set return the same set.
        #[arg(long, value_name = "KEY")]
        idempotency_key: Option<String>,
        /// Wait until every shot is settled, showing per-shot progress.
        #[arg(long)]
        wait: bool,
    },
    /// List image sets, newest first.
    List {
        /// How many (default 20, at most 500).
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        /// Only sets created before this set id (the `more:` line of a previous page).
        #[arg(long, value_name = "ID")]
        before: Option<String>,
    },
    /// Show a set and its shots, and why it cannot be delivered yet.
    Status {
        /// The set's id (from `tally set create` or `tally set list`).
        id: String,
        /// Also say which chosen images are too small for this delivery profile (amazon,
        /// shopify, etsy, taobao, original, or one of [[delivery.profiles]]).
        #[arg(long, value_name = "PROFILE")]
        profile: Option<String>,
    },
    /// Save every finished image of a set into a folder, named like `red-sneaker_main.png`.
    ///
    /// Each image is checked against the sha256 the set records. Images the daemon found
    /// damaged are left out of its zip: their names are printed, a NOT-INCLUDED.txt is saved
    /// with the rest, and the exit code is 5.
    Download {
        /// The set's id.
        id: String,
        /// The folder to write the images to (default: a new folder named after the product).
        dir: Option<PathBuf>,
    },
    /// Cancel the shots not yet sent; a running shot finishes and is kept.
    Cancel {
        /// The set's id.
        id: String,
    },
    /// Change a set before anything was sent for what the change touches: a shot's prompt or
    /// role; the product and style (in every shot's request: only while nothing of the set was
    /// sent); the reference photos (only while no request of the set left).
    Edit(set_edit::EditArgs),
    /// Make a copy to edit of a set (same product, style, reference photos and shots): it
    /// sends nothing until `tally set start COPY` (or --start).
    Duplicate(set_edit::DuplicateArgs),
    /// Start generating a copy made by `tally set duplicate` (its first shot is queued).
    Start(set_edit::StartArgs),
    /// Delete a set whose every shot failed or was canceled, or a copy never started. Jobs of
    /// it whose request reached the provider stay as jobs of their own, so `tally spend` still
    /// lists them.
    Delete(set_edit::DeleteArgs),
    /// Ask for more candidate images of one shot (new jobs: at once beside the shot's while it
    /// runs, else after the set's current shot).
    More {
        /// The set's id.
        id: String,
        /// The shot: its number in the set from 0 (`#0`, `#1`, … in `tally set status`),
        /// or its role when only one shot has it (main, selling_point, scene, detail, size).
        shot: String,
        /// How many more candidates, 1 to 4.
        #[arg(long, value_name = "K", default_value_t = 1)]
        count: u32,
        /// Accept that each new candidate is charged (needed when the provider bills).
        #[arg(long)]
        accept_possible_charge: bool,
    },
    /// Choose one candidate's image for a shot (the image delivered and zipped for it).
    Choose {
        /// The set's id.
        id: String,
        /// The shot: its number from 0, or its role when only one shot has it.
        shot: String,
        /// The artifact id of the image (from `tally set status`).
        artifact: String,
    },
    /// Deliver the set's chosen images: make each shot's file with a profile and write it to
    /// a target, with manifest.csv and manifest.json beside them.
    #[command(after_help = "With --wait the exit code says how the delivery ended: 0 every file delivered; \
                            3 a file failed (partly delivered or failed); 4 a file is unknown (the target could \
                            not say); 130 Ctrl-C stopped waiting (the delivery goes on).")]
    Deliver {
        /// The set's id.
        id: String,
        /// The profile: amazon, shopify, etsy, taobao, original, or one of [[delivery.profiles]].
        #[arg(long, value_name = "NAME")]
        profile: String,
        /// The target: one of [[delivery.targets]], or exports (a folder in the data directory).
        #[arg(long = "to", value_name = "TARGET")]
        to: String,
        /// Deliver an image that does not meet the profile anyway.
        #[arg(long)]
        force: bool,
        /// A profile for the shots of one role, as ROLE=PROFILE (main_white=amazon_main); repeat.
        #[arg(long = "profile-for", value_name = "ROLE=PROFILE")]
        profile_for: Vec<String>,
        /// For a shopify target: the product the files are attached to
        /// (gid://shopify/Product/… or its handle).
        #[arg(long = "product-id", value_name = "ID")]
        product_id: Option<String>,
        /// Wait until every file is delivered, failed or unknown.
        #[arg(long)]
        wait: bool,
    },
    /// Clear a shot's choice (no image chosen for it).
    Unchoose {
        /// The set's id.
        id: String,
        /// The shot: its number from 0, or its role when only one shot has it.
        shot: String,
    },
}

/// Parse the command line and run it; print errors as `tally: <message>`.
pub fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(f) => {
            eprintln!("tally: {}", term_safe_lines(&f.message));
            f.exit.into()
        }
    }
}

/// Parse the command line and run one subcommand.
pub fn run() -> Result<ExitCode, Failure> {
    let cli = match parse(std::env::args_os()) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return Ok(if e.use_stderr() { Exit::Usage.into() } else { Exit::Ok.into() });
        }
    };
    if !matches!(cli.command, Command::Serve { .. } | Command::MockProvider(_)) {
        end_quietly_on_closed_pipe();
    }
    if let Command::Bench(args) = cli.command {
        crate::bench::run(args).map_err(Failure::error)?;
        return Ok(Exit::Ok.into());
    }
    if let Command::MockProvider(args) = cli.command {
        runtime()?.block_on(crate::mock::run(args)).map_err(|e| Failure::error(format!("mock provider: {e}")))?;
        return Ok(Exit::Ok.into());
    }
    let from_env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let config = cli.config.clone().or_else(|| from_env("TALLY_CONFIG"));
    let data_dir = cli.data_dir.clone().or_else(|| from_env("TALLY_DATA_DIR"));
    let cfg = app::load_config(config.as_deref(), data_dir.as_deref())?;
    let json = cli.json;
    match cli.command {
        Command::Backup { dest } => {
            // A test holds a backup at a known step with FAILPOINTS (`failpoint::pause`).
            #[cfg(feature = "failpoints")]
            let _failpoints = fail::FailScenario::setup();
            backup(&cfg, &dest)
        }
        Command::Check { db } => check(&cfg, db.as_deref()),
        Command::Restore { src } => restore(&cfg, &src),
        Command::Prune { older_than, dry_run } => prune(&cfg, &older_than, dry_run, json),
        Command::Token => token(&cfg),
        Command::Service(cmd) => service::service(&cfg, config.as_deref(), cmd),
        Command::Serve { listen, log_format, no_browser, lan } => {
            let mut cfg = cfg;
            cfg.server.lan |= lan;
            if let Some(addr) = listen {
                cfg.server.listen = crate::config::listen_address(&addr, cfg.server.allow_non_loopback)
                    .map_err(|e| Failure { exit: Exit::Usage, message: format!("--listen: {e}") })?;
            }
            // Crash points (DESIGN §9) read FAILPOINTS in builds with the `failpoints` feature.
            #[cfg(feature = "failpoints")]
            let _failpoints = fail::FailScenario::setup();
            app::init_logging(log_format);
            runtime()?.block_on(app::serve(cfg, cli.config.clone(), !no_browser))?;
            Ok(Exit::Ok.into())
        }
        other => runtime()?.block_on(client_command(&cfg, other, json)),
    }
}

/// The global flags, and the subcommands where they mean nothing: there a hidden flag of the
/// same name takes the global one's place (clap does not propagate a global into a subcommand
/// that has an argument of that id), so it is not listed in their help and still accepted (a
/// `TALLY_CONFIG` in the environment never breaks them).
const UNUSED_GLOBALS: &[(&str, &str, &[&str])] = &[
    ("json", "json", &["serve", "backup", "check", "token", "mock-provider"]),
    ("config", "config", &["mock-provider", "bench"]),
    ("data_dir", "data-dir", &["mock-provider", "bench"]),
];

/// The command line as clap sees it, with meaningless global flags hidden per subcommand.
pub fn command() -> clap::Command {
    use clap::{Arg, ArgAction, CommandFactory};
    let mut cmd = Cli::command();
    for (id, long, subs) in UNUSED_GLOBALS {
        for sub in *subs {
            let arg = Arg::new(*id).long(*long).hide(true);
            let arg = if *id == "json" { arg.action(ArgAction::SetTrue) } else { arg.num_args(1) };
            cmd = cmd.mut_subcommand(*sub, |c| c.arg(arg));
        }
    }
    cmd
}

/// Parse a command line.
pub fn parse<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    use clap::FromArgMatches;
    let mut cmd = command();
    let matches = cmd.try_get_matches_from_mut(args)?;
    Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut cmd))
}

/// A command whose output goes to a pipe that closed (`tally list | head -1`) ends quietly, as
/// Unix tools do, instead of panicking in `println!`: the Rust runtime ignores `SIGPIPE`, so a
/// write to a closed pipe fails and `println!` panics on that failure. Not for `serve` (and the
/// mock provider), whose sockets must never end the process when a client goes away.
fn end_quietly_on_closed_pipe() {
    // SAFETY: setting a signal's disposition to the default, before any other thread of this
    // process exists, has no memory-safety requirements.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

pub(super) fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
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

/// Text for a terminal: control characters (ESC, CSI, BEL, backspace, carriage return, the C1
/// range, bidi overrides …) from a prompt, a provider's error or the daemon are shown as
/// visible escapes (`\u{1b}`), so they cannot move the cursor, rewrite earlier lines or
/// recolour the terminal. Newlines are escaped too (one record stays one line); tabs are kept.
pub fn term_safe(text: &str) -> String {
    escape_controls(text, false)
}

/// [`term_safe`] for a message of several lines: newlines are kept, everything else escaped.
pub fn term_safe_lines(text: &str) -> String {
    escape_controls(text, true)
}

fn escape_controls(text: &str, keep_newlines: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let bidi = matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}');
        if c == '\t' || (c == '\n' && keep_newlines) || (!c.is_control() && !bidi) {
            out.push(c);
        } else {
            out.push_str(&c.escape_unicode().to_string());
        }
    }
    out
}

/// [`term_safe`] of a JSON string field, with its RFC 3339 UTC times in the shop's zone.
pub(super) fn st(v: &Value, key: &str) -> String {
    term_safe(&times::local_times(s(v, key)))
}
