//! `tally provider list | add | edit | remove | test`: the providers added without editing
//! the config file (`POST /v1/providers` and friends, against the running daemon). The key is
//! read from standard input or from an environment variable, never from the command line
//! (which other users of the computer can see).

use std::io::Read;
use std::process::ExitCode;

use serde_json::{Value, json};

use super::client::Client;
use super::{Exit, Failure, seg, st};

/// `tally provider …`.
#[derive(Debug, clap::Subcommand)]
pub enum ProviderCommand {
    /// List the providers: kind, where each is defined, its price, its key's last characters.
    List,
    /// Add a provider; it is used at once, without a restart.
    Add(ProviderArgs),
    /// Change a provider added with `add` or in the page (only the options given).
    Edit(ProviderArgs),
    /// Remove a provider added with `add` or in the page (refused while it has jobs in flight).
    Remove {
        /// Its name.
        name: String,
    },
    /// Check its key with a free call (never a paid request).
    Test {
        /// Its name.
        name: String,
    },
}

/// A provider's settings on the command line.
#[derive(Debug, clap::Args)]
pub struct ProviderArgs {
    /// Its name.
    pub name: String,
    /// Its kind: one of the `kinds` that `GET /v1/providers` lists (docs/guide/providers/ has a page on each).
    #[arg(long)]
    pub kind: Option<String>,
    /// The model it is asked for (required by most kinds).
    #[arg(long)]
    pub model: Option<String>,
    /// The API's address, or your gateway's (http:// or https://).
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// The price of one image, in `--currency`.
    #[arg(long, value_name = "AMOUNT")]
    pub price: Option<f64>,
    /// The price's currency, three letters (USD, CNY, EUR).
    #[arg(long, value_name = "CODE")]
    pub currency: Option<String>,
    /// How many requests may be in flight at once.
    #[arg(long, value_name = "N")]
    pub max_concurrency: Option<i64>,
    /// Where you look for a request tally cannot prove (your gateway's console).
    #[arg(long, value_name = "URL")]
    pub dashboard_url: Option<String>,
    /// Read the API key from standard input (one line).
    #[arg(long)]
    pub api_key_stdin: bool,
    /// Read the API key from this environment variable (now; it is then kept in the data
    /// directory's secrets file, not read again).
    #[arg(long, value_name = "VAR")]
    pub api_key_from_env: Option<String>,
}

impl ProviderArgs {
    fn body(&self, with_name: bool) -> Result<Value, Failure> {
        let mut b = json!({});
        if with_name {
            b["name"] = json!(self.name);
        }
        for (k, v) in [
            ("kind", self.kind.as_ref().map(|v| json!(v))),
            ("model", self.model.as_ref().map(|v| json!(v))),
            ("base_url", self.base_url.as_ref().map(|v| json!(v))),
            ("price_per_image", self.price.map(|v| json!(v))),
            ("currency", self.currency.as_ref().map(|v| json!(v))),
            ("max_concurrency", self.max_concurrency.map(|v| json!(v))),
            ("dashboard_url", self.dashboard_url.as_ref().map(|v| json!(v))),
        ] {
            if let Some(v) = v {
                b[k] = v;
            }
        }
        let key = if self.api_key_stdin {
            let mut line = String::new();
            std::io::stdin()
                .read_to_string(&mut line)
                .map_err(|e| Failure::error(format!("cannot read the key from standard input: {e}")))?;
            Some(line.trim().to_string())
        } else if let Some(var) = &self.api_key_from_env {
            Some(std::env::var(var).map_err(|_| Failure::error(format!("the environment variable {var} is not set")))?)
        } else {
            None
        };
        if let Some(k) = key.filter(|k| !k.is_empty()) {
            b["api_key"] = json!(k);
        }
        Ok(b)
    }
}

fn show(list: &Value) {
    for p in list["providers"].as_array().cloned().unwrap_or_default() {
        let price = p["price_per_image"].as_f64().map(|v| format!("{v} {}", st(&p, "currency"))).unwrap_or_default();
        let key = p["api_key_hint"].as_str().map(|h| format!("key …{h}")).unwrap_or_default();
        println!("{:<16} {:<14} {:<7} {:<14} {}", st(&p, "name"), st(&p, "kind"), st(&p, "defined_in"), price, key);
    }
}

/// Run `tally provider …`.
pub(super) async fn provider_command(
    client: &Client,
    cmd: ProviderCommand,
    json_out: bool,
) -> Result<ExitCode, Failure> {
    let answer = match &cmd {
        ProviderCommand::List => client.get("/v1/providers").await?.into_ok()?,
        ProviderCommand::Add(a) => client.post("/v1/providers", &a.body(true)?).await?.into_ok()?,
        ProviderCommand::Edit(a) => {
            client.patch(&format!("/v1/providers/{}", seg(&a.name)), &a.body(false)?).await?.into_ok()?
        }
        ProviderCommand::Remove { name } => client.delete(&format!("/v1/providers/{}", seg(name))).await?.into_ok()?,
        ProviderCommand::Test { name } => {
            client.post(&format!("/v1/providers/{}/test", seg(name)), &json!({})).await?.into_ok()?
        }
    };
    if json_out {
        super::print_json(&answer);
    } else if let ProviderCommand::Test { .. } = cmd {
        println!("{}", st(&answer, "message"));
    } else {
        show(&answer);
    }
    Ok(Exit::Ok.into())
}
