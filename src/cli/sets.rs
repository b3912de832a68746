//! `tally set …`: image sets through the daemon's HTTP API.

use serde_json::{Value, json};

use super::say::{fit, status as status_word};
use super::*;
use crate::cli::client::Client;
use crate::domain::words::{t as word, tf};

/// Parse `ROLE:PROMPT`.
pub(super) fn parse_shot(s: &str) -> Result<Value, Failure> {
    let (role, prompt) = s
        .split_once(':')
        .ok_or_else(|| Failure { exit: Exit::Usage, message: format!("--shot `{s}`: write it as ROLE:PROMPT") })?;
    Ok(json!({ "role": role.trim(), "prompt": prompt.trim() }))
}

/// Upload a photo file; its upload id.
async fn upload_file(client: &Client, path: &std::path::Path) -> Result<Value, Failure> {
    let bytes = std::fs::read(path).map_err(|e| Failure::error(format!("cannot read {}: {e}", path.display())))?;
    let ct = crate::providers::sniff_image(&bytes)
        .ok_or_else(|| Failure::error(format!("{} is not a PNG, JPEG or WebP image", path.display())))?;
    let up = client.post_bytes("/v1/uploads", ct, bytes).await?.into_ok()?;
    Ok(up["id"].clone())
}

/// `--overlay SHOT:TEMPLATE:LINE`, each added to its shot's overlay (SHOT: `#N`, or a role:
/// its first shot). The same shot and template again adds a line; another template for a shot
/// that has one is refused.
fn add_overlays(shots: &mut [Value], overlays: &[String]) -> Result<(), Failure> {
    let usage =
        |o: &str, why: String| Failure { exit: Exit::Usage, message: format!("--overlay `{}`: {why}", term_safe(o)) };
    for o in overlays {
        let mut parts = o.splitn(3, ':');
        let (Some(shot), Some(template), Some(line)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(usage(o, "write it as SHOT:TEMPLATE:LINE".into()));
        };
        let (shot, template) = (shot.trim(), template.trim());
        let i = match shot.strip_prefix('#') {
            Some(n) => n.parse::<usize>().ok().filter(|i| *i < shots.len()),
            None => shots.iter().position(|s| s["role"] == shot),
        }
        .ok_or_else(|| usage(o, format!("no shot `{shot}` among --shot (a role, or #N from 0)")))?;
        let entry = &mut shots[i]["overlay"];
        if entry.is_null() {
            *entry = json!({ "template": template, "lines": [] });
        } else if entry["template"] != template {
            return Err(usage(o, format!("that shot's words already use the template `{}`", entry["template"])));
        }
        if let Some(lines) = entry["lines"].as_array_mut() {
            lines.push(json!(line));
        }
    }
    Ok(())
}

