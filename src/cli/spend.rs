//! `tally spend`: what was spent, from the daemon's `GET /v1/spend` (a table, or its JSON)
//! and `GET /v1/spend/requests?format=csv` (every paid request, for the accounts); and
//! `tally budget show | set | reset` over `GET`, `PUT` and `DELETE /v1/budget`.

use serde_json::Value;

use super::say::fit;
use super::*;
use crate::cli::client::Client;
use crate::domain::words::{t as word, tf};
use crate::domain::{Lang, money, to_micros};

/// How `tally spend` groups its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum By {
    Day,
    Month,
    Provider,
}

impl By {
    fn as_str(self) -> &'static str {
        match self {
            By::Day => "day",
            By::Month => "month",
            By::Provider => "provider",
        }
    }
}

/// Run `tally spend`.
pub(super) async fn spend(
    client: &Client,
    from: Option<String>,
    to: Option<String>,
    by: By,
    csv: bool,
    json: bool,
) -> Result<ExitCode, Failure> {
    let mut q = Vec::new();
    if let Some(f) = &from {
        q.push(format!("from={}", seg(f)));
    }
    if let Some(t) = &to {
        q.push(format!("to={}", seg(t)));
    }
    if csv {
        q.push("format=csv".into());
        let text = client.get_text(&format!("/v1/spend/requests?{}", q.join("&"))).await?;
        print!("{text}");
        return Ok(Exit::Ok.into());
    }
    q.push(format!("group={}", by.as_str()));
    let report = client.get(&format!("/v1/spend?{}", q.join("&"))).await?.into_ok()?;
    if json {
        print_json(&report);
        return Ok(Exit::Ok.into());
    }
    let lang = client.lang();
    // Each row is in its own currency (a day with two currencies has two rows, never added).
    let currency = report.get("currency").and_then(Value::as_str).unwrap_or("");
    let amount = |row: &Value, what: &str| -> String {
        let currency = row.get("currency").and_then(Value::as_str).unwrap_or(currency);
        let n = row.pointer(&format!("/{what}/count")).and_then(Value::as_i64).unwrap_or(0);
        let m = row.pointer(&format!("/{what}/amount")).and_then(Value::as_f64).unwrap_or(0.0);
        if currency.is_empty() { n.to_string() } else { format!("{n} ({})", money(to_micros(m), currency)) }
    };
    let line = |row: &Value| {
        println!(
            "{}  {}  {}  {}",
            fit(&st(row, "key"), 12),
            fit(&amount(row, "charged"), 18),
            fit(&amount(row, "possibly_charged"), 18),
            row.get("refused").and_then(Value::as_i64).unwrap_or(0)
        );
    };
    println!(
        "{}  {}  {}  {}",
        fit(&word(lang, &format!("cli.spend_by_{}", by.as_str())), 12),
        fit(&word(lang, "cli.spend_charged"), 18),
        fit(&word(lang, "cli.spend_possibly"), 18),
        word(lang, "cli.spend_refused")
    );
    for row in report.get("rows").and_then(Value::as_array).cloned().unwrap_or_default() {
        line(&row);
    }
    match report.get("totals_by_currency").and_then(Value::as_array) {
        Some(each) if each.len() > 1 => each.iter().for_each(line),
        _ => line(&report["totals"]),
    }
    let unpriced = report.pointer("/totals/unpriced").and_then(Value::as_i64).unwrap_or(0);
    if unpriced > 0 {
        println!("{}", tf(lang, "cli.spend_unpriced", &[("n", &unpriced.to_string())]));
    }
    for b in report.get("budgets").and_then(Value::as_array).cloned().unwrap_or_default() {
        let cur = s(&b, "currency");
        let f = |k: &str| money(to_micros(b.get(k).and_then(Value::as_f64).unwrap_or(0.0)), cur);
        let period = word(lang, &format!("cli.period_{}", s(&b, "period")));
        let period = if period.starts_with("cli.") { st(&b, "period") } else { period };
        let (limit, spent, resets) = (f("limit"), f("spent"), st(&b, "resets_at"));
        let mut p = vec![
            ("period", period.as_str()),
            ("limit", limit.as_str()),
            ("spent", spent.as_str()),
            ("resets", resets.as_str()),
        ];
        let text = match b.get("provider").and_then(Value::as_str) {
            Some(name) => {
                let name = term_safe(name);
                p.push(("provider", name.as_str()));
                tf(lang, "cli.spend_budget_provider", &p)
            }
            None => tf(lang, "cli.spend_budget", &p),
        };
        println!("{}{text}", super::say::label(lang, "budget"));
    }
    Ok(Exit::Ok.into())
}

