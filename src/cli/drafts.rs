//! `tally draft …`: drafts from product photos through the daemon's HTTP API (`/v1/drafts`).
//! A draft is a proposal: only `tally draft confirm` creates the image set.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::{Value, json};

use super::*;
use crate::cli::client::Client;

/// `tally draft …`.
#[derive(Debug, Subcommand)]
pub enum DraftCommand {
    /// Upload the product's photos (1 to 6) and ask a provider that drafts for a plan of shots
    /// and listing copy. Drafting is a call like any other: on a paid provider it is charged by
    /// its tokens; nothing else is made until you confirm.
    Create {
        /// The product's name.
        #[arg(long)]
        product: String,
        /// A product photo (PNG, JPEG or WebP); repeat for more, at most 6.
        #[arg(long = "photo", value_name = "FILE", required = true)]
        photos: Vec<PathBuf>,
        /// A fact you know (material, size, colour, price, selling point, audience), as
        /// KEY=VALUE; repeat for more. Kept as yours, confirmed.
        #[arg(long = "fact", value_name = "KEY=VALUE")]
        facts: Vec<String>,
        /// The marketplace: taobao, tmall, jd, pinduoduo, amazon, shopify or etsy.
        #[arg(long)]
        marketplace: Option<String>,
        /// The language of the listing copy: en or zh-CN.
        #[arg(long, default_value = "en")]
        language: String,
        /// The provider that drafts (default: the first configured one that does).
        #[arg(long)]
        provider: Option<String>,
        /// Makes resending safe: the same key and request return the same draft.
        #[arg(long)]
        idempotency_key: Option<String>,
        /// Wait for the plan; exit 0 when it is ready, 3 if drafting failed or was canceled,
        /// 4 if its outcome is unknown (it may have been charged).
        #[arg(long)]
        wait: bool,
    },
    /// Show a draft: its status, revision, facts, shots, copy and questions.
    Show {
        /// The draft's id.
        id: String,
    },
    /// Change a revision: answer its questions, change a shot's prompt or candidates, or the
    /// copy's title. Each change makes a new revision; a stale one is refused.
    Edit {
        /// The draft's id.
        id: String,
        /// The revision you read (`tally draft show`): the latest, or it is refused.
        #[arg(long)]
        revision: i64,
        /// An answer to a question, as QUESTION-ID=ANSWER (the id `tally draft show` prints in
        /// brackets after each question); repeat for more.
        #[arg(long = "answer", value_name = "ID=ANSWER")]
        answers: Vec<String>,
        /// A shot's new prompt, as N=PROMPT (N from 1, as `tally draft show` numbers them).
        #[arg(long = "shot-prompt", value_name = "N=PROMPT")]
        shot_prompts: Vec<String>,
        /// How many candidates a shot makes, as N=COUNT.
        #[arg(long = "shot-candidates", value_name = "N=COUNT")]
        shot_candidates: Vec<String>,
        /// The listing copy's new title.
        #[arg(long)]
        title: Option<String>,
    },
    /// Ask the model again with your facts and answers: a new call, charged like the first
    /// (the refusal says about how much until you accept it).
    Redraft {
        /// The draft's id.
        id: String,
        /// The revision you read: the latest, or it is refused.
        #[arg(long)]
        revision: i64,
        /// Go ahead although the call will be charged.
        #[arg(long)]
        accept_possible_charge: bool,
        /// Wait for the new plan (exit codes as `draft create --wait`).
        #[arg(long)]
        wait: bool,
    },
    /// Confirm one revision: its image set is created (one job per candidate) and only then
    /// is anything generated. Confirming again shows the same set.
    Confirm {
        /// The draft's id.
        id: String,
        /// The revision you read (`tally draft show`): the latest, or it is refused.
        #[arg(long)]
        revision: i64,
        /// The provider that generates the images (default: the draft's own if it generates,
        /// else the default provider).
        #[arg(long)]
        provider: Option<String>,
        /// Go ahead although the images will be charged (the refusal says about how much).
        #[arg(long)]
        accept_possible_charge: bool,
    },
}