pub(super) async fn set_command(client: &Client, cmd: SetCommand, json_out: bool) -> Result<ExitCode, Failure> {
    match cmd {
        SetCommand::Create { product, refs, shots, overlays, style, candidates, provider, idempotency_key, wait } => {
            let mut shots = shots.iter().map(|s| parse_shot(s)).collect::<Result<Vec<_>, _>>()?;
            if candidates != 1 {
                for s in &mut shots {
                    s["candidates"] = json!(candidates);
                }
            }
            // `ROLE:@PHOTO`: the shot is made from that photo (uploaded first), not a prompt.
            for s in &mut shots {
                let Some(path) = s["prompt"].as_str().and_then(|p| p.strip_prefix('@')).map(PathBuf::from) else {
                    continue;
                };
                let up = upload_file(client, &path).await?;
                s["source"] = json!({ "upload": up });
                s["prompt"] = json!("");
            }
            add_overlays(&mut shots, &overlays)?;
            let mut references = Vec::new();
            for path in &refs {
                references.push(upload_file(client, path).await?);
            }
            let mut body = json!({ "product": product, "references": references, "shots": shots });
            for (k, v) in [("style", style), ("provider", provider), ("idempotency_key", idempotency_key)] {
                if let Some(v) = v {
                    body[k] = json!(v);
                }
            }
            let set = client.post("/v1/sets", &body).await?.into_ok()?;
            if !wait {
                show_set(client, &set, json_out);
                return Ok(Exit::Ok.into());
            }
            wait_for_set(client, set, json_out).await
        }
        SetCommand::List { limit, before } => {
            let mut q = Vec::new();
            if let Some(n) = limit {
                q.push(format!("limit={n}"));
            }
            if let Some(b) = before {
                q.push(format!("before={}", seg(&b)));
            }
            let path = if q.is_empty() { "/v1/sets".to_string() } else { format!("/v1/sets?{}", q.join("&")) };
            let page = client.get(&path).await?.into_ok()?;
            if json_out {
                print_json(&page);
                return Ok(Exit::Ok.into());
            }
            let sets = page["sets"].as_array().cloned().unwrap_or_default();
            let lang = client.lang();
            if sets.is_empty() {
                println!("{}", word(lang, "cli.no_sets"));
            }
            for set in &sets {
                println!(
                    "{}  {}  {}  {} ({})",
                    st(set, "id"),
                    fit(&status_word(lang, &st(set, "status")), 18),
                    st(set, "created_at"),
                    super::tasks::shorten(&st(set, "product"), 40),
                    st(set, "progress")
                );
            }
            if let Some(next) = page["next"].as_str() {
                let command = format!("tally set list --before {}", term_safe(next));
                println!("{}", tf(lang, "cli.more", &[("command", &command)]));
            }
            Ok(Exit::Ok.into())
        }
        SetCommand::Status { id, profile } => {
            let query = profile.map(|p| format!("?profile={}", seg(&p))).unwrap_or_default();
            let set = client.get(&format!("/v1/sets/{}{query}", seg(&id))).await?.into_ok()?;
            show_set(client, &set, json_out);
            Ok(Exit::Ok.into())
        }
        SetCommand::Download { id, dir } => download(client, &id, dir, json_out).await,
        SetCommand::Cancel { id } => {
            let set = client.post(&format!("/v1/sets/{}/cancel", seg(&id)), &json!({})).await?.into_ok()?;
            show_set(client, &set, json_out);
            Ok(Exit::Ok.into())
        }
        SetCommand::Edit(a) => super::set_edit::edit(client, a, json_out).await,
        SetCommand::Duplicate(a) => super::set_edit::duplicate(client, a, json_out).await,
        SetCommand::Start(a) => super::set_edit::start(client, a, json_out).await,
        SetCommand::Delete(a) => super::set_edit::delete(client, &a.id, json_out).await,
        SetCommand::More { id, shot, count, accept_possible_charge } => {
            let index = shot_index(client, &id, &shot).await?;
            let body = json!({ "count": count, "acknowledge_possible_charge": accept_possible_charge });
            let answer = client.post(&format!("/v1/sets/{}/shots/{index}/candidates", seg(&id)), &body).await?;
            if answer.error_code() == Some("cost_acknowledgement_required") {
                let message = answer.body.pointer("/error/message").and_then(Value::as_str).unwrap_or_default();
                return Err(Failure::error(format!("{message} (with the CLI: add --accept-possible-charge)")));
            }
            let set = answer.into_ok()?;
            show_set(client, &set, json_out);
            Ok(Exit::Ok.into())
        }
        SetCommand::Choose { id, shot, artifact } => {
            let index = shot_index(client, &id, &shot).await?;
            let body = json!({ "artifact_id": artifact });
            let set = client.put(&format!("/v1/sets/{}/shots/{index}/choice", seg(&id)), &body).await?.into_ok()?;
            show_set(client, &set, json_out);
            Ok(Exit::Ok.into())
        }
        SetCommand::Deliver { id, profile, to, force, profile_for, product_id, wait } => {
            let mut by_role = serde_json::Map::new();
            for p in &profile_for {
                let (role, name) = p.split_once('=').ok_or_else(|| Failure {
                    exit: Exit::Usage,
                    message: format!("--profile-for `{}`: write it as ROLE=PROFILE", term_safe(p)),
                })?;
                by_role.insert(role.trim().to_string(), json!(name.trim()));
            }
            let req = super::deliveries::Deliver { profile: &profile, to: &to, force, product: product_id.as_deref() };
            super::deliveries::deliver(client, &id, &req, Value::Object(by_role), wait, json_out).await
        }
        SetCommand::Unchoose { id, shot } => {
            let index = shot_index(client, &id, &shot).await?;
            let set = client.delete(&format!("/v1/sets/{}/shots/{index}/choice", seg(&id))).await?.into_ok()?;
            show_set(client, &set, json_out);
            Ok(Exit::Ok.into())
        }
    }
}

/// A shot named on the command line: its index from 0, or a role only one shot has.
pub(super) async fn shot_index(client: &Client, id: &str, shot: &str) -> Result<usize, Failure> {
    if let Ok(i) = shot.trim().parse::<usize>() {
        return Ok(i);
    }
    let set = client.get(&format!("/v1/sets/{}", seg(id))).await?.into_ok()?;
    let roles: Vec<String> = set["shots"].as_array().into_iter().flatten().map(|s| st(s, "role")).collect();
    let want = shot.trim().replace('-', "_");
    let hits: Vec<usize> = roles.iter().enumerate().filter(|(_, r)| **r == want).map(|(i, _)| i).collect();
    match hits.as_slice() {
        [i] => Ok(*i),
        [] => Err(Failure {
            exit: Exit::Usage,
            message: format!(
                "no shot of this set has the role `{}`; name the shot by its number from 0 (roles: {})",
                term_safe(shot),
                roles.join(", ")
            ),
        }),
        many => Err(Failure {
            exit: Exit::Usage,
            message: format!(
                "{} shots have the role `{}`; name the shot by its number from 0 ({})",
                many.len(),
                term_safe(shot),
                many.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")
            ),
        }),
    }
}

