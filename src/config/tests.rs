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
    let paid = "[[providers]]\nname = \"a\"\nkind = \"openai_images\"\nbase_url = \"http://x\"\n";
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
        "{paid}price_per_image = 1\n[[providers]]\nname = \"b\"\nkind = \"openai_images\"\nbase_url = \"http://y\"\nprice_per_image = 1\ncurrency = \"EUR\"\n"
    );
    let e = Config::from_toml(&two, "t").unwrap_err().to_string();
    assert!(e.contains("providers[1].currency"), "{e}");
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

#[test]
fn idempotency_header_is_refused_for_apis_that_document_none() {
    for url in
        ["https://api.openai.com/v1", "https://API.Replicate.com", "https://queue.fal.run", "https://fal.run:443"]
    {
        let text = format!(
            "[[providers]]\nname = \"p\"\nkind = \"openai_images\"\nbase_url = \"{url}\"\nidempotency_header = \"Idempotency-Key\"\n"
        );
        let e = Config::from_toml(&text, "t.toml").unwrap_err().to_string();
        assert!(e.contains("idempotency_header") && e.contains("charged twice"), "{url}: {e}");
    }
    let gateway = "[[providers]]\nname = \"g\"\nkind = \"openai_images\"\nbase_url = \"https://my-gateway.example\"\nidempotency_header = \"Idempotency-Key\"\n";
    assert!(Config::from_toml(gateway, "t").is_ok(), "other gateways: the user's assertion");
    let lookalike = gateway.replace("my-gateway.example", "api.openai.com.my-gateway.example");
    assert!(Config::from_toml(&lookalike, "t").is_ok());
}

#[test]
fn the_readme_provider_example_is_a_valid_config() {
    let readme = include_str!("../../README.md");
    let start = readme.find("```toml\n[[providers]]").expect("README has a provider example") + 8;
    let end = start + readme[start..].find("```").expect("closed");
    let c = Config::from_toml(&readme[start..end], "README.md").unwrap();
    let models: Vec<_> = c.providers.iter().filter_map(|p| p.model.as_deref()).collect();
    assert!(models.contains(&"fal-ai/flux/dev") && models.contains(&"black-forest-labs/flux-schnell"), "{models:?}");
}

#[test]
fn openai_images_waits_as_long_as_the_official_sdk_by_default() {
    let text = "[[providers]]\nname = \"o\"\nkind = \"openai_images\"\nbase_url = \"https://api.openai.com/v1\"\n";
    let c = Config::from_toml(text, "t").unwrap();
    assert!(c.providers[0].request_timeout >= Duration::from_secs(600));
}

#[test]
fn non_loopback_listen_needs_confirmation() {
    assert!(Config::from_toml("[server]\nlisten = \"0.0.0.0:7700\"\n", "t").is_err());
    let ok = "[server]\nlisten = \"0.0.0.0:7700\"\nallow_non_loopback = true\n";
    assert!(Config::from_toml(ok, "t").is_ok());
}

#[test]
fn dashscope_defaults_to_the_international_endpoint_and_its_key_variable() {
    let c =
        Config::from_toml("[[providers]]\nname = \"wan\"\nkind = \"dashscope\"\nmodel = \"wan2.2-t2i-flash\"\n", "t")
            .unwrap();
    let p = &c.providers[0];
    assert_eq!(p.kind, ProviderKind::Dashscope);
    assert_eq!(p.base_url.as_deref(), Some("https://dashscope-intl.aliyuncs.com"));
    assert_eq!(p.api_key_env.as_deref(), Some("DASHSCOPE_API_KEY"));
    let mainland = "[[providers]]\nname = \"wan\"\nkind = \"dashscope\"\nmodel = \"qwen-image\"\n\
                    base_url = \"https://dashscope.aliyuncs.com\"\napi_key_env = \"DS_KEY\"\n";
    let c = Config::from_toml(mainland, "t").unwrap();
    assert_eq!(c.providers[0].base_url.as_deref(), Some("https://dashscope.aliyuncs.com"));
    assert_eq!(c.providers[0].api_key_env.as_deref(), Some("DS_KEY"));
    let e = Config::from_toml(&format!("{mainland}idempotency_header = \"Idempotency-Key\"\n"), "t").unwrap_err();
    assert!(e.to_string().contains("dashscope.aliyuncs.com"), "{e}");
    let e = Config::from_toml("[[providers]]\nname = \"wan\"\nkind = \"dashscope\"\n", "t").unwrap_err();
    assert!(e.to_string().contains("providers[0].model"), "{e}");
}
