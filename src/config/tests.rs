//! Unit tests of configuration parsing and checks.

use super::*;

#[test]
fn empty_config_gives_demo_on_loopback() {
    let c = Config::from_toml("", "t.toml").unwrap();
    assert_eq!(c.server.listen.to_string(), DEFAULT_LISTEN);
    assert_eq!(c.providers.len(), 1);
    assert_eq!(c.providers[0].kind, ProviderKind::Demo);
    assert_eq!(c.storage.durability, Durability::Full);
}

#[test]
fn unknown_key_names_file_and_key() {
    let e = Config::from_toml("[engine]\nworkerz = 3\n", "my.toml").unwrap_err().to_string();
    assert!(e.contains("my.toml") && e.contains("workerz"), "{e}");
}

#[test]
fn bad_value_names_key_and_reason() {
    let e = Config::from_toml("[storage]\ndurability = \"off\"\n", "my.toml").unwrap_err().to_string();
    assert!(e.contains("storage.durability") && e.contains("off"), "{e}");
    let e = Config::from_toml("[[providers]]\nname = \"x\"\nkind = \"dalle\"\n", "my.toml").unwrap_err().to_string();
    assert!(e.contains("providers[0].kind"), "{e}");
}

#[test]
fn prices_and_budgets_are_checked() {
    // Any paid kind that needs no model.
    let kind = ProviderKind::OpenaiImages.as_str();
    let paid = format!("[[providers]]\nname = \"a\"\nkind = \"{kind}\"\nbase_url = \"http://x\"\n");
    let c = Config::from_toml(
        &format!("[budget]\ndaily = 5\n{paid}price_per_image = 0.04\nprice_per_size = {{ \"1536x1024\" = 0.06 }}\n"),
        "t",
    )
    .unwrap();
    let p = &c.providers[0].pricing;
    assert_eq!((p.price("1024x1024"), p.price("1536x1024")), (Some(40_000), Some(60_000)));
    assert_eq!((c.budget.daily, c.budget.currency.as_deref()), (Some(5_000_000), Some("USD")));
    let e = Config::from_toml(&format!("[budget]\ndaily = 5\n{paid}"), "t").unwrap_err().to_string();
    assert!(e.contains("budget") && e.contains("price_per_image"), "{e}");
    let e = Config::from_toml(&format!("{paid}price_per_image = -1\n"), "t").unwrap_err().to_string();
    assert!(e.contains("providers[0].price_per_image"), "{e}");
    let two = format!(
        "{paid}price_per_image = 1\n[[providers]]\nname = \"b\"\nkind = \"{kind}\"\nbase_url = \"http://y\"\nprice_per_image = 1\ncurrency = \"EUR\"\n"
    );
    // Several currencies are fine; a budget for the whole daemon must then name its own.
    let c = Config::from_toml(&two, "t").unwrap();
    assert_eq!(c.budget.currency, None);
    let e = Config::from_toml(&format!("[budget]\ndaily = 5\n{two}"), "t").unwrap_err().to_string();
    assert!(e.contains("key `budget`") && e.contains("EUR, USD") && e.contains("currency ="), "{e}");
    let c = Config::from_toml(&format!("[budget]\ndaily = 5\ncurrency = \"EUR\"\n{two}"), "t").unwrap();
    assert_eq!((c.budget.daily, c.budget.currency.as_deref()), (Some(5_000_000), Some("EUR")));
    let e = Config::from_toml(&format!("[budget]\ndaily = 5\ncurrency = \"CNY\"\n{two}"), "t").unwrap_err().to_string();
    assert!(e.contains("budget.currency") && e.contains("CNY"), "{e}");
    let e = Config::from_toml("[[providers]]\nname = \"d\"\nkind = \"demo\"\nprice_per_image = 1\n", "t")
        .unwrap_err()
        .to_string();
    assert!(e.contains("never charges"), "{e}");
}

