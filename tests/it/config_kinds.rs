//! Configuration checks that differ by provider kind, read from each kind's descriptor
//! (`providers::kinds`): a kind added to the table is checked here without a new row.

use std::time::Duration;

use tally::config::{Config, ProviderKind};
use tally::providers::kinds::{self, KINDS};

#[test]
fn idempotency_header_is_refused_for_apis_that_document_none() {
    // Every documented host of every kind, in the spellings a config may use.
    let hosts: Vec<&str> = kinds::hosts_without_idempotency().collect();
    assert!(hosts.len() >= KINDS.len() - 1, "each paid kind lists its hosts");
    let urls = hosts.iter().flat_map(|h| {
        [format!("https://{h}/v1"), format!("https://{}", h.to_ascii_uppercase()), format!("https://{h}:443")]
    });
    for url in urls {
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
fn openai_images_waits_as_long_as_the_official_sdk_by_default() {
    let text = "[[providers]]\nname = \"o\"\nkind = \"openai_images\"\nbase_url = \"https://api.openai.com/v1\"\n";
    let c = Config::from_toml(text, "t").unwrap();
    assert!(c.providers[0].request_timeout >= Duration::from_secs(600));
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

#[test]
fn each_kind_takes_its_own_defaults_and_operations() {
    for k in KINDS {
        let model = k.mock_model.map(|m| format!("model = \"{m}\"\n")).unwrap_or_default();
        let url = if k.needs_base_url { "base_url = \"http://127.0.0.1:1\"\n" } else { "" };
        let text = format!("[[providers]]\nname = \"p\"\nkind = \"{}\"\n{url}{model}", k.name);
        let c = Config::from_toml(&text, "t").unwrap_or_else(|e| panic!("{}: {e}", k.name));
        let p = &c.providers[0];
        assert_eq!(p.kind.as_str(), k.name);
        assert_eq!(p.operations, k.default_operations, "{}", k.name);
        assert_eq!(p.request_timeout, k.request_timeout, "{}", k.name);
        if k.needs_model {
            let e = Config::from_toml(&format!("[[providers]]\nname = \"p\"\nkind = \"{}\"\n{url}", k.name), "t")
                .unwrap_err();
            assert!(e.to_string().contains("providers[0].model"), "{}: {e}", k.name);
        }
        // An operation the kind cannot do is refused by name.
        for op in ["generate", "edit", "cutout"] {
            let with = format!("{text}operations = [\"{op}\"]\n");
            let can = k.operations.iter().any(|o| o.as_str() == op);
            match Config::from_toml(&with, "t") {
                Ok(c) => assert!(can && c.providers[0].operations.len() == 1, "{}: {op}", k.name),
                Err(e) => assert!(!can && e.to_string().contains("operations"), "{}: {op}: {e}", k.name),
            }
        }
    }
    let e = Config::from_toml("[[providers]]\nname = \"p\"\nkind = \"demo\"\noperations = [\"teleport\"]\n", "t")
        .unwrap_err();
    assert!(e.to_string().contains("teleport"), "{e}");
    assert!(ProviderKind::parse("no_such_kind").is_none());
}
