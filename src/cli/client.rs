//! The CLI's HTTP client: finds the daemon (the address a running `tally serve` wrote into
//! the data dir, else `server.listen`) and its token (`<data_dir>/api-token`) from the same
//! configuration as `tally serve`, and turns API errors into plain messages.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

use crate::api::auth::read_token;
use crate::app::Failure;
use crate::app::base_url;
use crate::config::Config;

/// A client for one daemon.
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
    /// The owner's language (`ui.language`, else English): the daemon answers in it, and the
    /// CLI's own words follow it.
    lang: crate::domain::Lang,
}

/// An answer from the API: its status and JSON body.
#[allow(missing_docs)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Value,
}

impl Answer {
    /// The error code of an error answer (`{"error": {"code"}}`).
    pub fn error_code(&self) -> Option<&str> {
        self.body.pointer("/error/code").and_then(Value::as_str)
    }

    /// Turn an error answer into a failure with the API's message.
    pub fn into_ok(self) -> Result<Value, Failure> {
        if self.status.is_success() {
            return Ok(self.body);
        }
        let message = self
            .body
            .pointer("/error/message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| format!("the daemon answered {}", self.status));
        // Say what to do next where the daemon's words cannot (it does not know the CLI).
        let hint = match (self.error_code(), message.as_str()) {
            (Some("not_found"), "task not found") => "; `tally list` shows the jobs' ids (the first column)",
            (Some("not_found"), "set not found") => "; `tally set list` shows the sets' ids (the first column)",
            _ => "",
        };
        Err(Failure::error(format!("{message}{hint}")))
    }
}

impl Client {
    /// A client for the daemon `cfg` describes.
    pub fn new(cfg: &Config) -> Result<Client, Failure> {
        let token_path = cfg.token_path();
        let token = read_token(&token_path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Failure::error(format!(
                    "no API token at {}; is `tally serve` running with this data directory?",
                    token_path.display()
                ))
            } else {
                Failure::error(format!("cannot read the API token {}: {e}", token_path.display()))
            }
        })?;
        // reqwest is built without a default TLS crypto provider; install ring once.
        let _ = rustls::crypto::ring::default_provider().install_default();
        // The owner's language (`ui.language`): the daemon answers its sentences in it.
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(lang) = cfg.ui.language {
            headers.insert(reqwest::header::ACCEPT_LANGUAGE, reqwest::header::HeaderValue::from_static(lang.tag()));
        }
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .no_proxy()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| Failure::error(format!("cannot build the HTTP client: {e}")))?;
        // A running daemon of this data dir says where it listens (it may have been started
        // with `--listen`); else the configured address.
        let listen = crate::app::served_address(&cfg.storage.data_dir).unwrap_or(cfg.server.listen);
        Ok(Client { http, base: base_url(listen), token, lang: cfg.ui.language.unwrap_or(crate::domain::Lang::En) })
    }

    /// The language the CLI speaks (`ui.language`, else English).
    pub fn lang(&self) -> crate::domain::Lang {
        self.lang
    }

    /// The shop's zone in force, as the daemon says (`GET /v1/time-zone`); `None` if it cannot.
    pub async fn zone(&self) -> Option<jiff::tz::TimeZone> {
        let a = self.get("/v1/time-zone").await.ok()?;
        let name = a.body.get("time_zone")?.as_str()?;
        jiff::tz::TimeZone::get(name).ok()
    }

    /// The daemon's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<Answer, Failure> {
        let resp = req.bearer_auth(&self.token).send().await.map_err(|e| self.send_error(e))?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| Failure::error(format!("cannot read the daemon's answer: {e}")))?;
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .map_err(|_| Failure::error(format!("the daemon answered {status} without JSON")))?
        };
        Ok(Answer { status, body })
    }

    /// `GET path` whose successful answer is text (CSV); an error answer becomes its
    /// `{"error"}` message.
    pub async fn get_text(&self, path: &str) -> Result<String, Failure> {
        let req = self.http.get(format!("{}{path}", self.base)).bearer_auth(&self.token);
        let resp = req.send().await.map_err(|e| self.send_error(e))?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| Failure::error(format!("cannot read the daemon's answer: {e}")))?;
        if status.is_success() {
            return Ok(text);
        }
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Answer { status, body }.into_ok().map(|_| String::new())
    }

    /// `GET path` for bytes that are not JSON (a set's zip): the answer's status, its
    /// `Content-Disposition` file name if any, and the body; `timeout` bounds the whole
    /// download. An error answer is turned into a failure with the API's message.
    pub async fn get_bytes(&self, path: &str, timeout: Duration) -> Result<(Option<String>, Vec<u8>), Failure> {
        let req = self.http.get(format!("{}{path}", self.base)).timeout(timeout).bearer_auth(&self.token);
        let resp = req.send().await.map_err(|e| self.send_error(e))?;
        let status = resp.status();
        let name = resp
            .headers()
            .get(reqwest::header::CONTENT_DISPOSITION)
            .and_then(|v| v.to_str().ok())
            .and_then(crate::api::download::disposition_file_name);
        let bytes = resp.bytes().await.map_err(|e| Failure::error(format!("the download was cut off: {e}")))?;
        if !status.is_success() {
            let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            return Answer { status, body }.into_ok().map(|_| (None, Vec::new()));
        }
        Ok((name, bytes.to_vec()))
    }

    fn send_error(&self, e: reqwest::Error) -> Failure {
        if e.is_connect() {
            Failure::error(format!("cannot reach the tally daemon at {}: is `tally serve` running?", self.base))
        } else {
            Failure::error(format!("request to {} failed: {e}", self.base))
        }
    }

    /// `GET path` (relative to the base URL).
    pub async fn get(&self, path: &str) -> Result<Answer, Failure> {
        self.send(self.http.get(format!("{}{path}", self.base))).await
    }

    /// `POST path` with raw bytes of a content type (uploads).
    pub async fn post_bytes(&self, path: &str, content_type: &str, bytes: Vec<u8>) -> Result<Answer, Failure> {
        let req = self.http.post(format!("{}{path}", self.base)).header(reqwest::header::CONTENT_TYPE, content_type);
        self.send(req.body(bytes)).await
    }

    /// `PUT path` with a JSON body.
    pub async fn put(&self, path: &str, body: &Value) -> Result<Answer, Failure> {
        self.send(self.http.put(format!("{}{path}", self.base)).json(body)).await
    }

    /// `PATCH path` with a JSON body.
    pub async fn patch(&self, path: &str, body: &Value) -> Result<Answer, Failure> {
        self.send(self.http.patch(format!("{}{path}", self.base)).json(body)).await
    }

    /// `DELETE path`.
    pub async fn delete(&self, path: &str) -> Result<Answer, Failure> {
        self.send(self.http.delete(format!("{}{path}", self.base))).await
    }

    /// `POST path` with a JSON body.
    pub async fn post(&self, path: &str, body: &Value) -> Result<Answer, Failure> {
        self.send(self.http.post(format!("{}{path}", self.base)).json(body)).await
    }
}