#[test]
fn backend_defaults_to_sqlite_and_node_to_the_host_name() {
    let c = Config::from_toml("", "t").unwrap();
    assert_eq!(c.storage.backend, Backend::Sqlite);
    assert_eq!(c.node.name, default_node_name());
    assert!(check_node_name(&c.node.name).is_ok(), "{}", c.node.name);
}

#[test]
fn postgres_backend_keys_are_validated() {
    let pg = "[storage]\nbackend = \"postgres\"\npostgres_url = \"postgres://u:secret@db:5432/tally\"\n[node]\nname = \"shop-1\"\n";
    let c = Config::from_toml(pg, "t").unwrap();
    let Backend::Postgres(p) = &c.storage.backend else { panic!("not postgres: {:?}", c.storage.backend) };
    assert_eq!((p.connections, p.wakeups), (4, Wakeups::Notify));
    assert_eq!(c.node.name, "shop-1");
    assert!(!format!("{c:?}").contains("secret"), "the password must not appear in Debug output");
    for (text, key) in [
        ("[storage]\nbackend = \"mysql\"\n", "storage.backend"),
        ("[storage]\nbackend = \"postgres\"\n", "storage.postgres_url"),
        ("[storage]\npostgres_url = \"postgres://x/y\"\n", "storage.postgres_url"),
        ("[storage]\nbackend = \"postgres\"\npostgres_url = \"mysql://x/y\"\n", "storage.postgres_url"),
        (
            "[storage]\nbackend = \"postgres\"\npostgres_url_env = \"TALLY_TEST_SURELY_UNSET_VAR\"\n",
            "storage.postgres_url_env",
        ),
        (
            "[storage]\nbackend = \"postgres\"\npostgres_url = \"postgres://x/y\"\npostgres_wakeups = \"sometimes\"\n",
            "storage.postgres_wakeups",
        ),
        (
            "[storage]\nbackend = \"postgres\"\npostgres_url = \"postgres://x/y\"\npostgres_poll_ms = 100\n",
            "storage.postgres_poll_ms",
        ),
        ("[node]\nname = \"two words\"\n", "node.name"),
    ] {
        let e = Config::from_toml(text, "t").unwrap_err().to_string();
        assert!(e.contains(key), "{text:?} should name {key}: {e}");
    }
    let poll =
        format!("{pg}postgres_wakeups = \"poll\"\npostgres_poll_ms = 250\n").replace("[node]\nname = \"shop-1\"\n", "");
    let Backend::Postgres(p) = Config::from_toml(&poll, "t").unwrap().storage.backend else { panic!() };
    assert_eq!(p.wakeups, Wakeups::Poll(Duration::from_millis(250)));
}

#[test]
fn a_url_password_is_redacted() {
    assert_eq!(redact_url("postgres://u:pw@h:5/db?x=1"), "postgres://u:***@h:5/db?x=1");
    assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
    assert_eq!(redact_url("postgres://h/db"), "postgres://h/db");
}

/// Every `[[providers]]` example of the provider guide (docs/guide/providers/*.md: each
/// ```` ```toml ```` block that starts with `[[providers]]`), in one configuration, in the
/// pages' name order.
pub(crate) fn documented_provider_examples() -> String {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/guide/providers");
    let mut pages: Vec<_> = std::fs::read_dir(&dir)
        .expect("docs/guide/providers")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    let mut out = String::new();
    for page in pages {
        let text = std::fs::read_to_string(&page).expect("read page");
        let mut rest = text.as_str();
        while let Some(i) = rest.find("```toml\n[[providers]]") {
            let start = i + 8;
            let end = start + rest[start..].find("```").expect("closed");
            out.push_str(&rest[start..end]);
            out.push('\n');
            rest = &rest[end..];
        }
    }
    out
}