/// The exit code of a settled set, like `submit --wait`: 0 every shot done, 4 a shot unknown,
/// else 3 (a shot failed or was canceled).
pub(super) fn set_exit(set: &Value) -> Exit {
    let shots = set["shots"].as_array().cloned().unwrap_or_default();
    let candidate_unknown =
        |s: &Value| s["candidates"].as_array().is_some_and(|c| c.iter().any(|c| c["status"] == "unknown"));
    if shots.iter().any(|s| s["status"] == "unknown" || candidate_unknown(s)) {
        Exit::Unknown
    } else if set["status"] == "done" {
        Exit::Ok
    } else {
        Exit::NotSucceeded
    }
}

/// Poll a set every 250 ms, printing per-shot progress when it changes, until every shot is
/// settled or Ctrl-C.
async fn wait_for_set(client: &Client, mut set: Value, json_out: bool) -> Result<ExitCode, Failure> {
    let id = set["id"].as_str().unwrap_or_default().to_string();
    let mut interrupt = super::tasks::Interrupt::install();
    let mut last = String::new();
    loop {
        let line = set_progress_line(&set);
        if line != last {
            eprintln!("{line}");
            last = line;
        }
        if set["status"] != "running" {
            show_set(client, &set, json_out);
            return Ok(set_exit(&set).into());
        }
        tokio::select! {
            _ = interrupt.recv() => {
                return Err(super::tasks::stopped_waiting("set", format!("tally set status {}", term_safe(&id))));
            }
            next = async {
                tokio::time::sleep(Duration::from_millis(250)).await;
                client.get(&format!("/v1/sets/{}", seg(&id))).await
            } => set = next?.into_ok()?,
        }
    }
}

/// `tally set download ID [DIR]`: fetch the set's zip and write its images into `DIR` (default:
/// a new folder named after the product). Each image is checked against the sha256 the set
/// reports; a file already there with the same bytes is left alone, one with other bytes is
/// never overwritten. Images the daemon left out as damaged are named in the zip's note, which
/// is saved beside them and printed; the exit code is then 5.
async fn download(client: &Client, id: &str, dir: Option<PathBuf>, json_out: bool) -> Result<ExitCode, Failure> {
    let set = client.get(&format!("/v1/sets/{}", seg(id))).await?.into_ok()?;
    let (zip_name, bytes) =
        client.get_bytes(&format!("/v1/sets/{}/download", seg(id)), Duration::from_secs(600)).await?;
    let dir = dir.unwrap_or_else(|| {
        let stem = zip_name.as_deref().and_then(|n| n.strip_suffix(".zip")).unwrap_or("image-set");
        PathBuf::from(stem)
    });
    std::fs::create_dir_all(&dir).map_err(|e| Failure::error(format!("cannot create {}: {e}", dir.display())))?;
    let expected: std::collections::HashSet<String> = set["shots"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["candidates"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["artifact"]["sha256"].as_str().map(str::to_string))
        .collect();
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes))
        .map_err(|e| Failure::error(format!("the daemon's zip cannot be read: {e}")))?;
    let mut written = Vec::new();
    // The daemon's note naming damaged images it left out (`api::download::LEFT_OUT_NOTE`).
    let mut note = None;
    for i in 0..archive.len() {
        let mut entry =
            archive.by_index(i).map_err(|e| Failure::error(format!("the daemon's zip cannot be read: {e}")))?;
        let raw_name = entry.name().map(|n| n.into_owned()).unwrap_or_default();
        let Some(name) = crate::api::download::plain_file_name(&raw_name) else {
            return Err(Failure::error(format!("the zip names a file `{}` outside the folder", term_safe(&raw_name))));
        };
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut data)
            .map_err(|e| Failure::error(format!("{}: the zip entry is damaged: {e}", term_safe(&name))))?;
        let sha = crate::domain::hex(&<sha2::Sha256 as sha2::Digest>::digest(&data));
        let is_note = name == crate::api::download::LEFT_OUT_NOTE;
        if is_note {
            note = Some(String::from_utf8_lossy(&data).into_owned());
        } else if !expected.contains(&sha) {
            return Err(Failure::error(format!("{}: its bytes match no image of the set", term_safe(&name))));
        }
        let path = dir.join(&name);
        match std::fs::read(&path) {
            Ok(old) if old == data => {}
            Ok(_) => {
                return Err(Failure::error(format!(
                    "{} already exists with other content; choose another folder (nothing was overwritten)",
                    path.display()
                )));
            }
            Err(_) => {
                let tmp = dir.join(format!(".{name}.part"));
                std::fs::write(&tmp, &data)
                    .and_then(|_| std::fs::rename(&tmp, &path))
                    .map_err(|e| Failure::error(format!("cannot write {}: {e}", path.display())))?;
            }
        }
        if !is_note {
            written.push(path);
        }
    }
    if json_out {
        let files: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
        let mut out = json!({ "set": id, "dir": dir.display().to_string(), "files": files });
        if let Some(n) = &note {
            out["left_out"] = json!(n);
        }
        print_json(&out);
    } else {
        println!(
            "saved {} image(s) of {} in {}:",
            written.len(),
            st(&set, "product"),
            term_safe(&dir.display().to_string())
        );
        for p in &written {
            println!("  {}", term_safe(&p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()));
        }
    }
    if let Some(n) = note {
        let note_path = dir.join(crate::api::download::LEFT_OUT_NOTE);
        return Err(Failure {
            exit: Exit::Problems,
            message: format!(
                "some images of the set were left out because they are damaged (the note is saved as {}):\n{}",
                note_path.display(),
                crate::cli::term_safe_lines(n.trim_end())
            ),
        });
    }
    Ok(Exit::Ok.into())
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
                    format!("{}: {mark}", term_safe(s["role"].as_str().unwrap_or("shot")))
                })
                .collect()
        })
        .unwrap_or_default();
    format!("{} — {}", st(set, "progress"), shots.join(", "))
}

