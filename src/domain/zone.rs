//! The shop's clock: the time zone (`[ui] time_zone`) whose calendar days and months budgets
//! count and the spend report groups by. tally stores UTC milliseconds ([`Millis`]); only
//! these functions turn them into local dates and back, for a zone passed in (the config
//! looks it up: `config::time_zone`). The IANA database is also bundled into the binary
//! (`jiff`'s `tzdb-bundle-always`), so a machine without tzdata knows the same zones.

use jiff::Timestamp;
use jiff::civil::Date;
use jiff::tz::TimeZone;

use super::Millis;

/// The IANA names of UTC itself (a computer set to UTC often says `Etc/UTC`).
const UTC_NAMES: &[&str] = &[
    "Etc/UTC",
    "Etc/UCT",
    "Etc/Universal",
    "Etc/Zulu",
    "UCT",
    "Universal",
    "Zulu",
    "Etc/GMT",
    "Etc/GMT0",
    "Etc/GMT+0",
    "Etc/GMT-0",
    "Etc/Greenwich",
    "GMT",
    "GMT0",
    "GMT+0",
    "GMT-0",
    "Greenwich",
];

/// The zone's IANA name as shown (`Asia/Shanghai`; `UTC` for any name of UTC), or `local`
/// for a zone without one.
pub fn name(zone: &TimeZone) -> String {
    match zone.iana_name() {
        None => "local".to_string(),
        Some(n) if UTC_NAMES.iter().any(|u| u.eq_ignore_ascii_case(n)) => "UTC".to_string(),
        Some(n) => n.to_string(),
    }
}

/// The local date of `at` in `zone`.
pub fn date_of(at: Millis, zone: &TimeZone) -> Date {
    let ts = Timestamp::from_millisecond(at).unwrap_or(Timestamp::UNIX_EPOCH);
    ts.to_zoned_datetime(zone.clone()).date()
}

/// When local `date` begins in `zone` (its first instant: local midnight, or the first time
/// after a gap that skips it).
pub fn start_of(date: Date, zone: &TimeZone) -> Millis {
    date.to_zoned_datetime(zone.clone()).map_or(0, |z| z.timestamp().as_millisecond())
}

/// The local day containing `at`: `[start, end)`.
pub fn day_bounds(at: Millis, zone: &TimeZone) -> (Millis, Millis) {
    let d = date_of(at, zone);
    let next = d.tomorrow().unwrap_or(d);
    (start_of(d, zone), start_of(next, zone))
}

/// The local month containing `at`: `[start, end)`.
pub fn month_bounds(at: Millis, zone: &TimeZone) -> (Millis, Millis) {
    let first = date_of(at, zone).first_of_month();
    let next = first.last_of_month().tomorrow().unwrap_or(first);
    (start_of(first, zone), start_of(next, zone))
}

/// The local date of `at` as `2026-12-01`.
pub fn day_key(at: Millis, zone: &TimeZone) -> String {
    let d = date_of(at, zone);
    format!("{:04}-{:02}-{:02}", d.year(), d.month(), d.day())
}

/// The start in `zone` of a date `YYYY-MM-DD` (1970 to 9999), if it is one.
pub fn parse_day(s: &str, zone: &TimeZone) -> Option<Millis> {
    let mut parts = s.splitn(3, '-');
    let y: i16 = parts.next()?.parse().ok()?;
    let m: i8 = parts.next()?.parse().ok()?;
    let d: i8 = parts.next()?.parse().ok()?;
    if !(1970..=9999).contains(&y) {
        return None;
    }
    // Date::new refuses dates like 2026-02-31.
    Date::new(y, m, d).ok().map(|date| start_of(date, zone))
}

/// The earliest a month containing `at` can begin in any zone (offsets run from UTC−12 to
/// UTC+14): what is kept from then on covers the local month of `at` whatever the zone.
pub fn earliest_month_start(at: Millis) -> Millis {
    const HOUR: Millis = 3_600_000;
    month_bounds(at - 12 * HOUR, &TimeZone::UTC).0 - 14 * HOUR
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(rfc3339: &str) -> Millis {
        rfc3339.parse::<Timestamp>().expect("a time").as_millisecond()
    }

    #[test]
    fn a_late_utc_evening_is_the_next_day_in_shanghai() {
        let sh = resolve(Some("Asia/Shanghai")).expect("a zone");
        let t = at("2026-12-03T23:30:00Z");
        assert_eq!(day_key(t, &sh), "2026-12-04");
        assert_eq!(day_key(t, &TimeZone::UTC), "2026-12-03");
        // The Beijing day begins at 16:00 UTC the day before.
        assert_eq!(day_bounds(t, &sh), (at("2026-12-03T16:00:00Z"), at("2026-12-04T16:00:00Z")));
        assert_eq!(month_bounds(t, &sh), (at("2026-11-30T16:00:00Z"), at("2026-12-31T16:00:00Z")));
        assert_eq!(parse_day("2026-12-04", &sh), Some(at("2026-12-03T16:00:00Z")));
        assert_eq!(parse_day("2026-02-31", &sh), None);
        assert_eq!(parse_day("soon", &sh), None);
    }

    fn resolve(name: Option<&str>) -> Result<TimeZone, jiff::Error> {
        TimeZone::get(name.unwrap_or("UTC"))
    }

    #[test]
    fn a_zone_shows_its_iana_name() {
        assert_eq!(name(&TimeZone::UTC), "UTC");
        assert_eq!(name(&resolve(Some("Etc/UTC")).expect("a zone")), "UTC");
        assert_eq!(name(&resolve(Some("Asia/Shanghai")).expect("a zone")), "Asia/Shanghai");
    }

    #[test]
    fn the_earliest_month_start_covers_every_zone() {
        let t = at("2026-12-01T05:00:00Z");
        for z in ["Pacific/Kiritimati", "Asia/Shanghai", "UTC", "Pacific/Pago_Pago", "Etc/GMT+12"] {
            let zone = resolve(Some(z)).expect("a zone");
            assert!(earliest_month_start(t) <= month_bounds(t, &zone).0, "{z}");
        }
        // Mid-month, it is at most 14 hours before the UTC month's start.
        let mid = at("2026-12-15T05:00:00Z");
        assert_eq!(month_bounds(mid, &TimeZone::UTC).0 - earliest_month_start(mid), 14 * 3_600_000);
    }
}