#[test]
fn the_guide_provider_examples_are_a_valid_config() {
    let examples = documented_provider_examples();
    let c = Config::from_toml(&examples, "docs/guide/providers").unwrap();
    let models: Vec<_> = c.providers.iter().filter_map(|p| p.model.as_deref()).collect();
    assert!(models.contains(&"fal-ai/flux/dev") && models.contains(&"black-forest-labs/flux-schnell"), "{models:?}");
    // Every kind tally ships that makes images has an example (read from the descriptors, so
    // a kind's name stands in its own files only; the drafting kinds' pages show their keys).
    let makes_images = |k: &crate::providers::kinds::ProviderKind| {
        k.spec().operations.iter().any(|o| *o != crate::domain::operation::Operation::Draft)
    };
    for kind in crate::providers::kinds::ProviderKind::all().filter(makes_images) {
        assert!(c.providers.iter().any(|p| p.kind == kind), "no example of {}", kind.as_str());
    }
}

/// The provider guide's examples name no model the real API has retired (the test above checks
/// the examples parse; this one that their models still exist, by the mock's list).
#[test]
fn the_guide_names_no_retired_model() {
    let examples = documented_provider_examples();
    let c = Config::from_toml(&examples, "docs/guide/providers").expect("parses");
    for p in &c.providers {
        let m = p.model.as_deref().unwrap_or("");
        assert!(!crate::mock::behavior::RETIRED_OPENAI_MODELS.contains(&m), "the guide names retired model {m}");
    }
}

#[test]
fn non_loopback_listen_needs_confirmation() {
    assert!(Config::from_toml("[server]\nlisten = \"0.0.0.0:7700\"\n", "t").is_err());
    let ok = "[server]\nlisten = \"0.0.0.0:7700\"\nallow_non_loopback = true\n";
    assert!(Config::from_toml(ok, "t").is_ok());
}

/// The `[delivery]` part of /work/shared/acceptance/deliver.py's configuration.
const ACCEPTANCE_DELIVERY: &str = r##"
[[providers]]
name = "demo"
kind = "demo"
max_concurrency = 4

[[delivery.profiles]]
name = "tall600"
width = 600
height = 800
fit = "pad"
background = "#ffffff"
format = "png"
file_name = "{product}_{role}_{profile}.{ext}"

[[delivery.targets]]
name = "out"
kind = "folder"
path = "/tmp/bar-deliver-x/out"
"##;

#[test]
fn the_acceptance_delivery_config_loads() {
    use crate::delivery::profile::{Fit, Format, Rgb};
    use crate::delivery::target::{TargetConfig, TargetKind};
    let c = Config::from_toml(&format!("[storage]\ndata_dir = \"/data\"\n{ACCEPTANCE_DELIVERY}"), "t.toml").unwrap();
    let p = c.delivery.profile("tall600").expect("configured");
    let r = p.render.expect("rendered");
    assert_eq!((r.width, r.height, r.fit, r.background, r.format), (600, 800, Fit::Pad, Rgb::WHITE, Format::Png));
    assert_eq!(p.file_name, "{product}_{role}_{profile}.{ext}");
    for b in ["amazon", "shopify", "etsy", "taobao", "original"] {
        assert!(c.delivery.profile(b).is_some(), "{b}");
    }
    let folder = |name: &str, path: &str| TargetConfig {
        name: name.into(),
        timeout_ms: 30_000,
        kind: TargetKind::Folder { path: path.into() },
    };
    assert_eq!(c.delivery_targets(), [folder("out", "/tmp/bar-deliver-x/out"), folder("exports", "/data/exports")]);
    // `exports` follows the data dir when it is changed after loading (`--data-dir`).
    assert_eq!(c.delivery.targets(std::path::Path::new("/d2"))[1], folder("exports", "/d2/exports"));
}

#[test]
fn with_no_delivery_config_the_exports_folder_exists() {
    let c = Config::from_toml("[storage]\ndata_dir = \"/data\"\n", "t.toml").unwrap();
    let t = c.delivery.target("exports", &c.storage.data_dir).expect("default target");
    assert_eq!(t.kind, crate::delivery::target::TargetKind::Folder { path: "/data/exports".into() });
    assert_eq!(c.delivery.profiles.len(), crate::delivery::profile::builtins().len(), "the built-ins");
}

