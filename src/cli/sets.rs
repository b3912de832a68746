//! `tally set …`: image sets through the daemon's HTTP API.

use serde_json::{Value, json};

use super::*;
use crate::client::Client;

/// Parse `ROLE:PROMPT`.
pub(super) fn parse_shot(s: &str) -> Result<Value, Failure> {
    let (role, prompt) = s
        .split_once(':')
        .ok_or_else(|| Failure { exit: Exit::Usage, message: format!("--shot `{s}`: write it as ROLE:PROMPT") })?;
    Ok(json!({ "role": role.trim(), "prompt": prompt.trim() }))
}

pub(super) async fn set_command(client: &Client, cmd: SetCommand, json_out: bool) -> Result<ExitCode, Failure> {
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
pub(super) fn set_progress_line(set: &Value) -> String {
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

pub(super) fn show_set(set: &Value, json_out: bool) {
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
