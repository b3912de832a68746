//! The `s3` target's HTTP side: the client `object_store` sends through ([`Connector`]), and
//! how a failed request is sorted for a retry ([`classify`]).
//!
//! Invariants kept here (issue #38, "bounded by what tally wrote"):
//! - An answer that is not the object tally asked for is read only up to [`BODY_MAX`] bytes: an
//!   error's body (4xx, 5xx), and any body of a write or a `HEAD`. The rest is never read, so a
//!   hostile endpoint's 1 GB error page costs 4 KB. (A read-back's body, the object itself, is
//!   passed on and capped at the size written by [`super::s3`].)
//! - A 5xx or 429 answer becomes a [`ServerError`] in the error's causes, so it is recognised
//!   as "busy" ([`Class::Busy`]); object_store keeps the status of other answers private.

use std::error::Error as StdError;

use futures_util::StreamExt;
use object_store::client::{
    ClientOptions, HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse, HttpService,
};

/// The most of a body read from an answer that is not a read-back: 4 KB, plenty for an S3
/// XML error.
pub(super) const BODY_MAX: usize = 4096;

/// How a failed request ended, as far as a retry is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Class {
    /// 412 (or 409) to a conditional create: the name is taken.
    Taken,
    /// 404: no such object (or no such bucket).
    NotFound,
    /// 401/403: the credentials are wrong or lack permission (the S3 error code).
    Denied(String),
    /// The request never left: no connection could be made.
    NotSent(String),
    /// The service answered 5xx or 429 (503 SlowDown, 500 InternalError, throttling):
    /// nothing was written (and should it have been, a repeat's conditional create finds it).
    Busy(String),
    /// The request may have been sent and its answer never came (dropped or reset
    /// connection, timeout).
    MaybeSent(String),
    /// Any other answer: the request is wrong for this service and will not get better.
    Refused(String),
}

/// Sort an `object_store` error by what it means for the item.
pub(super) fn classify(err: &object_store::Error) -> Class {
    use object_store::Error as E;
    match err {
        E::AlreadyExists { .. } | E::Precondition { .. } | E::NotModified { .. } => Class::Taken,
        E::NotFound { .. } => Class::NotFound,
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => {
            Class::Denied(s3_code(&err.to_string()).unwrap_or_else(|| "access denied".into()))
        }
        _ => {
            // Walk the causes: a 5xx answer tagged by `Service`, or the transport's error.
            let mut source: Option<&(dyn StdError + 'static)> = Some(err);
            let mut http_kind = None;
            while let Some(e) = source {
                if let Some(busy) = e.downcast_ref::<ServerError>() {
                    return Class::Busy(busy.to_string());
                }
                if let Some(r) = e.downcast_ref::<reqwest::Error>() {
                    // A connect timeout is also a timeout; it is checked first because nothing
                    // left before the connection was made.
                    if r.is_connect() {
                        return Class::NotSent(cause_chain(r));
                    }
                    return Class::MaybeSent(cause_chain(r));
                }
                if let Some(h) = e.downcast_ref::<HttpError>() {
                    http_kind = Some(h.kind());
                }
                source = e.source();
            }
            match http_kind {
                Some(HttpErrorKind::Connect) => Class::NotSent(err.to_string()),
                Some(_) => Class::MaybeSent(err.to_string()),
                None => Class::Refused(s3_code(&err.to_string()).unwrap_or_else(|| err.to_string())),
            }
        }
    }
}

/// `e` and its causes on one line (reqwest's own message is often just "error sending request").
fn cause_chain(e: &(dyn StdError + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// The `<Code>` (and `<Message>`) of an S3 XML error found in `text`, e.g. "SignatureDoesNotMatch".
pub(super) fn s3_code(text: &str) -> Option<String> {
    let between = |open: &str, close: &str| {
        let start = text.find(open)? + open.len();
        let end = text[start..].find(close)? + start;
        Some(text[start..end].trim().to_string())
    };
    let code = between("<Code>", "</Code>")?;
    Some(match between("<Message>", "</Message>") {
        Some(msg) if !msg.is_empty() => format!("{code}: {msg}"),
        _ => code,
    })
}

/// A 5xx or 429 answer, turned into a transport error by [`Service`] so that it can be
/// recognised in the error's causes.
#[derive(Debug, thiserror::Error)]
#[error("{status}{}", code.as_deref().map(|c| format!(" {c}")).unwrap_or_default())]
pub(super) struct ServerError {
    status: reqwest::StatusCode,
    code: Option<String>,
}

/// object_store's HTTP client: tally's reqwest client, with bodies capped and busy answers
/// tagged (see the module doc).
#[derive(Debug)]
pub(super) struct Connector(pub(super) reqwest::Client);

impl HttpConnector for Connector {
    fn connect(&self, _options: &ClientOptions) -> object_store::Result<HttpClient> {
        Ok(HttpClient::new(Service(self.0.clone())))
    }
}

/// See [`Connector`].
#[derive(Debug)]
struct Service(reqwest::Client);

#[async_trait::async_trait]
impl HttpService for Service {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let read_object = req.method().as_str() == "GET";
        let resp = HttpService::call(&self.0, req).await?;
        let status = resp.status();
        if status.is_success() && read_object {
            return Ok(resp);
        }
        let (parts, body) = resp.into_parts();
        let head = read_at_most(body, BODY_MAX).await;
        if status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            let err = ServerError { status, code: s3_code(&String::from_utf8_lossy(&head)) };
            return Err(HttpError::new(HttpErrorKind::Unknown, err));
        }
        Ok(HttpResponse::from_parts(parts, head.into()))
    }
}

/// The first `max` bytes of `body` (fewer when it ends first, or fails: what came is kept).
/// The rest is not read; the connection is dropped with it.
async fn read_at_most(body: object_store::client::HttpResponseBody, max: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut stream = body.bytes_stream();
    while out.len() < max {
        match stream.next().await {
            Some(Ok(chunk)) => out.extend_from_slice(&chunk[..chunk.len().min(max - out.len())]),
            _ => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_error_codes_are_read_from_the_body() {
        let body = "Server returned non-2xx status code: 403 Forbidden: <?xml version=\"1.0\"?><Error>\
                    <Code>SignatureDoesNotMatch</Code><Message>The request signature we calculated does not match\
                    </Message></Error>";
        assert_eq!(
            s3_code(body).as_deref(),
            Some("SignatureDoesNotMatch: The request signature we calculated does not match")
        );
        assert_eq!(s3_code("no xml here"), None);
    }

    #[tokio::test]
    async fn a_body_is_read_only_up_to_the_bound() {
        let big = vec![b'x'; BODY_MAX * 10];
        let got = read_at_most(big.into(), BODY_MAX).await;
        assert_eq!(got.len(), BODY_MAX);
        let small = read_at_most(b"<Error/>".to_vec().into(), BODY_MAX).await;
        assert_eq!(small, b"<Error/>");
    }
}
