//! Client subcommands about jobs (the API's tasks): submit (and wait), status, list, cancel,
//! retry, resolve, events, sign-in. They talk to the daemon over HTTP; everything they print
//! that came from a prompt, a provider or the daemon goes through [`term_safe`].

use std::io::Write;
use std::time::Duration;

use base64::prelude::*;
use serde_json::{Value, json};

use super::say::{fit, label, status as status_word};
use super::sets::set_command;
use super::*;
use crate::cli::client::Client;
use crate::config::Config;
use crate::domain::Lang;
use crate::domain::words::{t as word, tf};

pub(super) async fn client_command(cfg: &Config, cmd: Command, json: bool) -> Result<ExitCode, Failure> {
    let client = Client::new(cfg)?;
    if !json {
        // Times are shown in the shop's zone (the one set in the page, else the config's).
        super::times::set_zone(client.zone().await.unwrap_or_else(|| cfg.engine.time_zone.clone()));
    }
    match cmd {
        Command::Submit { prompt, operation, image, provider, idempotency_key, group, wait } => {
            let mut body = json!({});
            if let Some(p) = prompt {
                body["prompt"] = json!(p);
            }
            if let Some(op) = operation {
                body["operation"] = json!(op);
            }
            if let Some(img) = image {
                let path = std::path::Path::new(&img);
                body["image"] = if path.is_file() {
                    let bytes = std::fs::read(path).map_err(|e| Failure::error(format!("cannot read {img}: {e}")))?;
                    let ct = crate::providers::sniff_image(&bytes)
                        .ok_or_else(|| Failure::error(format!("{img} is not a PNG, JPEG or WebP image")))?;
                    let up = client.post_bytes("/v1/uploads", ct, bytes).await?.into_ok()?;
                    json!({ "upload": up["id"] })
                } else {
                    json!({ "id": img })
                };
            }
            if let Some(g) = group {
                body["group"] = json!(g);
            }
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
        Command::Draft(cmd) => super::drafts::draft_command(&client, cmd, json).await,
        Command::Budget(cmd) => super::spend::budget(&client, cmd, json).await,
        Command::TimeZone { name, reset } => super::times::time_zone(&client, name, reset, json).await,
        Command::Held(cmd) => super::held::held_command(&client, cmd, json).await,
        Command::Provider(cmd) => super::provider::provider_command(&client, cmd, json).await,
        Command::Delivery(cmd) => super::deliveries::delivery_command(&client, cmd, json).await,
        Command::Spend { from, to, by, csv } => super::spend::spend(&client, from, to, by, csv, json).await,
        Command::Status { id } => {
            let task = client.get(&format!("/v1/tasks/{}", seg(&id))).await?.into_ok()?;
            show_task(&client, &task, json);
            Ok(Exit::Ok.into())
        }
        Command::List { status, limit, before, needs_attention, search } => {
            let mut q = Vec::new();
            if let Some(text) = search {
                q.push(format!("q={}", seg(&text)));
            }
            if let Some(s) = status {
                q.push(format!("status={}", seg(&s)));
            }
            if needs_attention {
                q.push("needs_attention=true".to_string());
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
                let lang = client.lang();
                if tasks.is_empty() {
                    println!(
                        "{}",
                        word(lang, if needs_attention { "cli.list_nothing_attention" } else { "cli.list_none" })
                    );
                }
                for t in &tasks {
                    println!(
                        "{}  {}  {}  {}",
                        st(t, "id"),
                        fit(&status_word(lang, &st(t, "status")), 9),
                        st(t, "created_at"),
                        shorten(&st(t, "prompt"), 50)
                    );
                }
                if let Some(next) = page.get("next").and_then(Value::as_str) {
                    println!("{}", tf(lang, "cli.more", &[("command", &format!("tally list --before {next}"))]));
                }
            }
            Ok(Exit::Ok.into())
        }
        Command::Cancel { id } => {
            let task = client.post(&format!("/v1/tasks/{}/cancel", seg(&id)), &json!({})).await?.into_ok()?;
            show_task(&client, &task, json);
            Ok(Exit::Ok.into())
        }
        Command::Retry { id, accept_possible_charge, acknowledge_retried_as } => {
            let mut body = json!({ "acknowledge_possible_charge": accept_possible_charge });
            if let Some(r) = &acknowledge_retried_as {
                body["acknowledge_retried_as"] = json!(r);
            }
            let answer = client.post(&format!("/v1/tasks/{}/retry", seg(&id)), &body).await?;
            if let Some(msg) = retry_refusal(&answer, &id, accept_possible_charge) {
                return Err(Failure::error(msg));
            }
            let task = answer.into_ok()?;
            if !json {
                println!("retried as a new job:");
            }
            show_task(&client, &task, json);
            Ok(Exit::Ok.into())
        }
        Command::Resolve { id, failed, image, charge, note } => {
            let mut body = json!({ "outcome": if failed { "failed" } else { "succeeded" } });
            if let Some(c) = charge {
                body["charge"] = json!(c.as_str());
            }
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
        Command::SignOut { all } => {
            let answer = client.post("/v1/session/sign-out", &json!({ "all": all })).await?.into_ok()?;
            if json {
                print_json(&answer);
            } else {
                let n = answer.get("ended").and_then(Value::as_u64).unwrap_or(0);
                println!(
                    "signed out {n} browser session{}; `tally sign-in` prints a new link",
                    if n == 1 { "" } else { "s" }
                );
            }
            Ok(Exit::Ok.into())
        }
        Command::SignIn { qr: false } => {
            let answer = client.post("/v1/session/sign-in-url", &json!({})).await?.into_ok()?;
            if json {
                print_json(&answer);
            } else {
                println!("{}", st(&answer, "url"));
            }
            Ok(Exit::Ok.into())
        }
        Command::SignIn { qr: true } => {
            let answer = client.post("/v1/session/pair", &json!({})).await?.into_ok()?;
            if json {
                print_json(&answer);
                return Ok(Exit::Ok.into());
            }
            let url = st(&answer, "url");
            let drawn = crate::api::session::qr_terminal(&url)
                .map_err(|e| Failure::error(format!("could not draw the QR code: {e}")))?;
            println!("{drawn}");
            println!("{url}");
            println!("code: {}   (works once, for 10 minutes)", st(&answer, "code"));
            println!("{}", st(&answer, "hint"));
            Ok(Exit::Ok.into())
        }
        Command::Events { id } => {
            let page = client.get(&format!("/v1/tasks/{}/events", seg(&id))).await?.into_ok()?;
            if json {
                print_json(&page);
            } else {
                for e in page.get("events").and_then(Value::as_array).cloned().unwrap_or_default() {
                    println!(
                        "{}  {:<10}  {:<16}  {}",
                        st(&e, "at"),
                        st(&e, "actor"),
                        st(&e, "kind"),
                        st(&e, "message")
                    );
                }
            }
            Ok(Exit::Ok.into())
        }
        Command::Serve { .. }
        | Command::Backup { .. }
        | Command::Check { .. }
        | Command::Restore { .. }
        | Command::Prune { .. }
        | Command::Token
        | Command::Service(_)
        | Command::MockProvider(_)
        | Command::Bench(_) => Err(Failure::error("internal: not a client command")),
    }
}

/// A refused retry in the CLI's own words (its flags, not the API's JSON fields).
fn retry_refusal(answer: &crate::cli::client::Answer, id: &str, accepted: bool) -> Option<String> {
    let body = &answer.body;
    let named = |v: &Value| (s(v, "id").to_string(), s(v, "status").to_string());
    let (other, status) = body.pointer("/error/retried_as").map(named).unwrap_or_default();
    let flag = if accepted { " --accept-possible-charge" } else { "" };
    match answer.error_code()? {
        "cost_acknowledgement_required" => {
            // The API's own instruction names its JSON field; say the CLI's flag instead.
            let msg = s(body.get("error")?, "message");
            let what = msg.split("; send ").next().unwrap_or(msg).trim_end_matches('.');
            Some(format!("{what}.\nTo retry anyway: tally retry {id} --accept-possible-charge"))
        }
        "retry_in_progress" => Some(format!(
            "task {other}, a retry of this task or of its shot, is still {status}; a task has at most one live retry.\n\
             Follow it with: tally status {other}"
        )),
        "already_retried" => Some(format!(
            "this task was already retried as task {other} ({status}).\nTo make another new task anyway: \
             tally retry {id}{flag} --acknowledge-retried-as {other}\n(or retry the retry: tally retry {other})"
        )),
        _ => None,
    }
}

/// `text` cut to at most `max` characters at a word boundary, with "…" when it was cut.
pub(super) fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let cut: String = text.chars().take(max.saturating_sub(1)).collect();
    let cut = match cut.rfind(' ') {
        Some(i) if i >= max / 2 => &cut[..i],
        _ => cut.as_str(),
    };
    format!("{}…", cut.trim_end())
}

/// Print a job for people (or its JSON).
pub(super) fn show_task(client: &Client, t: &Value, json: bool) {
    if json {
        print_json(t);
        return;
    }
    let id = st(t, "id");
    let lang = client.lang();
    let l = |key: &str| label(lang, key);
    println!("{}{id}", l("job"));
    println!("{}{}", l("status"), status_word(lang, &st(t, "status")));
    println!("{}{}", l("message"), st(t, "message"));
    println!("{}{}", l("provider"), st(t, "provider"));
    let op = st(t, "operation");
    if !op.is_empty() && op != "generate" {
        println!("{}{}", l("operation"), term_safe(&crate::domain::words::t(lang, &format!("ops.op.{op}"))));
    }
    if let Some(img) = t.get("image").and_then(Value::as_object) {
        let id = img.values().next().and_then(Value::as_str).unwrap_or_default();
        let from = match t.get("image_task").and_then(Value::as_str) {
            Some(task) => tf(lang, "cli.made_from_job", &[("image", id), ("task", task)]),
            None => tf(lang, "cli.made_from", &[("image", id)]),
        };
        println!("{}{}", l("made_from"), term_safe(&from));
    }
    if !st(t, "prompt").is_empty() {
        println!("{}{}", l("prompt"), st(t, "prompt"));
    }
    println!("{}{}", l("attempts"), t.get("attempts").and_then(Value::as_i64).unwrap_or(0));
    println!("{}{}", l("created"), st(t, "created_at"));
    println!("{}{}", l("updated"), st(t, "updated_at"));
    if let Some(r) = t.get("retry_of").and_then(Value::as_str) {
        println!("{}{}", l("retry_of"), term_safe(r));
    }
    if let Some(c) = t.get("charge") {
        println!("{}{}", l("charge"), charge_words(c, lang));
    }
    if let Some(r) = t.get("retried_as").filter(|r| r.is_object()) {
        let (rid, rs) = (st(r, "id"), status_word(lang, &st(r, "status")));
        println!("{}{}", l("retried"), tf(lang, "cli.retried_as", &[("id", &rid), ("status", &rs)]));
    }
    for a in t.get("artifacts").and_then(Value::as_array).cloned().unwrap_or_default() {
        print_artifact(client, &a);
    }
    if let Some(note) = t.get("billing_note").and_then(Value::as_str) {
        println!("{}{}", l("billing"), term_safe(note));
    }
    if t.pointer("/retry/allowed").and_then(Value::as_bool) == Some(true) {
        println!("{}{}", l("retry"), term_safe(t.pointer("/retry/note").and_then(Value::as_str).unwrap_or("")));
    }
    if let Some(r) = t.get("refused_before_sending").filter(|r| r.is_object()) {
        println!("{}{}", l("refused"), tf(lang, "cli.refused_before", &[("problem", &st(r, "problem"))]));
        println!("{}{}", l("fix"), st(r, "fix"));
    }
    if let Some(w) = t.get("where_to_look").filter(|w| w.is_object()) {
        match w.get("url").and_then(Value::as_str) {
            Some(url) => println!("{}{}: {}", l("look"), st(w, "label"), term_safe(url)),
            None => println!("{}{}", l("look"), st(w, "how")),
        }
        for m in w.get("match_by").and_then(Value::as_array).into_iter().flatten() {
            println!("          {}: {}", st(m, "label"), shorten(&st(m, "value"), 200));
        }
    }
    if s(t, "status") == "unknown" {
        println!("{}{}", l("next"), word(lang, "cli.unknown_next"));
        println!("          {}", tf(lang, "cli.unknown_resolve", &[("id", &id)]));
        println!("          {}", tf(lang, "cli.unknown_retry", &[("id", &id)]));
    }
}

pub(super) fn print_artifact(client: &Client, a: &Value) {
    let lang = client.lang();
    let bytes = a.get("bytes").and_then(Value::as_i64).unwrap_or(0).to_string();
    let image = [("sha", st(a, "sha256")), ("bytes", bytes), ("type", st(a, "media_type"))];
    let image: Vec<(&str, &str)> = image.iter().map(|(k, v)| (*k, v.as_str())).collect();
    println!("{}{}", label(lang, "image"), tf(lang, "cli.image_line", &image));
    let url = format!("{}{}", client.base(), st(a, "url"));
    println!("{}{}", label(lang, "url"), tf(lang, "cli.url_line", &[("url", &url), ("id", &st(a, "id"))]));
}

/// Ctrl-C (SIGINT) for a wait loop: the handler is installed when this is created (before
/// the wait prints anything), so no Ctrl-C after the first progress line ends the process
/// silently. If it cannot be installed, Ctrl-C keeps its default effect.
pub(super) struct Interrupt(Option<tokio::signal::unix::Signal>);

impl Interrupt {
    pub(super) fn install() -> Self {
        Interrupt(tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok())
    }

    /// Resolves when Ctrl-C arrives.
    pub(super) async fn recv(&mut self) {
        match &mut self.0 {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    }
}

/// What Ctrl-C during `--wait` says: the work goes on in the daemon, and how to look at it.
pub(super) fn stopped_waiting(what: &str, command: String) -> Failure {
    Failure { exit: Exit::Interrupted, message: format!("stopped waiting; the {what} keeps running: `{command}`") }
}

/// Poll a job every 250 ms, printing each status change, until it settles or Ctrl-C.
pub(super) async fn wait_for(client: &Client, mut task: Value, json: bool) -> Result<ExitCode, Failure> {
    let id = s(&task, "id").to_string();
    let mut interrupt = Interrupt::install();
    let mut last = String::new();
    loop {
        let status = s(&task, "status").to_string();
        if status != last {
            let line = format!("{}: {} — {}", term_safe(&id), term_safe(&status), st(&task, "message"));
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
        tokio::select! {
            _ = interrupt.recv() => return Err(stopped_waiting("job", format!("tally status {}", term_safe(&id)))),
            next = async {
                tokio::time::sleep(Duration::from_millis(250)).await;
                client.get(&format!("/v1/tasks/{}", seg(&id))).await
            } => task = next?.into_ok()?,
        }
    }
}

/// A task's `charge` in plain words: `charged (1 request, about $0.04)`.
fn charge_words(c: &Value, lang: Lang) -> String {
    let state = match s(c, "state") {
        "none" => word(lang, "cli.charge_none"),
        "refused" => word(lang, "cli.charge_refused"),
        "possible" => word(lang, "cli.charge_possible"),
        "charged" => word(lang, "cli.charge_charged"),
        other => other.to_string(),
    };
    let n = c.get("requests").and_then(Value::as_i64).unwrap_or(0);
    let about = match c.get("estimated_cost").and_then(Value::as_f64) {
        Some(cost) => {
            let cur = c.get("currency").and_then(Value::as_str).unwrap_or("");
            tf(lang, "cli.about", &[("amount", &crate::domain::money(crate::domain::to_micros(cost), cur))])
        }
        None => String::new(),
    };
    match n {
        1 => tf(lang, "cli.charge_one", &[("state", &state), ("about", &about)]),
        n => tf(lang, "cli.charge_many", &[("state", &state), ("n", &n.to_string()), ("about", &about)]),
    }
}
