//! `tally held list`, `tally held check` and `tally held release`: the jobs held because the database turned out
//! older than what was served (`store::held`), through the daemon's API. Everything printed
//! that came from the daemon goes through `term_safe`.

use serde_json::{Value, json};

use super::*;
use crate::cli::client::Client;

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
            let tasks = page.get("tasks").and_then(Value::as_array).cloned().unwrap_or_default();
            if tasks.is_empty() {
                println!("no job is held");
                return Ok(Exit::Ok.into());
            }
            let total = page.get("total").and_then(Value::as_i64).unwrap_or(tasks.len() as i64);
            println!("{total} job(s) held, not sent:");
            for t in &tasks {
                let held = t.get("held").cloned().unwrap_or(Value::Null);
                println!("{}  {}", st(t, "id"), super::tasks::shorten(&st(t, "prompt"), 60));
                println!("    {}", st(&held, "reason"));
                println!("    {}", st(&held, "note"));
            }
            if (tasks.len() as i64) < total {
                println!("(the first {} are shown)", tasks.len());
            }
            println!("send one again: tally held release ID   all of them: tally held release --all");
            Ok(Exit::Ok.into())
        }
        HeldCommand::Check => {
            let answer = client.post("/v1/held/check", &json!({})).await?.into_ok()?;
            if json {
                print_json(&answer);
                return Ok(Exit::Ok.into());
            }
            let n = |k: &str| answer.get(k).and_then(Value::as_u64).unwrap_or(0);
            println!(
                "looked up {} held job(s): {} found at their provider (its result is fetched, nothing is sent again), \
                 {} still held",
                n("looked"),
                n("found"),
                n("kept")
            );
            if n("kept") > 0 {
                println!("what each look found: tally held list");
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
            let (released, not_held) = (list("released"), list("not_held"));
            if released.is_empty() {
                println!("nothing was released");
            }
            for id in &released {
                println!("released {id}: it is sent again (this may be charged again)");
            }
            for id in &not_held {
                println!("not held: {id}");
            }
            if !not_held.is_empty() {
                return Err(Failure::error(format!("{} of the named job(s) were not held", not_held.len())));
            }
            Ok(Exit::Ok.into())
        }
    }
}
