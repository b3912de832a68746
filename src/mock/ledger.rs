//! The mock provider's ledger file: one JSON line per API request, appended and fsync'd
//! before the answer leaves, serialised so lines never interleave.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::Serialize;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

/// One ledger line.
#[derive(Debug, Serialize)]
pub struct Entry<'a> {
    pub ts: String,
    pub api: &'a str,
    pub endpoint: &'a str,
    pub prompt: Option<&'a str>,
    pub idempotency_key: Option<&'a str>,
    pub job_id: Option<&'a str>,
    pub charged: bool,
    pub reference_images: usize,
}

impl Entry<'_> {
    /// Now, as RFC 3339 UTC with milliseconds.
    pub fn now() -> String {
        humantime::format_rfc3339_millis(SystemTime::now()).to_string()
    }
}

/// The append-only ledger file.
pub struct Ledger {
    path: PathBuf,
    file: Mutex<tokio::fs::File>,
}

impl Ledger {
    /// Open (creating if needed) the ledger for appending.
    pub async fn open(path: &Path) -> std::io::Result<Self> {
        let file = tokio::fs::OpenOptions::new().create(true).append(true).open(path).await?;
        Ok(Ledger { path: path.to_path_buf(), file: Mutex::new(file) })
    }

    /// Append one line and fsync it.
    pub async fn append(&self, entry: &Entry<'_>) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(entry).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let mut file = self.file.lock().await;
        file.write_all(&line).await?;
        file.flush().await?;
        file.sync_data().await
    }

    /// Every line so far, parsed (a line that does not parse is skipped).
    pub async fn read_all(&self) -> std::io::Result<Vec<Value>> {
        let _writer = self.file.lock().await;
        let text = tokio::fs::read_to_string(&self.path).await?;
        Ok(text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
    }
}