#[test]
fn delivery_targets_resolve_per_kind() {
    use crate::delivery::target::{S3Config, TargetKind};
    let c = Config::from_toml(
        r#"
[storage]
data_dir = "/data"
[[delivery.targets]]
name = "exports"
kind = "folder"
path = "shop-files"
timeout_ms = 5000
[[delivery.targets]]
name = "bucket"
kind = "s3"
endpoint = "http://127.0.0.1:9000"
region = "us-east-1"
bucket = "listings"
prefix = "tally/"
access_key_id_env = "S3_KEY"
secret_access_key_env = "S3_SECRET"
[[delivery.targets]]
name = "patient"
kind = "s3"
region = "us-east-1"
bucket = "listings"
access_key_id_env = "S3_KEY"
secret_access_key_env = "S3_SECRET"
retry_for_ms = 0
"#,
        "t.toml",
    )
    .unwrap();
    let t = c.delivery_targets();
    assert_eq!(t.len(), 3, "a configured folder `exports` replaces the default: {t:?}");
    assert_eq!((t[0].name.as_str(), t[0].timeout_ms), ("exports", 5000));
    assert_eq!(t[0].kind, TargetKind::Folder { path: "/data/shop-files".into() }, "relative paths are in the data dir");
    assert_eq!(
        t[1].kind,
        TargetKind::S3(S3Config {
            endpoint: Some("http://127.0.0.1:9000".into()),
            region: "us-east-1".into(),
            bucket: "listings".into(),
            prefix: "tally/".into(),
            access_key_id_env: "S3_KEY".into(),
            secret_access_key_env: "S3_SECRET".into(),
            retry_for_ms: 120_000,
        }),
        "retry_for_ms defaults to two minutes"
    );
    assert!(matches!(&t[2].kind, TargetKind::S3(c) if c.retry_for_ms == 0 && c.endpoint.is_none()), "{:?}", t[2]);
    assert_eq!((t[1].item_budget_ms(), t[2].item_budget_ms(), t[0].item_budget_ms()), (150_000, 30_000, 5000));
}

