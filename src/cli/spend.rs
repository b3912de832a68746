//! `tally spend`: what was spent, from the daemon's `GET /v1/spend` (a table, or its JSON)
//! and `GET /v1/spend/requests?format=csv` (every paid request, for the accounts).

use serde_json::Value;

use super::*;
use crate::client::Client;
use crate::domain::{money, to_micros};

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
    let currency = report.get("currency").and_then(Value::as_str).unwrap_or("");
    let amount = |row: &Value, what: &str| -> String {
        let n = row.pointer(&format!("/{what}/count")).and_then(Value::as_i64).unwrap_or(0);
        let m = row.pointer(&format!("/{what}/amount")).and_then(Value::as_f64).unwrap_or(0.0);
        if currency.is_empty() { n.to_string() } else { format!("{n} ({})", money(to_micros(m), currency)) }
    };
    let line = |row: &Value| {
        println!(
            "{:<12}  {:<18}  {:<18}  {}",
            st(row, "key"),
            amount(row, "charged"),
            amount(row, "possibly_charged"),
            row.get("refused").and_then(Value::as_i64).unwrap_or(0)
        );
    };
    println!("{:<12}  {:<18}  {:<18}  refused", by.as_str(), "charged", "possibly charged");
    for row in report.get("rows").and_then(Value::as_array).cloned().unwrap_or_default() {
        line(&row);
    }
    line(&report["totals"]);
    let unpriced = report.pointer("/totals/unpriced").and_then(Value::as_i64).unwrap_or(0);
    if unpriced > 0 {
        println!("({unpriced} of these requests have no configured price and count 0 in the amounts)");
    }
    for b in report.get("budgets").and_then(Value::as_array).cloned().unwrap_or_default() {
        let cur = s(&b, "currency");
        let whose =
            b.get("provider").and_then(Value::as_str).map(|p| format!(" for `{}`", term_safe(p))).unwrap_or_default();
        let f = |k: &str| money(to_micros(b.get(k).and_then(Value::as_f64).unwrap_or(0.0)), cur);
        println!(
            "budget    {} {}{whose}: {} spent or possibly spent this period; resets {}",
            st(&b, "period"),
            f("limit"),
            f("spent"),
            st(&b, "resets_at")
        );
    }
    Ok(Exit::Ok.into())
}