/// `N=VALUE` of a shot numbered from 1 among `shots` shots: its index and the value.
fn numbered(s: &str, flag: &str, shots: usize) -> Result<(usize, String), Failure> {
    let usage = |why: String| Failure { exit: Exit::Usage, message: format!("{flag} `{s}`: {why}") };
    let (n, v) = s.split_once('=').ok_or_else(|| usage("write it as N=VALUE".into()))?;
    match n.trim().parse::<usize>() {
        Ok(n) if (1..=shots).contains(&n) => Ok((n - 1, v.to_string())),
        _ => Err(usage(format!("N is a shot's number, 1 to {shots}"))),
    }
}

fn fact(s: &str) -> Result<(String, Value), Failure> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), json!(v.trim()))),
        _ => Err(Failure { exit: Exit::Usage, message: format!("--fact `{s}`: write it as KEY=VALUE") }),
    }
}

/// Print a draft for a person (or as JSON).
fn show(d: &Value, json_out: bool) {
    if json_out {
        print_json(d);
        return;
    }
    println!("{}  {}  revision {}", st(d, "id"), st(d, "status"), d["revision"]);
    println!("product: {}", st(d, "product"));
    if let Some(m) = d["message"].as_str() {
        println!("{}", term_safe(m));
    }
    for f in d["facts"].as_array().into_iter().flatten() {
        let mark = if f["confirmed"].as_bool() == Some(true) { "confirmed" } else { "to check" };
        println!("  fact  {} = {}  ({}, {mark})", st(f, "key"), st(f, "value"), st(f, "source"));
    }
    for (i, s) in d["shots"].as_array().into_iter().flatten().enumerate() {
        println!("  shot {}  {} ×{}  {}: {}", i + 1, st(s, "role"), s["candidates"], st(s, "purpose"), st(s, "prompt"));
    }
    if let Some(title) = d["copy"]["title"].as_str() {
        println!("  title  {}", term_safe(title));
    }
    for b in d["copy"]["bullets"].as_array().into_iter().flatten() {
        println!("  •  {}", st(b, "text"));
    }
    for q in d["questions"].as_array().into_iter().flatten() {
        let opts: Vec<String> =
            q["options"].as_array().into_iter().flatten().filter_map(|o| o.as_str()).map(term_safe).collect();
        println!("  ?  {} [{}]  ({})", st(q, "question"), opts.join(" / "), st(q, "id"));
    }
    if let Some(set) = d["set_id"].as_str() {
        println!("confirmed: set {}", term_safe(set));
    }
}

