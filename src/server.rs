//! The HTTP listener of `tally serve`: accepts connections for the API router with bounds that
//! keep any local process from exhausting the daemon (idle or slow connections once held file
//! descriptors until saving a paid image failed):
//!
//! - at most [`MAX_CONNECTIONS`] open connections; at the cap, tally stops accepting (new
//!   connections wait in the kernel's backlog, holding no descriptor of tally's) until one
//!   closes;
//! - a connection must send a complete request head within [`HEADER_TIMEOUT`] of opening or of
//!   its previous answer (hyper's header-read timeout, which also closes idle keep-alive
//!   connections);
//! - a request body must arrive completely within [`BODY_DEADLINE`] of the request head
//!   ([`deadline_body`]); a slower one is answered 400 and its connection closed.
//!
//! A long-lived event stream (`GET /v1/stream`) counts as one connection. A clean stop stops
//! accepting, lets open requests finish for up to the drain time, then drops the rest.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::middleware::Next;
use futures_util::StreamExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The most connections tally keeps open at once.
pub const MAX_CONNECTIONS: usize = 256;
/// How long a connection may take to send a request's head (or stay idle between requests).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request's body may take to arrive, in total.
pub const BODY_DEADLINE: Duration = Duration::from_secs(15);

/// The bounds a server applies (the constants above, smaller in tests).
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub body_deadline: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_connections: MAX_CONNECTIONS, header_timeout: HEADER_TIMEOUT, body_deadline: BODY_DEADLINE }
    }
}

impl Limits {
    /// The default limits for this process: first raise the soft limit on open files to the
    /// hard one, then keep connections to a quarter of it (at most [`MAX_CONNECTIONS`]), so the
    /// database, its readers and the image files always have descriptors left.
    pub fn for_this_process() -> Limits {
        let files = raise_open_files_limit();
        let max_connections = MAX_CONNECTIONS.min((files / 4).max(8) as usize);
        if max_connections < MAX_CONNECTIONS {
            tracing::info!(open_files = files, max_connections, "few open files allowed: fewer connections");
        }
        Limits { max_connections, ..Limits::default() }
    }
}

/// Raise `RLIMIT_NOFILE`'s soft limit to its hard limit and return the soft limit in force.
fn raise_open_files_limit() -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed to them.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let want = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    lim.rlim_cur
}

/// Connections the kernel may queue for tally while it is at its connection cap (they hold
/// no descriptor of tally's until accepted). The standard library's default is 128.
pub const BACKLOG: u32 = 1024;