#[test]
fn bad_delivery_config_names_the_key_and_why() {
    let folder = "[[delivery.targets]]\nname = \"out\"\nkind = \"folder\"\npath = \"/o\"\n";
    let s3 =
        "kind = \"s3\"\nregion = \"r\"\nbucket = \"b\"\naccess_key_id_env = \"K\"\nsecret_access_key_env = \"S\"\n";
    let profile = "[[delivery.profiles]]\nname = \"p\"\nwidth = 10\nheight = 10\n";
    let cases: Vec<(String, &str, &str)> = vec![
        (
            "[[delivery.targets]]\nname = \"x\"\nkind = \"ftp\"\n".into(),
            "delivery.targets[0].kind",
            "\"folder\", \"s3\" or \"shopify\"",
        ),
        (
            "[[delivery.targets]]\nname = \"x\"\nkind = \"shopify\"\nshop = \"evil.example.com\"\n\
             access_token_env = \"T\"\n"
                .into(),
            "delivery.targets[0].shop",
            "NAME.myshopify.com",
        ),
        (
            "[[delivery.targets]]\nname = \"x\"\nkind = \"shopify\"\nshop = \"a.myshopify.com\"\n\
             access_token_env = \"T\"\nplacement = \"front\"\n"
                .into(),
            "delivery.targets[0].placement",
            "\"append\" or \"replace\"",
        ),
        (
            "[[delivery.targets]]\nname = \"x\"\nkind = \"shopify\"\nshop = \"a.myshopify.com\"\n\
             access_token_env = \"shpat_123 secret\"\n"
                .into(),
            "delivery.targets[0].access_token_env",
            "environment variable",
        ),
        (
            "[[delivery.targets]]\nname = \"x\"\nkind = \"folder\"\npath = \"/x\"\nshop = \"a.myshopify.com\"\n".into(),
            "delivery.targets[0].shop",
            "not a key of a `folder` target",
        ),
        (format!("{folder}{folder}"), "delivery.targets[1].name", "configured twice"),
        (format!("[[delivery.targets]]\nname = \"exports\"\n{s3}"), "delivery.targets[0].name", "default local folder"),
        ("[[delivery.targets]]\nname = \"x\"\nkind = \"folder\"\n".into(), "delivery.targets[0].path", "required"),
        (format!("{folder}bucket = \"b\"\n"), "delivery.targets[0].bucket", "not a key of a `folder` target"),
        (format!("{folder}timeout_ms = 0\n"), "delivery.targets[0].timeout_ms", "between 1 and"),
        (format!("{folder}retry_for_ms = 1000\n"), "delivery.targets[0].retry_for_ms", "not a key of a `folder`"),
        (
            format!("[[delivery.targets]]\nname = \"b\"\n{s3}retry_for_ms = -1\n"),
            "delivery.targets[0].retry_for_ms",
            "between 0 and 3600000",
        ),
        (
            format!("[[delivery.targets]]\nname = \"b\"\n{s3}access_key_id_env = \"AKIA=1\"\n")
                .replace("access_key_id_env = \"K\"\n", ""),
            "delivery.targets[0].access_key_id_env",
            "environment variable",
        ),
        (
            format!("[[delivery.targets]]\nname = \"b\"\n{s3}endpoint = \"minio:9000\"\n"),
            "delivery.targets[0].endpoint",
            "http://",
        ),
        (format!("{profile}{profile}"), "delivery.profiles[1].name", "configured twice"),
        (
            "[[delivery.profiles]]\nname = \"amazon\"\nwidth = 10\nheight = 10\n".into(),
            "delivery.profiles[0].name",
            "built-in",
        ),
        (format!("{profile}background = \"#fffff\"\n"), "delivery.profiles[0].background", "not a colour"),
        (
            "[[delivery.profiles]]\nname = \"p\"\nwidth = 0\nheight = 10\n".into(),
            "delivery.profiles[0].width",
            "between 1 and",
        ),
        (format!("{profile}format = \"gif\"\n"), "delivery.profiles[0].format", "\"jpeg\", \"png\" or \"webp\""),
        (
            format!("{profile}file_name = \"{{product}}/{{role}}.{{ext}}\"\n"),
            "delivery.profiles[0].file_name",
            "path separator",
        ),
    ];
    for (text, key, words) in cases {
        let e = Config::from_toml(&text, "my.toml").expect_err(&text).to_string();
        assert!(e.contains("my.toml") && e.contains(key) && e.contains(words), "{text}\n→ {e}");
    }
    let e = Config::from_toml("[delivery]\nprofile = []\n", "my.toml").unwrap_err().to_string();
    assert!(e.contains("profile"), "an unknown key under [delivery] is refused: {e}");
}

#[test]
fn the_image_budget_is_in_mib_within_bounds() {
    assert_eq!(Config::from_toml("", "t.toml").unwrap().engine.image_memory, crate::pixels::DEFAULT_BYTES);
    let c = Config::from_toml("[engine]\nimage_memory_mb = 1024\n", "t.toml").unwrap();
    assert_eq!(c.engine.image_memory, 1024 << 20);
    for bad in ["image_memory_mb = 8", "image_memory_mb = -1", "image_memory_mb = 1000000"] {
        let e = Config::from_toml(&format!("[engine]\n{bad}\n"), "t.toml").unwrap_err().to_string();
        assert!(e.contains("engine.image_memory_mb"), "{bad}: {e}");
    }
}

#[test]
fn the_time_zone_is_an_iana_name_and_an_unknown_one_is_refused() {
    let c = Config::from_toml("[ui]\ntime_zone = \"Asia/Shanghai\"\n", "t").unwrap();
    assert_eq!(c.engine.time_zone.iana_name(), Some("Asia/Shanghai"));
    let e = Config::from_toml("[ui]\ntime_zone = \"Asia/Beijing\"\n", "t").unwrap_err().to_string();
    assert!(e.contains("ui.time_zone") && e.contains("Asia/Beijing") && e.contains("IANA"), "{e}");
    // Unset: the computer's zone (TZ, else /etc/localtime), else UTC; never an error.
    assert!(Config::from_toml("", "t").is_ok());
}
