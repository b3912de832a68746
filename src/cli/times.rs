//! Times in the CLI's words are the shop's local times: the daemon writes RFC 3339 UTC (and
//! keeps it in `--json` and CSV), and the CLI shows them in the zone in force (set in the page,
//! else `[ui] time_zone`), with their offset, so that no reader has to convert. Also
//! `tally time-zone`, which shows or sets that zone.

use crate::domain::words::{t, tf};

/// The shop's zone the CLI shows times in (set once a command knows it; until then times stay
/// as the daemon wrote them). `--json` output never uses it: JSON keeps RFC 3339.
static ZONE: std::sync::OnceLock<jiff::tz::TimeZone> = std::sync::OnceLock::new();

/// Show times in `zone` from now on.
pub(in crate::cli) fn set_zone(zone: jiff::tz::TimeZone) {
    let _ = ZONE.set(zone);
}

/// `text` with every RFC 3339 UTC time in it (`2026-12-03T23:34:24.000Z`, as the daemon writes
/// them, alone or inside a sentence) as the shop's local time with its offset
/// (`2026-12-04 07:34:24 +08:00`); unchanged while no zone is known.
pub(in crate::cli) fn local_times(text: &str) -> std::borrow::Cow<'_, str> {
    match ZONE.get() {
        Some(zone) => std::borrow::Cow::Owned(local_times_in(text, zone)),
        None => std::borrow::Cow::Borrowed(text),
    }
}

/// [`local_times`] in `zone`.
fn local_times_in(text: &str, zone: &jiff::tz::TimeZone) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut copied = 0;
    while i + 20 <= b.len() {
        // `dddd-dd-ddTdd:dd:dd`, optional fraction, `Z`.
        let shape = |k: usize, c: u8| if c == b'd' { b[i + k].is_ascii_digit() } else { b[i + k] == c };
        let head = b"dddd-dd-ddTdd:dd:dd".iter().enumerate().all(|(k, &c)| shape(k, c));
        if head && (i == 0 || !b[i - 1].is_ascii_alphanumeric()) {
            let mut end = i + 19;
            if b.get(end) == Some(&b'.') {
                end += 1;
                while b.get(end).is_some_and(u8::is_ascii_digit) {
                    end += 1;
                }
            }
            if b.get(end) == Some(&b'Z')
                && let Ok(t) = text[i..=end].parse::<jiff::Timestamp>()
            {
                out.push_str(&text[copied..i]);
                out.push_str(&t.to_zoned_datetime(zone.clone()).strftime("%Y-%m-%d %H:%M:%S %:z").to_string());
                i = end + 1;
                copied = i;
                continue;
            }
        }
        i += 1;
    }
    out.push_str(&text[copied..]);
    out
}

/// `tally time-zone [NAME] [--reset]`: show the shop's zone, set it (as the page's Settings
/// does: `PUT /v1/time-zone`), or go back to the configuration's.
pub(in crate::cli) async fn time_zone(
    client: &crate::cli::client::Client,
    name: Option<String>,
    reset: bool,
    json: bool,
) -> Result<std::process::ExitCode, crate::app::Failure> {
    let z = match (name, reset) {
        (Some(n), _) => client.put("/v1/time-zone", &serde_json::json!({ "time_zone": n })).await?.into_ok()?,
        (None, true) => client.delete("/v1/time-zone").await?.into_ok()?,
        (None, false) => client.get("/v1/time-zone").await?.into_ok()?,
    };
    if json {
        super::print_json(&z);
        return Ok(crate::app::Exit::Ok.into());
    }
    let lang = client.lang();
    let text = |k: &str| super::st(&z, k);
    // `2026-12-05T03:16:00+08:00` as the CLI writes times: `2026-12-05 03:16:00 +08:00`.
    let now = text("now");
    let now = match (now.get(..19), now.get(19..)) {
        (Some(at), Some(offset)) if !offset.is_empty() => format!("{} {offset}", at.replace('T', " ")),
        _ => now,
    };
    let zone = text("time_zone");
    println!("{}", tf(lang, "cli.zone_line", &[("zone", &zone), ("now", &now)]));
    let source = if text("source") == "set" {
        tf(lang, "cli.zone_source_set", &[("configured", &text("configured"))])
    } else {
        t(lang, "cli.zone_source_config")
    };
    println!("{source}");
    Ok(crate::app::Exit::Ok.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_alone_and_inside_sentences_are_shown_in_the_zone() {
        let zone = jiff::tz::TimeZone::get("Asia/Shanghai").expect("zone");
        assert_eq!(local_times_in("2026-12-03T23:34:24.000Z", &zone), "2026-12-04 07:34:24 +08:00");
        assert_eq!(
            local_times_in("held until 2026-12-03T16:00:00Z. Nothing was sent.", &zone),
            "held until 2026-12-04 00:00:00 +08:00. Nothing was sent."
        );
        // Not a time: left as it is (no Z, a damaged one, one glued to a word, a date alone).
        for text in ["2026-12-03T23:34:24", "2026-13-03T23:34:24Z", "x2026-12-03T23:34:24Z", "2026-12-03", "时间 ok"]
        {
            assert_eq!(local_times_in(text, &zone), text);
        }
        assert_eq!(
            local_times_in("两次：2026-12-03T00:00:00Z、2026-12-03T01:00:00Z", &zone),
            "两次：2026-12-03 08:00:00 +08:00、2026-12-03 09:00:00 +08:00"
        );
    }
}