/// Bind a listening socket on `addr` with a [`BACKLOG`]-long queue.
pub fn listen(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// This computer's address on the shop's network: the IPv4 address its default route leaves
/// from. Found by connecting a UDP socket to a documentation address (RFC 5737), which sends
/// nothing; an error says in plain words why there is none.
pub fn lan_address() -> Result<std::net::Ipv4Addr, String> {
    let socket = std::net::UdpSocket::bind(("0.0.0.0", 0)).map_err(|e| format!("cannot open a socket: {e}"))?;
    socket
        .connect(("203.0.113.1", 9))
        .map_err(|e| format!("this computer has no route to a network ({e}); is it connected to the shop's Wi-Fi?"))?;
    match socket.local_addr().map_err(|e| format!("cannot read the socket's address: {e}"))?.ip() {
        std::net::IpAddr::V4(a) if !a.is_loopback() && !a.is_unspecified() => Ok(a),
        other => Err(format!("this computer's only address is {other}, which other devices cannot reach")),
    }
}

/// A listener on `ip` and the same `port` as loopback, for `--lan`: `ip` is
/// `server.lan_address`, else [`lan_address`]. An error says why, in plain words.
pub fn lan_listener(ip: Option<std::net::Ipv4Addr>, port: u16) -> Result<(TcpListener, std::net::SocketAddr), String> {
    let ip = match ip {
        Some(ip) => ip,
        None => lan_address()?,
    };
    let addr = std::net::SocketAddr::from((ip, port));
    let listener = listen(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| format!("cannot read the address of {addr}: {e}"))?;
    Ok((listener, local))
}

/// `--lan` at start-up, beside the listener on `local`: a listener on the shop's network on
/// the same port (none when `local` already is not loopback: `server.listen` covers it), and
/// the address pairing links name.
pub fn open_lan(
    ip: Option<std::net::Ipv4Addr>,
    local: std::net::SocketAddr,
) -> Result<(Option<TcpListener>, std::net::SocketAddr), String> {
    if local.ip().is_loopback() {
        return lan_listener(ip, local.port()).map(|(l, a)| (Some(l), a));
    }
    let ip = match ip {
        Some(ip) => ip,
        None => lan_address()?,
    };
    Ok((None, std::net::SocketAddr::from((ip, local.port()))))
}

/// Serve `router` on `listeners` (loopback, and the shop's network with `--lan`) until
/// `shutdown` resolves, then drain for at most `drain`. The connection cap counts
/// connections on all of them together.
pub async fn serve(
    listeners: Vec<TcpListener>,
    router: Router,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()>,
    drain: Duration,
) {
    let deadline = limits.body_deadline;
    let router = router.layer(axum::middleware::from_fn(move |req: Request, next: Next| async move {
        next.run(deadline_body(req, deadline)).await
    }));
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).keep_alive(true);
    tokio::pin!(shutdown);
    let mut at_cap_said = false;
    loop {
        // A slot first: at the cap, nothing more is accepted until a connection closes.
        let slot = if let Ok(s) = slots.clone().try_acquire_owned() {
            s
        } else {
            if !at_cap_said {
                tracing::warn!(max = limits.max_connections, "the connection limit is reached; new ones wait");
                at_cap_said = true;
            }
            tokio::select! {
                s = slots.clone().acquire_owned() => match s { Ok(s) => s, Err(_) => break },
                _ = &mut shutdown => break,
            }
        };
        if slots.available_permits() > limits.max_connections / 2 {
            at_cap_said = false;
        }
        let accept = futures_util::future::select_all(listeners.iter().map(|l| Box::pin(l.accept())));
        let (stream, peer) = tokio::select! {
            (r, _, _) = accept => match r {
                Ok(s) => s,
                Err(e) => {
                    // Out of descriptors or similar: wait a moment instead of spinning.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    drop(slot);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        // Each request knows the address it came from (`Peer`): some routes are for this
        // computer only.
        let svc = router.clone().layer(axum::Extension(Peer(peer)));
        let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(slot);
        });
    }
    drop(listeners);
    if tokio::time::timeout(drain, graceful.shutdown()).await.is_err() {
        tracing::warn!("open HTTP connections did not finish in time; stopping without them");
    }
}

/// Give a request's body a total deadline: if it has not arrived completely `deadline` after
/// the head, reading it fails (the handler answers 400, and the connection is closed since its
/// body was not read to the end).
pub fn deadline_body(req: Request, deadline: Duration) -> Request {
    let (parts, body) = req.into_parts();
    let until = tokio::time::Instant::now() + deadline;
    let data = body.into_data_stream();
    let stream = futures_util::stream::unfold(Some(data), move |state| async move {
        let mut data = state?;
        match tokio::time::timeout_at(until, data.next()).await {
            Ok(Some(Ok(chunk))) => Some((Ok(chunk), Some(data))),
            Ok(Some(Err(e))) => Some((Err(std::io::Error::other(e)), None)),
            Ok(None) => None,
            Err(_) => Some((
                Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the request body did not arrive in time")),
                None,
            )),
        }
    });
    Request::from_parts(parts, Body::from_stream(stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body that trickles in is cut at the deadline; a prompt one is passed whole.
    #[tokio::test]
    async fn a_slow_body_fails_at_its_deadline() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<axum::body::Bytes, std::io::Error>>(4);
        let slow = Body::from_stream(tokio_stream_from(rx));
        let req = deadline_body(Request::new(slow), Duration::from_millis(50));
        tx.send(Ok(axum::body::Bytes::from_static(b"{\"a\":"))).await.expect("send");
        let read = axum::body::to_bytes(req.into_body(), 1 << 20).await;
        assert!(read.is_err(), "a body that never finished was read as complete: {read:?}");
        drop(tx);

        let req = deadline_body(Request::new(Body::from("{\"a\": 1}")), Duration::from_millis(50));
        assert_eq!(axum::body::to_bytes(req.into_body(), 1 << 20).await.expect("read").as_ref(), b"{\"a\": 1}");
    }

    fn tokio_stream_from<T: Send + 'static>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> + Send {
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}

/// The address a request's connection came from (a request extension set per connection).
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub std::net::SocketAddr);