/// An AMOUNT of `tally budget set`: a number, or `none` (remove the limit).
fn limit_arg(flag: &str, v: &str) -> Result<Value, Failure> {
    let v = v.trim();
    if v.eq_ignore_ascii_case("none") {
        return Ok(Value::Null);
    }
    match v.trim_start_matches('$').parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(serde_json::json!(x)),
        _ => Err(Failure {
            exit: Exit::Usage,
            message: format!("--{flag} {v}: give an amount like 0.40 (0 or more), or `none` to remove the limit"),
        }),
    }
}

/// "$0.38 of $0.40" / "$0.38 (no limit)", in `lang`.
fn used(lang: Lang, spent: Option<f64>, limit: Option<f64>, currency: &str) -> String {
    let spent = money(to_micros(spent.unwrap_or(0.0)), currency);
    match limit {
        Some(l) => tf(lang, "cli.budget_of", &[("spent", &spent), ("limit", &money(to_micros(l), currency))]),
        None => tf(lang, "cli.budget_no_limit", &[("spent", &spent)]),
    }
}

/// Run `tally budget …`.
pub(super) async fn budget(client: &Client, cmd: BudgetCommand, json: bool) -> Result<ExitCode, Failure> {
    let b = match cmd {
        BudgetCommand::Show => client.get("/v1/budget").await?.into_ok()?,
        BudgetCommand::Reset => client.delete("/v1/budget").await?.into_ok()?,
        BudgetCommand::Set { daily, monthly, provider } => {
            let mut limits = serde_json::Map::new();
            if let Some(d) = &daily {
                limits.insert("daily".into(), limit_arg("daily", d)?);
            }
            if let Some(m) = &monthly {
                limits.insert("monthly".into(), limit_arg("monthly", m)?);
            }
            let body = match &provider {
                None => Value::Object(limits),
                Some(p) => serde_json::json!({ "providers": { p: Value::Object(limits) } }),
            };
            client.put("/v1/budget", &body).await?.into_ok()?
        }
    };
    if json {
        print_json(&b);
        return Ok(Exit::Ok.into());
    }
    let lang = client.lang();
    let cur = b.get("currency").and_then(Value::as_str).unwrap_or("USD").to_string();
    let f = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64);
    let today = used(lang, f(&b, "spent_today"), f(&b, "daily"), &cur);
    let month = used(lang, f(&b, "spent_this_month"), f(&b, "monthly"), &cur);
    println!("{}", tf(lang, "cli.budget_line", &[("today", &today), ("month", &month)]));
    if let Some(ps) = b.get("providers").and_then(Value::as_object) {
        for (name, p) in ps {
            let pc = p.get("currency").and_then(Value::as_str).unwrap_or(&cur).to_string();
            let today = used(lang, f(p, "spent_today"), f(p, "daily"), &pc);
            let month = used(lang, f(p, "spent_this_month"), f(p, "monthly"), &pc);
            let name = term_safe(name);
            println!(
                "  {}",
                tf(lang, "cli.budget_provider_line", &[("provider", &name), ("today", &today), ("month", &month)])
            );
        }
    }
    let source = if s(&b, "source") == "set" { "cli.budget_source_set" } else { "cli.budget_source_config" };
    println!("{}", word(lang, source));
    let zone = b.get("time_zone").and_then(Value::as_str).map_or_else(|| "UTC".to_string(), term_safe);
    println!("{}", tf(lang, "cli.spend_counts", &[("zone", &zone)]));
    Ok(Exit::Ok.into())
}
