//! Client subcommands about tasks: submit (and wait), status, list, cancel, retry, resolve,
//! events, sign-in. They talk to the daemon over HTTP.

use std::io::Write;
use std::time::Duration;

use base64::prelude::*;
use serde_json::{Value, json};

use super::sets::set_command;
use super::*;
use crate::client::Client;
use crate::config::Config;

pub(super) async fn client_command(cfg: &Config, cmd: Command, json: bool) -> Result<ExitCode, Failure> {
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
                show_task(&client, &task, json);
                return Ok(Exit::Ok.into());
            }
            wait_for(&client, task, json).await
        }
        Command::Set(cmd) => set_command(&client, cmd, json).await,
        Command::Status { id } => {
            let task = client.get(&format!("/v1/tasks/{}", seg(&id))).await?.into_ok()?;
            show_task(&client, &task, json);
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
            show_task(&client, &task, json);
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
            show_task(&client, &task, json);
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
            show_task(&client, &task, json);
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
        | Command::Restore { .. }
        | Command::Token
        | Command::MockProvider(_)
        | Command::Bench(_) => Err(Failure::error("internal: not a client command")),
    }
}

/// Print a task for people (or its JSON).
pub(super) fn show_task(client: &Client, t: &Value, json: bool) {
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
        print_artifact(client, &a);
    }
    if let Some(note) = t.get("billing_note").and_then(Value::as_str) {
        println!("billing   {note}");
    }
    if t.pointer("/retry/allowed").and_then(Value::as_bool) == Some(true) {
        println!("retry     {}", t.pointer("/retry/note").and_then(Value::as_str).unwrap_or(""));
    }
}

pub(super) fn print_artifact(client: &Client, a: &Value) {
    println!(
        "image     sha256 {}  ({} bytes, {})",
        s(a, "sha256"),
        a.get("bytes").and_then(Value::as_i64).unwrap_or(0),
        s(a, "media_type")
    );
    println!("url       {}{}", client.base(), s(a, "url"));
}

/// Poll a task every 250 ms, printing each status change, until it settles.
pub(super) async fn wait_for(client: &Client, mut task: Value, json: bool) -> Result<ExitCode, Failure> {
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
                    print_artifact(client, &a);
                }
                if exit != Exit::Ok {
                    show_task(client, &task, false);
                }
            }
            return Ok(exit.into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        task = client.get(&format!("/v1/tasks/{}", seg(&id))).await?.into_ok()?;
    }
}
