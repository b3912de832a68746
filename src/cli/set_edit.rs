//! `tally set edit`, `tally set duplicate`, `tally set start` and `tally set delete`, through the
//! daemon's HTTP API (`PATCH /v1/sets/{id}`, `POST /v1/sets/{id}/duplicate`,
//! `POST /v1/sets/{id}/start`, `DELETE /v1/sets/{id}`). The
//! daemon's refusals already say what blocks them; these add the CLI's way to do it.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use serde_json::{Value, json};

use super::sets::{shot_index, show_set};
use super::{Exit, Failure, print_json, seg, st, term_safe};
use crate::cli::client::{Answer, Client};
use crate::domain::words::tf;

/// `tally set edit`'s arguments.
#[derive(Debug, Args)]
pub struct EditArgs {
    /// The set's id.
    pub id: String,
    /// The shot to change: its number from 0, or its role when only one shot has it. Needed
    /// with --prompt and --role.
    pub shot: Option<String>,
    /// The shot's new words (the product and style are added as at creation).
    #[arg(long, value_name = "TEXT")]
    pub prompt: Option<String>,
    /// The shot's new role: main, selling_point, scene, detail or size.
    #[arg(long, value_name = "ROLE")]
    pub role: Option<String>,
    /// The product's new name.
    #[arg(long, value_name = "NAME")]
    pub product: Option<String>,
    /// New style notes ("" removes them).
    #[arg(long, value_name = "TEXT")]
    pub style: Option<String>,
    /// A new reference photo (PNG, JPEG or WebP); repeat for several. They replace the set's
    /// reference photos.
    #[arg(long = "ref", value_name = "FILE")]
    pub refs: Vec<PathBuf>,
    /// Remove every reference photo of the set.
    #[arg(long, conflicts_with = "refs")]
    pub no_refs: bool,
}

/// `tally set duplicate`'s arguments.
#[derive(Debug, Args)]
pub struct DuplicateArgs {
    /// The set's id.
    pub id: String,
    /// Start the copy at once instead of leaving it to edit.
    #[arg(long)]
    pub start: bool,
    /// With --start: accept that every image of the copy is charged (needed when the provider
    /// bills).
    #[arg(long)]
    pub accept_possible_charge: bool,
    /// Makes resending safe: the same key returns the same copy.
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
}

/// `tally set start`'s arguments.
#[derive(Debug, Args)]
pub struct StartArgs {
    /// The copy's id (from `tally set duplicate`).
    pub id: String,
    /// Accept that every image of the copy is charged (needed when the provider bills).
    #[arg(long)]
    pub accept_possible_charge: bool,
}

/// `tally set delete`'s arguments.
#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// The set's id.
    pub id: String,
}

/// The daemon's refusal with the CLI's next step added, or the body of a success.
fn answered(answer: Answer, id: &str) -> Result<Value, Failure> {
    let hint = match answer.error_code() {
        Some("shot_already_sent" | "set_canceled") => format!(" (with the CLI: tally set duplicate {})", term_safe(id)),
        Some("set_not_finished") => format!(" (with the CLI: tally set cancel {})", term_safe(id)),
        Some("set_has_unknown") => " (`tally set status` lists the shots' job ids)".to_string(),
        Some("cost_acknowledgement_required") => " (with the CLI: add --accept-possible-charge)".to_string(),
        _ => String::new(),
    };
    answer.into_ok().map_err(|f| Failure { message: format!("{}{hint}", f.message), ..f })
}

