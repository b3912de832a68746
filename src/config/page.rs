//! Providers the owner added in the page (or with `tally provider add`): their settings in
//! `providers.json` and their keys in `secrets` (mode 0600), both in the data directory, never
//! in the database, so a backup (`tally backup` copies the database) carries no key. Each
//! entry is checked by exactly the rules of a `[[providers]]` block (`provider::resolve_provider`,
//! the kind's descriptor); the config file wins on a name both define.
//!
//! Invariant (enforced here, at every load): a `secrets` file readable or writable by anyone
//! but its owner is refused, with the command that fixes it. Writes go through a temporary file
//! made with mode 0600 and renamed into place, so a crash leaves the old file or the new one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::provider::resolve_provider;
use super::{ConfigError, RawProvider};
use crate::providers::ProviderConfig;
use crate::providers::settings::{DefinedIn, Secret};

/// The file of the page's provider settings, in the data directory.
pub const PROVIDERS_FILE: &str = "providers.json";
/// The file of their keys, in the data directory (mode 0600).
pub const SECRETS_FILE: &str = "secrets";

/// The page's providers of one data directory.
#[derive(Debug, Clone)]
pub struct PageProviders {
    dir: PathBuf,
}

/// A provider's settings as the page sends them: the keys of a `[[providers]]` block.
pub type Settings = Map<String, Value>;

impl PageProviders {
    /// The page's providers kept in `data_dir`.
    pub fn new(data_dir: &Path) -> PageProviders {
        PageProviders { dir: data_dir.to_path_buf() }
    }

    fn err(&self, file: &str, message: String) -> ConfigError {
        ConfigError::Parse { path: self.dir.join(file).display().to_string(), message }
    }

    /// Every provider defined in the page, checked, with its key.
    pub fn load(&self) -> Result<Vec<ProviderConfig>, ConfigError> {
        let all = self.settings()?;
        let keys = self.secrets()?;
        all.into_iter().enumerate().map(|(i, (name, s))| check(&name, s, keys.get(&name), i)).collect()
    }

    /// The stored settings, by name (insertion order kept by name).
    pub fn settings(&self) -> Result<BTreeMap<String, Settings>, ConfigError> {
        let path = self.dir.join(PROVIDERS_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
            Err(e) => return Err(ConfigError::Read { path, source: e }),
        };
        serde_json::from_str(&text).map_err(|e| self.err(PROVIDERS_FILE, format!("not the page's provider list: {e}")))
    }

    /// The stored keys, by provider name. A file others may read is refused.
    fn secrets(&self) -> Result<BTreeMap<String, String>, ConfigError> {
        let path = self.dir.join(SECRETS_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
            Err(e) => return Err(ConfigError::Read { path, source: e }),
        };
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).map(|m| m.permissions().mode() & 0o777).unwrap_or(0);
            if mode & 0o077 != 0 {
                return Err(self.err(
                    SECRETS_FILE,
                    format!(
                        "holds API keys but others may read it (mode {mode:o}); run `chmod 600 {}` and start again",
                        path.display()
                    ),
                ));
            }
        }
        serde_json::from_str(&text).map_err(|e| self.err(SECRETS_FILE, format!("not tally's secrets file: {e}")))
    }

    /// Check `settings` (with `key`, when given; otherwise the stored one) as the provider
    /// `name`, writing nothing.
    pub fn check(&self, name: &str, settings: Settings, key: Option<&str>) -> Result<ProviderConfig, ConfigError> {
        let stored = self.secrets()?;
        let key = key.map(str::to_string).or_else(|| stored.get(name).cloned());
        check(name, settings, key.as_ref(), 0)
    }

    /// Check `settings` (with `key`, when given; otherwise the stored one) as the provider
    /// `name` and store both. Nothing is written when the check fails.
    pub fn put(&self, name: &str, settings: Settings, key: Option<&str>) -> Result<ProviderConfig, ConfigError> {
        let mut all = self.settings()?;
        let mut keys = self.secrets()?;
        if let Some(k) = key {
            keys.insert(name.to_string(), k.trim().to_string());
        }
        let cfg = check(name, settings.clone(), keys.get(name), all.len())?;
        all.insert(name.to_string(), settings);
        self.write(SECRETS_FILE, &serde_json::to_vec_pretty(&keys).unwrap_or_default())?;
        self.write(PROVIDERS_FILE, &serde_json::to_vec_pretty(&all).unwrap_or_default())?;
        Ok(cfg)
    }

    /// Forget the provider `name` and its key. `false` when the page did not define it.
    pub fn remove(&self, name: &str) -> Result<bool, ConfigError> {
        let mut all = self.settings()?;
        let mut keys = self.secrets()?;
        if all.remove(name).is_none() {
            return Ok(false);
        }
        keys.remove(name);
        self.write(PROVIDERS_FILE, &serde_json::to_vec_pretty(&all).unwrap_or_default())?;
        self.write(SECRETS_FILE, &serde_json::to_vec_pretty(&keys).unwrap_or_default())?;
        Ok(true)
    }

    /// Write `file` whole: a temporary file with mode 0600, fsynced, renamed into place.
    fn write(&self, file: &str, bytes: &[u8]) -> Result<(), ConfigError> {
        use std::io::Write;
        let path = self.dir.join(file);
        let tmp = self.dir.join(format!(".{file}.tmp"));
        let io = |e: std::io::Error| ConfigError::Read { path: path.clone(), source: e };
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut f = opts.open(&tmp).map_err(io)?;
        f.write_all(bytes).map_err(io)?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(io)?;
        Ok(())
    }
}

