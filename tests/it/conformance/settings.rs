//! Settings kept across restarts, on both backends: the budget set at run time (one row,
//! replaced or removed whole) and the web page's sessions (found by the hash of the cookie,
//! touched on use, expired after their idle time, ended one by one or all at once).

use tally::store::Store;
use tally::store::settings::StoredSession;

use super::both;
use super::fixtures::int;
use super::single::T0;

both!(a_budget_set_at_run_time_is_kept_replaced_and_removed, sessions_are_kept_touched_expired_and_ended);

async fn a_budget_set_at_run_time_is_kept_replaced_and_removed(s: Store) {
    assert_eq!(s.budget_setting().await.expect("read"), None, "a new store has none: the config's applies");
    s.set_budget_setting(Some("{\"limits\":[1]}".into()), T0).await.expect("set");
    assert_eq!(s.budget_setting().await.expect("read").as_deref(), Some("{\"limits\":[1]}"));
    s.set_budget_setting(Some("{\"limits\":[2]}".into()), T0 + 1).await.expect("replace");
    assert_eq!(s.budget_setting().await.expect("read").as_deref(), Some("{\"limits\":[2]}"), "one row, replaced");
    assert_eq!(int(&s, "SELECT count(*) FROM budget_setting").await, 1);
    s.set_budget_setting(None, T0 + 2).await.expect("remove");
    assert_eq!(s.budget_setting().await.expect("read"), None);
}

async fn sessions_are_kept_touched_expired_and_ended(s: Store) {
    s.insert_session("h1".into(), "csrf1".into(), Some("iPhone · Safari".into()), T0).await.expect("insert");
    s.insert_session("h2".into(), "csrf2".into(), None, T0).await.expect("insert");
    let got = s.session("h1".into()).await.expect("read");
    assert_eq!(got, Some(StoredSession { csrf: "csrf1".into(), created_at: T0, last_used_at: T0 }));
    assert_eq!(s.session("nope".into()).await.expect("read"), None);
    // h1 is used later; h2 not: expiring everything unused since T0 + 5 keeps only h1.
    s.touch_session("h1".into(), T0 + 10, T0 + 5).await.expect("touch");
    assert_eq!(s.session("h1".into()).await.expect("read").map(|x| x.last_used_at), Some(T0 + 10));
    assert_eq!(s.session("h2".into()).await.expect("read"), None, "an idle session expires");
    s.insert_session("h3".into(), "csrf3".into(), Some("Android · 微信".into()), T0 + 10).await.expect("insert");
    // The list: in use since the cutoff, the most recently used first, with their devices.
    let listed = s.sessions(T0 + 5).await.expect("list");
    let seen: Vec<(&str, Option<&str>, i64)> =
        listed.iter().map(|r| (r.id_hash.as_str(), r.device.as_deref(), r.last_used_at)).collect();
    assert_eq!(seen, vec![("h1", Some("iPhone · Safari"), T0 + 10), ("h3", Some("Android · 微信"), T0 + 10)]);
    assert!(s.sessions(T0 + 11).await.expect("list").is_empty(), "idle ones are not listed");
    assert_eq!(s.delete_sessions(Some("h1".into())).await.expect("end one"), 1);
    assert_eq!(s.session("h1".into()).await.expect("read"), None);
    assert_eq!(s.delete_sessions(None).await.expect("end all"), 1);
    assert_eq!(s.session("h3".into()).await.expect("read"), None);
}
