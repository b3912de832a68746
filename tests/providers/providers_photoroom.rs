//! Photoroom has no official SDK: the mock's `/v1/segment` is held to the published API
//! reference instead, as excerpted (with its source URLs) in `tests/fixtures/photoroom-segment.txt`:
//! the method and path, the key in `x-api-key`, the multipart `image_file` field, a PNG
//! answer with an alpha channel, 401 without a key and 400 without an image — and the
//! mock's ledger charges only the answered cut-out.

use std::collections::HashMap;

use crate::common::{Mock, try_request};

fn documented() -> HashMap<String, String> {
    let text = include_str!("../fixtures/photoroom-segment.txt");
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// A multipart body with one file part named `field`.
fn multipart(field: &str, bytes: &[u8]) -> (String, Vec<u8>) {
    let boundary = format!("----------{}", uuid::Uuid::new_v4().simple());
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; filename=\"product.png\"\r\nContent-Type: image/png\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(bytes);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

#[test]
fn the_mock_segment_route_matches_photoroom_s_published_reference() {
    let doc = documented();
    let get = |k: &str| doc.get(k).unwrap_or_else(|| panic!("fixture lacks `{k}`")).clone();
    assert_eq!(get("method"), "POST");
    assert_eq!(get("body"), "multipart/form-data");
    let mock = Mock::start(&[]);
    let path = get("path");
    let key_header = get("auth_header");
    let png = tally::render::placeholder_png("white", 32);

    // The documented request: the image in `image_file`, the key in `x-api-key`.
    let (ct, body) = multipart(&get("image_field"), &png);
    let headers = [(key_header.as_str(), "sk-photoroom-test"), ("Content-Type", ct.as_str())];
    let r = try_request(mock.port, &get("method"), &path, &headers, Some(&body)).expect("an answer");
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let content_type = r
        .headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    assert!(content_type.starts_with(&get("answer_content_type")), "content type {content_type}");
    let img = image::load_from_memory_with_format(&r.body, image::ImageFormat::Png).expect("the answer is a PNG");
    assert!(img.color().has_alpha(), "a cut-out carries an alpha channel");

    // Without the key: the documented 401.
    let (ct, body) = multipart(&get("image_field"), &png);
    let r = try_request(mock.port, "POST", &path, &[("Content-Type", ct.as_str())], Some(&body)).expect("an answer");
    assert_eq!(r.status.to_string(), get("unauthorized_status"), "{}", String::from_utf8_lossy(&r.body));

    // Without `image_file` (the image under another name): the documented 400.
    let (ct, body) = multipart("image", &png);
    let headers = [(key_header.as_str(), "sk-photoroom-test"), ("Content-Type", ct.as_str())];
    let r = try_request(mock.port, "POST", &path, &headers, Some(&body)).expect("an answer");
    assert_eq!(r.status.to_string(), get("missing_image_status"), "{}", String::from_utf8_lossy(&r.body));
    let (ct, body) = multipart("format", b"png");
    let headers = [(key_header.as_str(), "sk-photoroom-test"), ("Content-Type", ct.as_str())];
    let r = try_request(mock.port, "POST", &path, &headers, Some(&body)).expect("an answer");
    assert_eq!(r.status.to_string(), get("missing_image_status"), "{}", String::from_utf8_lossy(&r.body));

    // Only the answered cut-out is charged.
    let charged = mock.lines().into_iter().filter(|l| l["charged"] == true).count();
    assert_eq!(charged, 1, "ledger: {:?}", mock.lines());
}