/// One page provider checked by the config's rules, with its key.
fn check(name: &str, mut settings: Settings, key: Option<&String>, i: usize) -> Result<ProviderConfig, ConfigError> {
    settings.insert("name".into(), Value::String(name.to_string()));
    let raw: RawProvider = serde_json::from_value(Value::Object(settings)).map_err(|e| ConfigError::Invalid {
        path: "the page".into(),
        key: format!("providers.{name}"),
        reason: e.to_string(),
    })?;
    let mut cfg = resolve_provider(raw, i, "the page")?;
    cfg.defined_in = DefinedIn::Page;
    cfg.api_key = key.map(|k| Secret::new(k));
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(v: Value) -> Settings {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn keys_live_in_a_private_file_and_settings_are_checked_like_the_config() {
        let dir = std::env::temp_dir().join(format!("tally-page-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let page = PageProviders::new(&dir);
        let s = settings(
            serde_json::json!({"kind": "openai_images", "base_url": "http://127.0.0.1:9", "price_per_image": 0.04}),
        );
        let cfg = page.put("oa", s, Some("sk-page-secret-1234")).expect("put");
        assert_eq!(
            (cfg.defined_in, cfg.api_key.as_ref().map(Secret::hint).as_deref()),
            (DefinedIn::Page, Some("1234"))
        );
        let text = std::fs::read_to_string(dir.join(PROVIDERS_FILE)).expect("settings");
        assert!(!text.contains("sk-page-secret"), "the key is not in the settings: {text}");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.join(SECRETS_FILE)).expect("secrets").permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }
        assert_eq!(page.load().expect("load")[0].api_key.as_ref().map(Secret::expose), Some("sk-page-secret-1234"));
        // A bad base URL is refused by the config's rule and nothing is written.
        let bad = settings(serde_json::json!({"kind": "openai_images", "base_url": "ftp://x"}));
        let e = page.put("bad", bad, Some("k")).unwrap_err().to_string();
        assert!(e.contains("base_url"), "{e}");
        assert!(!page.settings().expect("settings").contains_key("bad"));
        // A secrets file others may read stops the load, saying how to fix it.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.join(SECRETS_FILE), std::fs::Permissions::from_mode(0o644)).expect("chmod");
            let e = page.load().unwrap_err().to_string();
            assert!(e.contains("chmod 600"), "{e}");
            std::fs::set_permissions(dir.join(SECRETS_FILE), std::fs::Permissions::from_mode(0o600)).expect("chmod");
        }
        assert!(page.remove("oa").expect("remove"));
        assert!(page.load().expect("load").is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
