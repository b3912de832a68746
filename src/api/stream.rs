//! `GET /v1/stream`: server-sent events for live views. Each task status change from
//! [`crate::engine::Engine::subscribe`] becomes an event `task` with data `{"id","status"}`;
//! each change of a delivery or one of its items ([`crate::engine::Engine::subscribe_deliveries`])
//! becomes an event `delivery` with data `{"id","set_id"}` (re-read the delivery); a
//! subscriber that fell behind gets one event `resync` (it should re-read what it shows).
//! A keep-alive comment goes out every 15 s, and only while a client is connected: the timer
//! lives in the response body, which exists only as long as the connection does.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream};
use serde_json::json;
use tokio::sync::broadcast::Receiver;
use tokio::sync::broadcast::error::RecvError;

use crate::engine::deliver::DeliveryChange;

use crate::api::AppState;

/// How often an idle stream sends a keep-alive comment.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// `GET /v1/stream`: the event stream (ends when the server stops).
#[utoipa::path(
    get,
    path = "/stream",
    operation_id = "stream_events",
    tag = "session",
    responses((status = 200, description = "Server-sent events: `task` with data `{\"id\", \"status\"}` for every \
        task status change; `delivery` with data `{\"id\", \"set_id\"}` when a delivery or one of its files \
        changed (re-read it); `resync` (data `{}`) on connect and when the client fell behind (re-read what you \
        show); a `keep-alive` comment every 15 s. Ends when the server stops.", content(("text/event-stream"))))
)]
pub async fn stream(
    State(state): State<AppState>,
    credential: Option<axum::Extension<crate::api::auth::Credential>>,
) -> Response {
    let changes = state.engine().subscribe();
    let deliveries = state.engine().subscribe_deliveries();
    let closing = state.closing();
    // A stream opened with a session cookie ends when that session does (signed out, or
    // every session ended): the page then asks to sign in again.
    let session = match credential {
        Some(axum::Extension(crate::api::auth::Credential::Session(id))) => {
            Some((id, state.sessions().subscribe_ended()))
        }
        _ => None,
    };
    let events = events(changes, deliveries, closing, session);
    Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive")).into_response()
}

/// The next delivery change, or never when there are no deliveries (or their sender is gone).
async fn next_delivery(d: &mut Option<Receiver<DeliveryChange>>) -> Result<DeliveryChange, RecvError> {
    match d {
        Some(rx) => match rx.recv().await {
            Err(RecvError::Closed) => {
                *d = None;
                std::future::pending().await
            }
            other => other,
        },
        None => std::future::pending().await,
    }
}

/// Resolves when the session `s` ends (never for a stream without a session).
async fn session_ended(s: &mut Option<(String, Receiver<Option<String>>)>) {
    let Some((id, rx)) = s else { return std::future::pending().await };
    loop {
        match rx.recv().await {
            Ok(Some(ended)) if ended != *id => continue,
            // This session, every session, or news lost: end (a page still signed in reconnects).
            _ => return,
        }
    }
}

fn events(
    changes: Receiver<crate::engine::TaskChange>,
    deliveries: Option<Receiver<DeliveryChange>>,
    closing: tokio::sync::watch::Receiver<bool>,
    session: Option<(String, Receiver<Option<String>>)>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    // The first event tells the page the stream is live (and lets it re-read what it shows,
    // since changes made before it connected were not streamed).
    let hello = stream::once(async { Ok(Event::default().event("resync").data("{}")) });
    let rest = stream::unfold(
        (changes, deliveries, closing, session),
        |(mut changes, mut deliveries, mut closing, mut session)| async move {
            if *closing.borrow() {
                return None;
            }
            let event = tokio::select! {
                r = changes.recv() => match r {
                    Ok(c) => Event::default()
                        .event("task")
                        .data(json!({ "id": c.task_id, "status": c.status.as_str() }).to_string()),
                    Err(RecvError::Lagged(missed)) => {
                        tracing::debug!(missed, "event stream fell behind; asking the page to re-read");
                        Event::default().event("resync").data("{}")
                    }
                    Err(RecvError::Closed) => return None,
                },
                r = next_delivery(&mut deliveries) => match r {
                    Ok(c) => Event::default()
                        .event("delivery")
                        .data(json!({ "id": c.delivery_id, "set_id": c.set_id }).to_string()),
                    Err(_) => Event::default().event("resync").data("{}"),
                },
                _ = closing.wait_for(|c| *c) => return None,
                _ = session_ended(&mut session) => return None,
            };
            Some((Ok(event), (changes, deliveries, closing, session)))
        },
    );
    stream::StreamExt::chain(hello, rest)
}