/// `tally set edit ID [SHOT] [--prompt] [--role] [--product] [--style] [--ref…|--no-refs]`.
pub(super) async fn edit(client: &Client, e: EditArgs, json_out: bool) -> Result<ExitCode, Failure> {
    let id = e.id.as_str();
    let mut body = json!({});
    if e.prompt.is_some() || e.role.is_some() {
        let Some(shot) = &e.shot else {
            return Err(Failure {
                exit: Exit::Usage,
                message:
                    "name the shot to change: `tally set edit SET SHOT --prompt …` (SHOT is its number from 0, or \
                          its role)"
                        .into(),
            });
        };
        let position = shot_index(client, id, shot).await?;
        let mut s = json!({ "position": position });
        if let Some(p) = e.prompt {
            s["prompt"] = json!(p);
        }
        if let Some(r) = e.role {
            s["role"] = json!(r.replace('-', "_"));
        }
        body["shots"] = json!([s]);
    }
    if let Some(p) = e.product {
        body["product"] = json!(p);
    }
    if let Some(s) = e.style {
        body["style"] = json!(s);
    }
    if e.no_refs {
        body["references"] = json!([]);
    } else if !e.refs.is_empty() {
        let mut references = Vec::new();
        for path in &e.refs {
            let bytes =
                std::fs::read(path).map_err(|err| Failure::error(format!("cannot read {}: {err}", path.display())))?;
            let ct = crate::providers::sniff_image(&bytes)
                .ok_or_else(|| Failure::error(format!("{} is not a PNG, JPEG or WebP image", path.display())))?;
            let up = client.post_bytes("/v1/uploads", ct, bytes).await?.into_ok()?;
            references.push(up["id"].clone());
        }
        body["references"] = json!(references);
    }
    if body.as_object().is_none_or(|o| o.is_empty()) {
        return Err(Failure {
            exit: Exit::Usage,
            message:
                "nothing to change: give --prompt or --role with a shot, or --product, --style, --ref or --no-refs"
                    .into(),
        });
    }
    let set = answered(client.patch(&format!("/v1/sets/{}", seg(id)), &body).await?, id)?;
    show_set(client, &set, json_out);
    Ok(Exit::Ok.into())
}

/// `tally set duplicate ID [--start [--accept-possible-charge]] [--idempotency-key KEY]`.
pub(super) async fn duplicate(client: &Client, a: DuplicateArgs, json_out: bool) -> Result<ExitCode, Failure> {
    let id = a.id.as_str();
    let mut body = json!({ "start": a.start, "acknowledge_possible_charge": a.accept_possible_charge });
    if let Some(k) = a.idempotency_key.clone() {
        body["idempotency_key"] = json!(k);
    }
    let set = answered(client.post(&format!("/v1/sets/{}/duplicate", seg(id)), &body).await?, id)?;
    if json_out {
        show_set(client, &set, json_out);
        return Ok(Exit::Ok.into());
    }
    let (lang, copy) = (client.lang(), term_safe(&st(&set, "id")));
    println!("{}", tf(lang, "cli.copy_head", &[("copy", &copy), ("id", &term_safe(id))]));
    show_set(client, &set, json_out);
    if st(&set, "status") == "draft" {
        println!("{}", tf(lang, "cli.copy_next", &[("copy", &copy)]));
    }
    Ok(Exit::Ok.into())
}

/// `tally set start ID [--accept-possible-charge]`: start generating a copy to edit.
pub(super) async fn start(client: &Client, a: StartArgs, json_out: bool) -> Result<ExitCode, Failure> {
    let id = a.id.as_str();
    let body = json!({ "acknowledge_possible_charge": a.accept_possible_charge });
    let set = answered(client.post(&format!("/v1/sets/{}/start", seg(id)), &body).await?, id)?;
    show_set(client, &set, json_out);
    Ok(Exit::Ok.into())
}

/// `tally set delete ID`.
pub(super) async fn delete(client: &Client, id: &str, json_out: bool) -> Result<ExitCode, Failure> {
    let out = answered(client.delete(&format!("/v1/sets/{}", seg(id))).await?, id)?;
    if json_out {
        print_json(&out);
        return Ok(Exit::Ok.into());
    }
    println!("{}", term_safe(&st(&out, "message")));
    for kept in out["tasks_kept"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        println!("  kept: job {} (`tally show {}`)", term_safe(kept), term_safe(kept));
    }
    Ok(Exit::Ok.into())
}
