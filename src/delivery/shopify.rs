//! The `shopify` delivery target: a delivery's files become media of one product of the shop,
//! through Shopify's Admin GraphQL API (`{base_url}/admin/api/{api_version}/graphql.json`,
//! authenticated by a custom app's token in `X-Shopify-Access-Token`).
//!
//! One item's flow ([`ShopifyTarget::deliver`]), every step safe to repeat:
//! 1. look for the item's file by its deterministic name (`files(query: "filename:…")`): an
//!    earlier attempt whose answer was lost is found here, never created twice (*find by
//!    name*);
//! 2. otherwise `stagedUploadsCreate`, the upload to the staged target (an upload nothing
//!    references is harmless: *orphan is harmless*), then `fileCreate` with that name and
//!    `duplicateResolutionMode: RAISE_ERROR` (a second create of the name is refused, not
//!    doubled: *conditional create*); a lost or refused-as-duplicate answer is settled by
//!    the lookup of step 1;
//! 3. wait until the file is `READY`;
//! 4. attach it: `fileUpdate` with `referencesToAdd: [product]` (adding a reference that is
//!    there changes nothing: *set*); with `placement = "replace"`, the product's other media —
//!    those not among the delivery's own files — are then detached (`referencesToRemove`), so
//!    two replace deliveries of two files leave exactly two media.
//!
//! Shopify's cost-based rate limit is respected: the last `extensions.cost.throttleStatus`
//! seen is kept, a request waits before it is sent when the bucket is short, and a
//! `THROTTLED` answer waits for the bucket to refill and is sent again (within the item's
//! deadline). The token never appears in an error, a log line or an answer: reasons are
//! short, and the token is cut out of anything the server sent back.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::target::{ShopifyConfig, ShopifyPlacement, TargetError};

/// The longest part of a server's answer kept in a reason.
const REASON_MAX: usize = 300;
/// The most bytes of an answer read.
const ANSWER_MAX: usize = 1 << 20;

/// A `shopify` target ready to use (its token read from the environment).
pub struct ShopifyTarget {
    cfg: ShopifyConfig,
    token: String,
    client: reqwest::Client,
    timeout: Duration,
    /// The bucket as last seen: (points available, restore rate a second, when).
    bucket: Mutex<Option<(f64, f64, Instant)>>,
}

impl std::fmt::Debug for ShopifyTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShopifyTarget").field("shop", &self.cfg.shop).field("token", &"…").finish()
    }
}

