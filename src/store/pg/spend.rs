//! Money on PostgreSQL: the key of the budget lock. The budget check and the spend reads are
//! written once for both backends in `store::spend`, which takes this lock where transactions
//! run side by side (see its module docs).

use super::Tx;
use crate::domain::{Micros, Millis};
use crate::store::StoreError;
use crate::store::spend::Limit;

/// The second key of the budget lock (the first is [`super::LOCK_CLASS`]; key 0 is the
/// migration lock, 1 the capped dispatch).
pub const BUDGET_KEY: i32 = 2;

/// `store::spend::budget_check` for a PostgreSQL transaction: take the budget lock for a call
/// of `provider` costing `cost` and decide whether it fits `limits` (`None` when it does,
/// else when it can next fit and why).
pub(super) fn check(
    tx: &mut Tx<'_, '_>,
    provider: &str,
    cost: Micros,
    limits: &[Limit],
    now: Millis,
) -> Result<Option<(Millis, String)>, StoreError> {
    crate::store::spend::budget_check(tx, provider, cost, limits, now)
}
