//! `tally held list`, `tally held check` and `tally held release`: the jobs held because the database turned out
//! older than what was served (`store::held`), through the daemon's API. Everything printed
//! that came from the daemon goes through `term_safe`.

use serde_json::{Value, json};

use super::*;
use crate::cli::client::Client;
use crate::domain::words::{t as word, tf};

/// `tally held …`.
#[derive(Debug, Subcommand)]
pub enum HeldCommand {
    /// List the held jobs, each with why it is held and what sending it again may cost.
    List,
    /// Look the held jobs up at their providers now (tally also does at start-up): a job the
    /// provider shows as sent already is settled from its record, nothing sent again; the
    /// others stay held, and `tally held list` shows what each look found.
    Check,
    /// Send held jobs again: those named, or all with --all. Each makes a new request to its
    /// provider, which may be charged a second time if the daemon the copy came from sent it
    /// already.
    #[command(group(ArgGroup::new("which").required(true).args(["ids", "all"])))]
    Release {
        /// The ids of the held jobs to send again.
        ids: Vec<String>,
        /// Send every held job again.
        #[arg(long)]
        all: bool,
    },
}

pub(super) async fn held_command(client: &Client, cmd: HeldCommand, json: bool) -> Result<ExitCode, Failure> {
    match cmd {
        HeldCommand::List => {
            let page = client.get("/v1/held").await?.into_ok()?;
            if json {
                print_json(&page);
                return Ok(Exit::Ok.into());
            }
            let lang = client.lang();
            // A lost tail of commits first: it is said until the owner dismisses it.
            for n in page.get("notices").and_then(Value::as_array).cloned().unwrap_or_default() {
                println!("{}", st(&n, "message"));
                println!(
                    "    {}",
                    tf(
                        lang,
                        "cli.notice_dismiss",
                        &[("id", &n.get("id").and_then(Value::as_i64).unwrap_or(0).to_string())]
                    )
                );
            }
            let tasks = page.get("tasks").and_then(Value::as_array).cloned().unwrap_or_default();
            if tasks.is_empty() {
                println!("{}", word(lang, "cli.held_none"));
                return Ok(Exit::Ok.into());
            }
            let total = page.get("total").and_then(Value::as_i64).unwrap_or(tasks.len() as i64);
            println!("{}", tf(lang, "cli.held_count", &[("n", &total.to_string())]));
            for t in &tasks {
                let held = t.get("held").cloned().unwrap_or(Value::Null);
                println!("{}  {}", st(t, "id"), super::tasks::shorten(&st(t, "prompt"), 60));
                println!("    {}", st(&held, "reason"));
                println!("    {}", st(&held, "note"));
            }
            if (tasks.len() as i64) < total {
                println!("{}", tf(lang, "cli.held_first", &[("n", &tasks.len().to_string())]));
            }
            println!("{}", word(lang, "cli.held_how"));
            Ok(Exit::Ok.into())
        }
        HeldCommand::Check => {
            let answer = client.post("/v1/held/check", &json!({})).await?.into_ok()?;
            if json {
                print_json(&answer);
                return Ok(Exit::Ok.into());
            }
            let lang = client.lang();
            let n = |k: &str| answer.get(k).and_then(Value::as_u64).unwrap_or(0);
            let (looked, found, kept) = (n("looked").to_string(), n("found").to_string(), n("kept").to_string());
            println!("{}", tf(lang, "cli.held_looked", &[("looked", &looked), ("found", &found), ("kept", &kept)]));
            if n("kept") > 0 {
                println!("{}", word(lang, "cli.held_what_found"));
            }
            Ok(Exit::Ok.into())
        }
        HeldCommand::Release { ids, all } => {
            let body = if all { json!({ "all": true }) } else { json!({ "ids": ids }) };
            let answer = client.post("/v1/held/release", &body).await?.into_ok()?;
            if json {
                print_json(&answer);
                return Ok(Exit::Ok.into());
            }
            let list = |k: &str| -> Vec<String> {
                answer
                    .get(k)
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_str).map(term_safe).collect())
                    .unwrap_or_default()
            };
            let lang = client.lang();
            let (released, not_held) = (list("released"), list("not_held"));
            if released.is_empty() {
                println!("{}", word(lang, "cli.held_nothing_released"));
            }
            for id in &released {
                println!("{}", tf(lang, "cli.held_released", &[("id", id)]));
            }
            for id in &not_held {
                println!("{}", tf(lang, "cli.held_not_held", &[("id", id)]));
            }
            if !not_held.is_empty() {
                return Err(Failure::error(format!("{} of the named job(s) were not held", not_held.len())));
            }
            Ok(Exit::Ok.into())
        }
    }
}
