//! `tally set deliver` and `tally delivery …`: deliveries through the daemon's API (issue
//! #26). `--wait` follows the delivery until it ends, with the exit codes of `submit --wait`:
//! 0 delivered, 3 failed or partly delivered, 4 unknown (the target could not say), 130 Ctrl-C.
//! Everything printed that came from the daemon goes through `term_safe`.

use serde_json::{Value, json};

use super::say::{label, status as status_word};
use super::tasks::{Interrupt, stopped_waiting};
use super::*;
use crate::cli::client::Client;
use crate::domain::Lang;
use crate::domain::words::tf;

/// `tally delivery …`.
#[derive(Debug, Subcommand)]
pub enum DeliveryCommand {
    /// Show a delivery and each of its files.
    Show {
        /// The delivery's id (from `tally set deliver`).
        id: String,
    },
    /// Send again every file of a finished delivery that is not delivered (a file written
    /// before is looked for at the target first, never written twice).
    Retry {
        /// The delivery's id.
        id: String,
        /// Wait until it ends (exit codes as `tally set deliver --wait`).
        #[arg(long)]
        wait: bool,
    },
}

pub(super) async fn delivery_command(
    client: &Client,
    cmd: DeliveryCommand,
    json_out: bool,
) -> Result<ExitCode, Failure> {
    match cmd {
        DeliveryCommand::Show { id } => {
            let d = client.get(&format!("/v1/deliveries/{}", seg(&id))).await?.into_ok()?;
            show_delivery(client.lang(), &d, json_out);
            Ok(Exit::Ok.into())
        }
        DeliveryCommand::Retry { id, wait } => {
            let d = client.post(&format!("/v1/deliveries/{}/retry", seg(&id)), &json!({})).await?.into_ok()?;
            if wait {
                return wait_delivery(client, d, json_out).await;
            }
            show_delivery(client.lang(), &d, json_out);
            Ok(Exit::Ok.into())
        }
    }
}

/// What `tally set deliver` asks for.
pub(super) struct Deliver<'a> {
    pub profile: &'a str,
    pub to: &'a str,
    pub force: bool,
    pub product: Option<&'a str>,
}

/// `tally set deliver SET --profile P --to TARGET [--profile-for ROLE=P] [--force]
/// [--product-id ID] [--wait]`; `by_role`: the `profiles` object.
pub(super) async fn deliver(
    client: &Client,
    set: &str,
    req: &Deliver<'_>,
    by_role: Value,
    wait: bool,
    json_out: bool,
) -> Result<ExitCode, Failure> {
    let mut body = json!({ "profile": req.profile, "target": req.to, "force": req.force });
    if let Some(p) = req.product {
        body["shopify_product"] = json!(p);
    }
    if by_role.as_object().is_some_and(|m| !m.is_empty()) {
        body["profiles"] = by_role;
    }
    let answer = client.post(&format!("/v1/sets/{}/deliveries", seg(set)), &body).await?;
    if answer.error_code() == Some("not_ready") {
        let reasons: Vec<String> = answer
            .body
            .get("blocking")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(|r| format!("  - {}", term_safe(r)))
            .collect();
        let hint = if req.force { "" } else { "\n(--force delivers an image that does not meet the profile anyway)" };
        return Err(Failure::error(format!("this set cannot be delivered yet:\n{}{hint}", reasons.join("\n"))));
    }
    let d = answer.into_ok()?;
    if wait {
        return wait_delivery(client, d, json_out).await;
    }
    show_delivery(client.lang(), &d, json_out);
    Ok(Exit::Ok.into())
}

/// Follow a delivery until it ends; the exit code says how.
async fn wait_delivery(client: &Client, mut d: Value, json_out: bool) -> Result<ExitCode, Failure> {
    let id = s(&d, "id").to_string();
    let mut interrupt = Interrupt::install();
    let mut last = String::new();
    loop {
        let state = s(&d, "state").to_string();
        if state != last {
            let line = format!("{}: {}", term_safe(&id), term_safe(&state));
            if json_out {
                eprintln!("{line}");
            } else {
                println!("{line}");
            }
            last = state.clone();
        }
        let exit = match state.as_str() {
            "delivered" => Some(Exit::Ok),
            "failed" | "partly_delivered" => Some(Exit::NotSucceeded),
            "unknown" => Some(Exit::Unknown),
            _ => None,
        };
        if let Some(exit) = exit {
            show_delivery(client.lang(), &d, json_out);
            return Ok(exit.into());
        }
        tokio::select! {
            _ = interrupt.recv() => {
                return Err(stopped_waiting("delivery", format!("tally delivery show {}", term_safe(&id))));
            }
            next = async {
                tokio::time::sleep(Duration::from_millis(250)).await;
                client.get(&format!("/v1/deliveries/{}", seg(&id))).await
            } => d = next?.into_ok()?,
        }
    }
}

/// Print a delivery for people (or its JSON).
fn show_delivery(lang: Lang, d: &Value, json_out: bool) {
    if json_out {
        print_json(d);
        return;
    }
    let l = |key: &str| label(lang, key);
    println!("{}{}", l("delivery"), st(d, "id"));
    println!("{}{}", l("state"), status_word(lang, &st(d, "state")));
    println!("{}{}", l("set"), st(d, "set_id"));
    let (profile, target) = (st(d, "profile"), st(d, "target"));
    println!("{}{}", l("profile"), tf(lang, "cli.profile_target", &[("profile", &profile), ("target", &target)]));
    for it in d.get("items").and_then(Value::as_array).cloned().unwrap_or_default() {
        let size = match (it.get("width").and_then(Value::as_i64), it.get("height").and_then(Value::as_i64)) {
            (Some(w), Some(h)) => {
                let bytes = it.get("bytes").and_then(Value::as_i64).unwrap_or(0).to_string();
                let (w, h) = (w.to_string(), h.to_string());
                tf(lang, "cli.file_size", &[("width", &w), ("height", &h), ("bytes", &bytes)])
            }
            _ => String::new(),
        };
        println!("{}{}  {}  {}", l("file"), st(&it, "file_name"), status_word(lang, &st(&it, "state")), size);
        if let Some(why) = it.get("why").and_then(Value::as_str) {
            println!("{}{}", " ".repeat(super::say::LABEL), tf(lang, "cli.why", &[("why", &term_safe(why))]));
        }
    }
}