pub(super) fn show_set(client: &Client, set: &Value, json_out: bool) {
    if json_out {
        println!("{set}");
        return;
    }
    let lang = client.lang();
    let (id, product) = (st(set, "id"), st(set, "product"));
    let status = status_word(lang, &st(set, "status"));
    println!("{}", tf(lang, "cli.set_head", &[("id", &id), ("status", &status), ("product", &product)]));
    println!("  {}", st(set, "progress"));
    let role = |s: &Value| {
        let name = st(s, "role");
        let key = format!("role.{name}");
        if lang == crate::domain::Lang::En || !crate::domain::words::has(&key) { name } else { word(lang, &key) }
    };
    let chosen_mark = format!("  {}", word(lang, "cli.chosen_mark"));
    println!("  {}", st(set, "message"));
    for s in set["shots"].as_array().into_iter().flatten() {
        let cands = s["candidates"].as_array().cloned().unwrap_or_default();
        if cands.len() <= 1 {
            let art = s["artifacts"][0]["url"]
                .as_str()
                .map(|u| format!("  {}{}", client.base(), term_safe(u)))
                .unwrap_or_default();
            let chosen = if s["chosen"].is_string() { chosen_mark.as_str() } else { "" };
            println!(
                "  #{:<2} {} {} {}{art}{chosen}",
                s["position"].as_i64().unwrap_or(0),
                fit(&role(s), 13),
                fit(&status_word(lang, &st(s, "status")), 9),
                st(s, "id")
            );
            if s["status"] == "unknown" {
                println!("      {}", st(s, "message"));
            }
            continue;
        }
        let chosen = s["chosen"].as_str().map(|a| tf(lang, "cli.chosen_image", &[("id", &term_safe(a))]));
        let n = cands.len().to_string();
        let chosen = chosen.unwrap_or_else(|| word(lang, "cli.none_chosen"));
        println!(
            "  #{:<2} {} {}",
            s["position"].as_i64().unwrap_or(0),
            fit(&role(s), 13),
            tf(lang, "cli.candidates", &[("n", &n), ("chosen", &chosen)])
        );
        for c in &cands {
            let art = c["artifact"]["id"]
                .as_str()
                .map(|a| format!("  {}", tf(lang, "cli.image_id", &[("id", &term_safe(a))])))
                .unwrap_or_default();
            let mark = if c["chosen"] == true { chosen_mark.as_str() } else { "" };
            println!("      {} {}{art}{mark}", fit(&status_word(lang, &st(c, "status")), 9), st(c, "task_id"));
            if c["status"] == "unknown" {
                println!("      {}", st(c, "message"));
            }
        }
    }
    if let Some(reasons) = set["delivery"]["blocking"].as_array().filter(|b| !b.is_empty()) {
        for r in reasons {
            println!("  {}", tf(lang, "cli.not_ready", &[("reason", &term_safe(r.as_str().unwrap_or_default()))]));
        }
    } else if let Some(p) = set["delivery"]["profile"].as_str() {
        println!("  {}", tf(lang, "cli.ready_with", &[("profile", &term_safe(p))]));
    }
    if set["shots"].as_array().into_iter().flatten().any(|s| !s["artifacts"].as_array().is_none_or(Vec::is_empty)) {
        let command = format!("tally set download {id}");
        println!("  {}", tf(lang, "cli.save_images", &[("command", &command)]));
    }
}
