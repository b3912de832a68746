//! The shop's time zone at run time: `[ui] time_zone`, replaced by one the owner set in the
//! page (`PUT /v1/time-zone`, stored under `time_zone` in `shop_settings`) until it is reset.
//! Budget days and months begin at its local midnight, the spend report groups by its dates,
//! and the page shows times in it.
//!
//! Invariant (enforced in [`Engine::set_time_zone`]): the zone, every budget limit's zone and
//! the stored setting change together, under the budget lock, and tasks held by a budget check
//! it again at once (a day that began earlier or later may have room now, or none). On
//! PostgreSQL the setting is stored for every node; the others apply it when they start or get
//! a SIGHUP, as they do a budget set at run time.

use serde::Serialize;

use super::{Engine, EngineError, Shared};
use crate::domain::zone;
use crate::store::spend::Limit;

/// The key of the zone in `shop_settings`.
const KEY: &str = "time_zone";

/// Where the zone in force comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ZoneSource {
    /// `[ui] time_zone`, or the computer's zone when that is unset.
    Config,
    /// Set in the page (or `PUT /v1/time-zone`) and stored in the database.
    Set,
}

/// `GET /v1/time-zone`: the zone in force and where it comes from.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ZoneView {
    /// The IANA name of the zone in force ("Asia/Shanghai"; "UTC"; "local" when the computer's
    /// zone has no name).
    pub time_zone: String,
    /// `config` (the configuration's or the computer's) or `set` (in the page).
    pub source: ZoneSource,
    /// The zone the configuration gives, which applies again after `DELETE /v1/time-zone`.
    pub configured: String,
    /// The time now in the zone, RFC 3339 with its offset ("2026-12-04T09:30:00+08:00").
    pub now: String,
}

/// The stored zone, if one is set and tally still knows its name (an unknown one is logged and
/// the configuration's applies).
pub(super) async fn stored(store: &crate::store::Store) -> Result<Option<jiff::tz::TimeZone>, EngineError> {
    Ok(match store.shop_setting(KEY).await? {
        None => None,
        Some(name) => match crate::config::time_zone(Some(&name)) {
            Ok(z) => Some(z),
            Err(e) => {
                tracing::error!(
                    "the time zone set in the page: {e}; the configuration's applies until one is set again"
                );
                None
            }
        },
    })
}

/// `limits` counted in `zone`.
pub(super) fn rezone(limits: Vec<Limit>, zone: &jiff::tz::TimeZone) -> Vec<Limit> {
    limits.into_iter().map(|l| Limit { zone: zone.clone(), ..l }).collect()
}

impl Shared {
    /// The zone in force now.
    pub(super) fn zone(&self) -> jiff::tz::TimeZone {
        self.zone.read().unwrap_or_else(|e| e.into_inner()).0.clone()
    }

    /// Make `zone` the zone in force, with every limit (in force and the configuration's)
    /// counted in it. The caller holds the budget lock.
    pub(super) fn apply_zone(&self, zone: jiff::tz::TimeZone, source: ZoneSource) {
        *self.zone.write().unwrap_or_else(|e| e.into_inner()) = (zone.clone(), source);
        let mut config = self.config_limits.write().unwrap_or_else(|e| e.into_inner());
        *config = rezone(std::mem::take(&mut *config), &zone);
        let mut limits = self.limits.write().unwrap_or_else(|e| e.into_inner());
        *limits = rezone(std::mem::take(&mut *limits), &zone);
    }
}

impl Engine {
    /// The shop's zone (set in the page, else `[ui] time_zone`): budget days and months and the
    /// spend report's dates are its.
    pub fn time_zone(&self) -> jiff::tz::TimeZone {
        self.shared.zone()
    }

    /// The zone in force, where it comes from, and the configuration's.
    pub fn zone_view(&self) -> ZoneView {
        let (zone, source) = self.shared.zone.read().unwrap_or_else(|e| e.into_inner()).clone();
        let now = jiff::Timestamp::from_millisecond(self.now()).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
        ZoneView {
            time_zone: zone::name(&zone),
            source,
            configured: zone::name(&self.shared.cfg.time_zone),
            now: now.to_zoned_datetime(zone).strftime("%Y-%m-%dT%H:%M:%S%:z").to_string(),
        }
    }

    /// Set the shop's zone (`Some(IANA name)`, stored, replacing `[ui] time_zone`) or go back to
    /// the configuration's (`None`). An unknown name is refused and nothing changes. Tasks held
    /// by a budget check it again at once, in the new zone's day.
    pub async fn set_time_zone(&self, name: Option<&str>) -> Result<ZoneView, EngineError> {
        let chosen = match name.map(str::trim) {
            Some("") => return Err(EngineError::Invalid("name a time zone, such as \"Asia/Shanghai\"".into())),
            Some(n) => Some((n.to_string(), crate::config::time_zone(Some(n)).map_err(EngineError::Invalid)?)),
            None => None,
        };
        let _one_at_a_time = self.shared.budget_lock.lock().await;
        self.shared.store.set_shop_setting(KEY, chosen.as_ref().map(|(n, _)| n.clone()), self.now()).await?;
        let (zone, source) = match chosen {
            Some((_, z)) => (z, ZoneSource::Set),
            None => (self.shared.cfg.time_zone.clone(), ZoneSource::Config),
        };
        tracing::info!(time_zone = %zone::name(&zone), "the shop's time zone changed");
        self.shared.apply_zone(zone, source);
        let limits = self.shared.limits();
        self.set_limits(limits).await?;
        Ok(self.zone_view())
    }

    /// Re-read the stored zone (SIGHUP: another node may have set it). The caller holds the
    /// budget lock or runs before anything is dispatched.
    pub(super) async fn reload_zone(&self) -> Result<(), EngineError> {
        let (zone, source) = match stored(&self.shared.store).await? {
            Some(z) => (z, ZoneSource::Set),
            None => (self.shared.cfg.time_zone.clone(), ZoneSource::Config),
        };
        self.shared.apply_zone(zone, source);
        Ok(())
    }
}