/// Run `tally draft …`.
pub(super) async fn draft_command(client: &Client, cmd: DraftCommand, json_out: bool) -> Result<ExitCode, Failure> {
    match cmd {
        DraftCommand::Create { product, photos, facts, marketplace, language, provider, idempotency_key, wait } => {
            let facts: serde_json::Map<String, Value> = facts.iter().map(|f| fact(f)).collect::<Result<_, _>>()?;
            let mut ids = Vec::new();
            for path in &photos {
                let bytes =
                    std::fs::read(path).map_err(|e| Failure::error(format!("cannot read {}: {e}", path.display())))?;
                let ct = crate::providers::sniff_image(&bytes)
                    .ok_or_else(|| Failure::error(format!("{} is not a PNG, JPEG or WebP image", path.display())))?;
                let up = client.post_bytes("/v1/uploads", ct, bytes).await?.into_ok()?;
                ids.push(up["id"].clone());
            }
            let mut body = json!({ "product": product, "photos": ids, "facts": facts, "language": language });
            for (k, v) in [("marketplace", marketplace), ("provider", provider), ("idempotency_key", idempotency_key)] {
                if let Some(v) = v {
                    body[k] = json!(v);
                }
            }
            let d = client.post("/v1/drafts", &body).await?.into_ok()?;
            if wait {
                return wait_for_draft(client, d, json_out).await;
            }
            show(&d, json_out);
            Ok(Exit::Ok.into())
        }
        DraftCommand::Show { id } => {
            let d = client.get(&format!("/v1/drafts/{}", seg(&id))).await?.into_ok()?;
            show(&d, json_out);
            Ok(Exit::Ok.into())
        }
        DraftCommand::Edit { id, revision, answers, shot_prompts, shot_candidates, title } => {
            let path = format!("/v1/drafts/{}", seg(&id));
            let mut body = json!({ "revision": revision });
            if !answers.is_empty() {
                let mut by_id = serde_json::Map::new();
                for a in &answers {
                    match a.split_once('=') {
                        Some((q, v)) if !q.trim().is_empty() => by_id.insert(q.trim().to_string(), json!(v.trim())),
                        _ => {
                            return Err(Failure {
                                exit: Exit::Usage,
                                message: format!("--answer `{a}`: write it as QUESTION-ID=ANSWER"),
                            });
                        }
                    };
                }
                body["answers"] = Value::Object(by_id);
            }
            if !shot_prompts.is_empty() || !shot_candidates.is_empty() || title.is_some() {
                // Whole sections replace the current ones: start from the revision as read.
                let d = client.get(&path).await?.into_ok()?;
                let mut shots = d["shots"].as_array().cloned().unwrap_or_default();
                for sp in &shot_prompts {
                    let (i, v) = numbered(sp, "--shot-prompt", shots.len())?;
                    shots[i]["prompt"] = json!(v);
                }
                for sc in &shot_candidates {
                    let (i, v) = numbered(sc, "--shot-candidates", shots.len())?;
                    let n: i64 = v.trim().parse().map_err(|_| Failure {
                        exit: Exit::Usage,
                        message: format!("--shot-candidates `{sc}`: COUNT is a whole number"),
                    })?;
                    shots[i]["candidates"] = json!(n);
                }
                if !shot_prompts.is_empty() || !shot_candidates.is_empty() {
                    body["shots"] = Value::Array(shots);
                }
                if let Some(t) = title {
                    let mut copy = d["copy"].clone();
                    if copy.is_object() {
                        copy["title"] = json!(t);
                        body["copy"] = copy;
                    }
                }
            }
            let d = client.patch(&path, &body).await?.into_ok()?;
            show(&d, json_out);
            Ok(Exit::Ok.into())
        }
        DraftCommand::Redraft { id, revision, accept_possible_charge, wait } => {
            let body = json!({ "revision": revision, "acknowledge_possible_charge": accept_possible_charge });
            let d = client.post(&format!("/v1/drafts/{}/redraft", seg(&id)), &body).await?.into_ok()?;
            if wait {
                return wait_for_draft(client, d, json_out).await;
            }
            show(&d, json_out);
            Ok(Exit::Ok.into())
        }
        DraftCommand::Confirm { id, revision, provider, accept_possible_charge } => {
            let mut body = json!({ "revision": revision, "acknowledge_possible_charge": accept_possible_charge });
            if let Some(p) = provider {
                body["provider"] = json!(p);
            }
            let out = client.post(&format!("/v1/drafts/{}/confirm", seg(&id)), &body).await?.into_ok()?;
            if json_out {
                print_json(&out);
            } else {
                println!("set {} created from revision {revision} of draft {}", st(&out, "set_id"), term_safe(&id));
            }
            Ok(Exit::Ok.into())
        }
    }
}

/// Poll a draft every 250 ms, printing each status change, until its drafting call settles or
/// Ctrl-C (which stops only the waiting); then show it. The exit code follows its status.
async fn wait_for_draft(client: &Client, mut d: Value, json_out: bool) -> Result<ExitCode, Failure> {
    let id = st(&d, "id");
    let mut interrupt = super::tasks::Interrupt::install();
    let mut last = String::new();
    loop {
        let status = st(&d, "status");
        if status != last {
            let line = format!("{id}: {status}");
            if json_out {
                eprintln!("{line}");
            } else {
                println!("{line}");
            }
            last = status.clone();
        }
        let exit = match status.as_str() {
            "ready" | "confirmed" => Some(Exit::Ok),
            "failed" | "canceled" => Some(Exit::NotSucceeded),
            "unknown" => Some(Exit::Unknown),
            _ => None,
        };
        if let Some(exit) = exit {
            show(&d, json_out);
            return Ok(exit.into());
        }
        tokio::select! {
            _ = interrupt.recv() => {
                return Err(super::tasks::stopped_waiting("draft", format!("tally draft show {id}")));
            }
            next = async {
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                client.get(&format!("/v1/drafts/{}", seg(&id))).await
            } => d = next?.into_ok()?,
        }
    }
}