impl ShopifyTarget {
    /// The limit of one request (`timeout_ms`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Build the target, reading the token from `access_token_env` now; a missing one is a
    /// [`TargetError::Permanent`] naming the variable.
    pub fn new(cfg: &ShopifyConfig, timeout_ms: u64) -> Result<Self, TargetError> {
        let token = match std::env::var(&cfg.access_token_env) {
            Ok(v) if !v.trim().is_empty() => v.trim().to_string(),
            _ => {
                return Err(TargetError::Permanent(format!(
                    "the shop {}'s Admin API access token is read from the environment variable {}, which is not set",
                    cfg.shop, cfg.access_token_env
                )));
            }
        };
        let _ = rustls::crypto::ring::default_provider().install_default();
        let timeout = Duration::from_millis(timeout_ms.max(1));
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| TargetError::Permanent(format!("could not make an HTTP client: {e}")))?;
        Ok(ShopifyTarget { cfg: cfg.clone(), token, client, timeout, bucket: Mutex::new(None) })
    }

    /// Where the files go, in words: the shop and where its admin shows them.
    pub fn location(&self) -> String {
        format!("{} (Shopify admin → Content → Files, and the product's media)", self.cfg.shop)
    }

    fn endpoint(&self) -> String {
        format!("{}/admin/api/{}/graphql.json", self.cfg.base_url, self.cfg.api_version)
    }

    /// A reason with the token cut out and the length bounded.
    fn clean(&self, s: &str) -> String {
        let s = s.replace(&self.token, "…");
        let mut out: String = s.chars().filter(|c| !c.is_control()).take(REASON_MAX).collect();
        if s.chars().count() > REASON_MAX {
            out.push('…');
        }
        out
    }

    /// Wait while the last seen bucket is short of `need` points.
    async fn wait_for_bucket(&self, need: f64, deadline: Instant) -> Result<(), TargetError> {
        let wait = {
            let b = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
            match *b {
                Some((avail, rate, at)) if rate > 0.0 => {
                    let now_avail = avail + at.elapsed().as_secs_f64() * rate;
                    if now_avail >= need { None } else { Some(Duration::from_secs_f64((need - now_avail) / rate)) }
                }
                _ => None,
            }
        };
        if let Some(w) = wait {
            if Instant::now() + w > deadline {
                return Err(TargetError::Transient(format!(
                    "Shopify's rate limit needs a wait of {} ms, past this file's deadline",
                    w.as_millis()
                )));
            }
            tokio::time::sleep(w).await;
        }
        Ok(())
    }

    /// One GraphQL request: its `data`, or why not. Waits for the cost bucket before sending
    /// and after a `THROTTLED` answer. A request that left and got no answer is
    /// [`TargetError::Ambiguous`].
    async fn gql(&self, query: &str, variables: Value, deadline: Instant) -> Result<Value, TargetError> {
        let need = if query.trim_start().starts_with("mutation") { 10.0 } else { 5.0 };
        loop {
            self.wait_for_bucket(need, deadline).await?;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(TargetError::Transient("this file's deadline passed before Shopify answered".into()));
            }
            let sent = self
                .client
                .post(self.endpoint())
                .timeout(left.min(self.timeout))
                .header("X-Shopify-Access-Token", &self.token)
                .json(&json!({ "query": query, "variables": variables }))
                .send()
                .await;
            let resp = match sent {
                Ok(r) => r,
                Err(e) if e.is_connect() => {
                    return Err(TargetError::Transient(self.clean(&format!("could not reach {}: {e}", self.cfg.shop))));
                }
                Err(e) => {
                    return Err(TargetError::Ambiguous(self.clean(&format!(
                        "Shopify's answer was lost ({}); it may have taken effect",
                        e.without_url()
                    ))));
                }
            };
            let status = resp.status();
            let body = read_bounded(resp).await;
            let text = String::from_utf8_lossy(&body);
            if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
                return Err(TargetError::Permanent(format!(
                    "Shopify refused the access token in {} ({status}): check the custom app's Admin API token and its \
                     write_files and write_products scopes",
                    self.cfg.access_token_env
                )));
            }
            if status == reqwest::StatusCode::NOT_FOUND || status == reqwest::StatusCode::PAYMENT_REQUIRED {
                return Err(TargetError::Permanent(format!(
                    "Shopify answered {status} for the shop {} at API version {}: check `shop` and `api_version`",
                    self.cfg.shop, self.cfg.api_version
                )));
            }
            if status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS {
                return Err(TargetError::Ambiguous(format!(
                    "Shopify answered {status}; the request may have taken effect"
                )));
            }
            let v: Value = serde_json::from_slice(&body).map_err(|_| {
                TargetError::Ambiguous(
                    self.clean(&format!("Shopify answered {status} with something that is not JSON: {text}")),
                )
            })?;
            if let Some(t) = v.pointer("/extensions/cost/throttleStatus") {
                let avail = t.get("currentlyAvailable").and_then(Value::as_f64).unwrap_or(0.0);
                let rate = t.get("restoreRate").and_then(Value::as_f64).unwrap_or(50.0);
                *self.bucket.lock().unwrap_or_else(|e| e.into_inner()) = Some((avail, rate, Instant::now()));
            }
            if let Some(errors) = v.get("errors") {
                let throttled = errors
                    .as_array()
                    .is_some_and(|a| a.iter().any(|e| e.pointer("/extensions/code") == Some(&json!("THROTTLED"))));
                if throttled {
                    let want = v.pointer("/extensions/cost/requestedQueryCost").and_then(Value::as_f64).unwrap_or(need);
                    self.wait_for_bucket(want.max(need), deadline).await?;
                    continue;
                }
                let msg = errors
                    .as_array()
                    .and_then(|a| a.first())
                    .and_then(|e| e.get("message"))
                    .and_then(Value::as_str)
                    .map(String::from)
                    .unwrap_or_else(|| errors.to_string());
                return Err(TargetError::Permanent(self.clean(&format!("Shopify refused the request: {msg}"))));
            }
            return Ok(v.get("data").cloned().unwrap_or(Value::Null));
        }
    }

    /// `userErrors` of a mutation's payload in words, if any.
    fn user_errors(&self, payload: &Value) -> Option<(String, Vec<String>)> {
        let errs = payload.get("userErrors")?.as_array()?;
        if errs.is_empty() {
            return None;
        }
        let codes = errs.iter().filter_map(|e| e.get("code").and_then(Value::as_str).map(String::from)).collect();
        let words = errs.iter().filter_map(|e| e.get("message").and_then(Value::as_str)).collect::<Vec<_>>().join("; ");
        Some((self.clean(&words), codes))
    }

    /// The product's id from a `gid://shopify/Product/…` or a handle.
    pub async fn product_id(&self, product: &str, deadline: Instant) -> Result<String, TargetError> {
        let q = "query Product($identifier: ProductIdentifierInput!) { productByIdentifier(identifier: $identifier) { id } }";
        let ident = if product.starts_with("gid://shopify/Product/") {
            json!({ "id": product })
        } else {
            json!({ "handle": product })
        };
        let data = self.gql(q, json!({ "identifier": ident }), deadline).await?;
        match data.pointer("/productByIdentifier/id").and_then(Value::as_str) {
            Some(id) => Ok(id.to_string()),
            None => Err(TargetError::Permanent(self.clean(&format!(
                "the shop {} has no product {product} (a gid://shopify/Product/… id or a handle)",
                self.cfg.shop
            )))),
        }
    }

    /// The file named `filename`, if one is there: (id, status).
    async fn find(&self, filename: &str, deadline: Instant) -> Result<Option<(String, String)>, TargetError> {
        let q = "query Files($query: String!) { files(first: 5, query: $query) { nodes { id fileStatus ... on MediaImage { image { url } } } } }";
        let data = self.gql(q, json!({ "query": format!("filename:{filename}") }), deadline).await?;
        let nodes = data.pointer("/files/nodes").and_then(Value::as_array).cloned().unwrap_or_default();
        Ok(nodes.first().and_then(|n| {
            let id = n.get("id")?.as_str()?.to_string();
            let status = n.get("fileStatus").and_then(Value::as_str).unwrap_or("").to_string();
            Some((id, status))
        }))
    }

    /// Upload `bytes` and create the file `filename` (steps 2 of the module docs); its id.
    async fn create(
        &self,
        filename: &str,
        bytes: Vec<u8>,
        mime: &str,
        deadline: Instant,
    ) -> Result<String, TargetError> {
        let q = "mutation Stage($input: [StagedUploadInput!]!) { stagedUploadsCreate(input: $input) { stagedTargets { url resourceUrl parameters { name value } } userErrors { field message } } }";
        let input = json!([{ "filename": filename, "mimeType": mime, "resource": "IMAGE", "httpMethod": "PUT",
                             "fileSize": bytes.len().to_string() }]);
        let data = self.gql(q, json!({ "input": input }), deadline).await.map_err(ambiguous_is_transient)?;
        let payload = data.get("stagedUploadsCreate").cloned().unwrap_or(Value::Null);
        if let Some((why, _)) = self.user_errors(&payload) {
            return Err(TargetError::Permanent(format!("Shopify refused the upload: {why}")));
        }
        let target = payload.pointer("/stagedTargets/0").cloned().unwrap_or(Value::Null);
        let (Some(url), Some(resource)) =
            (target.get("url").and_then(Value::as_str), target.get("resourceUrl").and_then(Value::as_str))
        else {
            return Err(TargetError::Transient("Shopify gave no staged upload target".into()));
        };
        let left = deadline.saturating_duration_since(Instant::now());
        let put =
            self.client.put(url).timeout(left.min(self.timeout)).header("Content-Type", mime).body(bytes).send().await;
        match put {
            Ok(r) if r.status().is_success() => {}
            Ok(r) => {
                return Err(TargetError::Transient(format!("the staged upload answered {}", r.status())));
            }
            Err(e) => {
                return Err(TargetError::Transient(
                    self.clean(&format!("the staged upload failed: {}", e.without_url())),
                ));
            }
        }
        let q = "mutation FileCreate($files: [FileCreateInput!]!) { fileCreate(files: $files) { files { id fileStatus } userErrors { field message code } } }";
        let files = json!([{ "originalSource": resource, "filename": filename, "contentType": "IMAGE",
                             "duplicateResolutionMode": "RAISE_ERROR" }]);
        let data = self.gql(q, json!({ "files": files }), deadline).await?;
        let payload = data.get("fileCreate").cloned().unwrap_or(Value::Null);
        if let Some((why, codes)) = self.user_errors(&payload) {
            if codes.iter().any(|c| c.contains("DUPLICATE")) {
                return Err(TargetError::Ambiguous(why));
            }
            return Err(TargetError::Permanent(format!("Shopify refused the file {filename}: {why}")));
        }
        payload
            .pointer("/files/0/id")
            .and_then(Value::as_str)
            .map(String::from)
            .ok_or_else(|| TargetError::Ambiguous("Shopify's fileCreate answer named no file".into()))
    }

    /// The product's media ids, in order.
    async fn media(&self, product: &str, deadline: Instant) -> Result<Vec<String>, TargetError> {
        let q = "query Media($id: ID!) { product(id: $id) { media(first: 250) { nodes { id status } } } }";
        let data = self.gql(q, json!({ "id": product }), deadline).await?;
        Ok(data
            .pointer("/product/media/nodes")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|n| n.get("id").and_then(Value::as_str).map(String::from)).collect())
            .unwrap_or_default())
    }

    /// Add (`add = true`) or remove the reference from file `id` to `product`.
    async fn reference(&self, id: &str, product: &str, add: bool, deadline: Instant) -> Result<(), TargetError> {
        let q = "mutation FileUpdate($files: [FileUpdateInput!]!) { fileUpdate(files: $files) { files { id } userErrors { field message code } } }";
        let key = if add { "referencesToAdd" } else { "referencesToRemove" };
        let files = json!([{ "id": id, key: [product] }]);
        let data = self.gql(q, json!({ "files": files }), deadline).await?;
        let payload = data.get("fileUpdate").cloned().unwrap_or(Value::Null);
        if let Some((why, _)) = self.user_errors(&payload) {
            return Err(TargetError::Permanent(format!("Shopify refused to attach the file to {product}: {why}")));
        }
        Ok(())
    }

    /// Deliver one file as `filename` to `product` (see the module docs); `keep` are the
    /// delivery's files delivered before this one (kept by `replace`). Answers the file's id.
    /// An answer lost at any step is settled by looking before anything is sent again; what
    /// still cannot be proven is [`TargetError::Ambiguous`].
    pub async fn deliver(
        &self,
        product: &str,
        filename: &str,
        bytes: Vec<u8>,
        keep: &[String],
        deadline: Instant,
    ) -> Result<String, TargetError> {
        let mime = mime_of(filename);
        let product = self.product_id(product, deadline).await.map_err(ambiguous_is_transient)?;
        let found = self.find(filename, deadline).await.map_err(ambiguous_is_transient)?;
        let id = match found {
            Some((id, _)) => id,
            None => match self.create(filename, bytes, mime, deadline).await {
                Ok(id) => id,
                Err(TargetError::Ambiguous(why)) => match self.find(filename, deadline).await {
                    Ok(Some((id, _))) => id,
                    Ok(None) => {
                        return Err(TargetError::Transient(format!(
                            "Shopify's answer to creating {filename} was lost and no such file is there: {why}"
                        )));
                    }
                    Err(e) => return Err(self.look_in_admin(filename, &e.to_string())),
                },
                Err(e) => return Err(e),
            },
        };
        // Wait until the file is READY (fileUpdate takes only ready files).
        loop {
            match self.find(filename, deadline).await {
                Ok(Some((_, s))) if s == "READY" => break,
                Ok(Some((_, s))) if s == "FAILED" => {
                    return Err(TargetError::Permanent(format!(
                        "Shopify could not process {filename} (its status is FAILED): it may be too large or a format \
                         it does not take"
                    )));
                }
                Ok(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
                Ok(_) => return Err(self.look_in_admin(filename, "it was not READY before the deadline")),
                Err(e) => return Err(self.look_in_admin(filename, &e.to_string())),
            }
        }
        match self.reference(&id, &product, true, deadline).await {
            Ok(()) => {}
            Err(TargetError::Ambiguous(_)) => {
                // Settle by the product's media, then add again (a set: harmless).
                let media =
                    self.media(&product, deadline).await.map_err(|e| self.look_in_admin(filename, &e.to_string()))?;
                if !media.contains(&id) {
                    self.reference(&id, &product, true, deadline)
                        .await
                        .map_err(|e| self.look_in_admin(filename, &e.to_string()))?;
                }
            }
            Err(e) => return Err(e),
        }
        if self.cfg.placement == ShopifyPlacement::Replace {
            let media =
                self.media(&product, deadline).await.map_err(|e| self.look_in_admin(filename, &e.to_string()))?;
            for m in media.iter().filter(|m| **m != id && !keep.contains(m)) {
                match self.reference(m, &product, false, deadline).await {
                    Ok(()) | Err(TargetError::Ambiguous(_)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(id)
    }

    fn look_in_admin(&self, filename: &str, why: &str) -> TargetError {
        TargetError::Ambiguous(self.clean(&format!(
            "{why}; look for {filename} in the Shopify admin of {} (Content → Files, and the product's media)",
            self.cfg.shop
        )))
    }
}

/// A lookup or a staging step changes nothing at the shop, so a lost answer there is just a
/// failure to try again.
fn ambiguous_is_transient(e: TargetError) -> TargetError {
    match e {
        TargetError::Ambiguous(w) => TargetError::Transient(w),
        other => other,
    }
}

/// Read at most [`ANSWER_MAX`] bytes of an answer.
async fn read_bounded(mut resp: reqwest::Response) -> Vec<u8> {
    let mut out = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        let room = ANSWER_MAX.saturating_sub(out.len());
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if out.len() >= ANSWER_MAX {
            break;
        }
    }
    out
}

/// The media type Shopify is told for a file name.
fn mime_of(name: &str) -> &'static str {
    let lower = name.to_ascii_lowercase();
    if lower.ends_with(".jpg") || lower.ends_with(".jpeg") {
        "image/jpeg"
    } else if lower.ends_with(".webp") {
        "image/webp"
    } else {
        "image/png"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_token_variable_is_named_and_the_debug_hides_the_token() {
        let cfg = ShopifyConfig {
            shop: "a.myshopify.com".into(),
            access_token_env: "TALLY_TEST_NO_SUCH_SHOPIFY_TOKEN".into(),
            api_version: "2026-01".into(),
            base_url: "http://127.0.0.1:9".into(),
            placement: ShopifyPlacement::Append,
        };
        match ShopifyTarget::new(&cfg, 1000) {
            Err(TargetError::Permanent(w)) => assert!(w.contains("TALLY_TEST_NO_SUCH_SHOPIFY_TOKEN"), "{w}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(mime_of("a.JPG"), "image/jpeg");
    }
}
