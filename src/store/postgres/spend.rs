//! Money on PostgreSQL: the key of the budget lock. The budget check and the spend reads are
//! written once for both backends in `store::spend`, which takes this lock where transactions
//! run side by side (see its module docs).

/// The second key of the budget lock (the first is [`super::LOCK_CLASS`]; key 0 is the
/// migration lock, 1 the capped dispatch).
pub const BUDGET_KEY: i32 = 2;
