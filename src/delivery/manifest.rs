//! A delivery's manifest: one row per file (product, shot role, profile, file name, sha256,
//! pixel size, bytes, source task id, charge, the destination's id for the file), as CSV
//! ([`csv`], RFC 4180 quoting) and JSON ([`json`]), written beside the files so whoever opens
//! the folder can check each file against its sha256 and see what it cost. Each delivery's
//! manifest keeps its own names ([`names_for`]: `manifest-DELIVERY.csv`/`.json`), so several
//! deliveries into one folder keep every manifest; `manifest.csv`/`manifest.json` are the
//! latest delivery's. Pure: rows in, bytes out.

use serde::Serialize;

use crate::domain::csv::field;

/// The latest delivery's manifest, as CSV.
pub const CSV_NAME: &str = "manifest.csv";
/// The latest delivery's manifest, as JSON.
pub const JSON_NAME: &str = "manifest.json";

/// The manifest's names for one delivery, `manifest-TAG.csv` and `manifest-TAG.json` (TAG
/// made file-name safe: a delivery's id), so a second delivery into the same folder keeps the
/// first one's manifest. An empty TAG gives [`CSV_NAME`] and [`JSON_NAME`].
pub fn names_for(tag: &str) -> (String, String) {
    match super::names::slug(tag, 40) {
        Some(t) => (format!("manifest-{t}.csv"), format!("manifest-{t}.json")),
        None => (CSV_NAME.to_string(), JSON_NAME.to_string()),
    }
}

/// The CSV header, in column order (the JSON keys are the same).
pub const COLUMNS: [&str; 14] = [
    "product",
    "shot_role",
    "profile",
    "file_name",
    "sha256",
    "width",
    "height",
    "bytes",
    "source_task_id",
    "source_artifact_id",
    "charge",
    "cost",
    "currency",
    "remote_id",
];

/// One delivered file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[allow(missing_docs)]
pub struct ManifestRow {
    /// The set's product.
    pub product: String,
    /// The shot's role (`main`, `selling_point`, …; empty for none).
    pub shot_role: String,
    /// The profile the file was made with.
    pub profile: String,
    /// The file's name at the target.
    pub file_name: String,
    /// The file's lowercase hex sha256.
    pub sha256: String,
    /// Its pixel size.
    pub width: u32,
    pub height: u32,
    /// Its size in bytes.
    pub bytes: u64,
    /// The task that generated the source image.
    pub source_task_id: String,
    /// The source image (artifact) it was made from.
    pub source_artifact_id: String,
    /// What the evidence says about money for that task (`none`, `possible`, `charged`,
    /// `refused`, as the task's `charge.state`).
    pub charge: String,
    /// Its configured price in millionths of `currency` (`None`: not priced).
    #[serde(skip)]
    pub cost_micros: Option<i64>,
    /// The currency of `cost`.
    pub currency: Option<String>,
    /// The destination's id for the file (an S3 object's ETag, `?versionId=…` when
    /// versioned; `None` for a folder).
    pub remote_id: Option<String>,
}

/// A price in millionths as a decimal string without trailing zeros: `40000` → `0.04`.
pub fn decimal(micros: i64) -> String {
    let sign = if micros < 0 { "-" } else { "" };
    let m = micros.unsigned_abs();
    let (whole, frac) = (m / 1_000_000, m % 1_000_000);
    if frac == 0 {
        return format!("{sign}{whole}");
    }
    let frac = format!("{frac:06}");
    format!("{sign}{whole}.{}", frac.trim_end_matches('0'))
}

/// `manifest.csv`: a header line then one line per row, CRLF line ends (RFC 4180), UTF-8.
pub fn csv(rows: &[ManifestRow]) -> Vec<u8> {
    let mut out = COLUMNS.join(",");
    out.push_str("\r\n");
    for r in rows {
        let cells = [
            field(&r.product),
            field(&r.shot_role),
            field(&r.profile),
            field(&r.file_name),
            field(&r.sha256),
            r.width.to_string(),
            r.height.to_string(),
            r.bytes.to_string(),
            field(&r.source_task_id),
            field(&r.source_artifact_id),
            field(&r.charge),
            r.cost_micros.map(decimal).unwrap_or_default(),
            field(r.currency.as_deref().unwrap_or("")),
            field(r.remote_id.as_deref().unwrap_or("")),
        ];
        out.push_str(&cells.join(","));
        out.push_str("\r\n");
    }
    out.into_bytes()
}

/// `manifest.json`: `{"files": [ {row}, … ]}`, each row with the [`COLUMNS`] as keys (`cost`
/// a decimal string such as `"0.04"`, or null), pretty-printed, ending in a newline.
pub fn json(rows: &[ManifestRow]) -> Vec<u8> {
    #[derive(Serialize)]
    struct Row<'a> {
        #[serde(flatten)]
        row: &'a ManifestRow,
        cost: Option<String>,
    }
    #[derive(Serialize)]
    struct Doc<'a> {
        files: Vec<Row<'a>>,
    }
    let doc = Doc { files: rows.iter().map(|row| Row { row, cost: row.cost_micros.map(decimal) }).collect() };
    // Serializing plain strings and numbers cannot fail.
    let mut out = serde_json::to_vec_pretty(&doc).unwrap_or_else(|_| b"{\"files\":[]}".to_vec());
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(product: &str) -> ManifestRow {
        ManifestRow {
            product: product.into(),
            shot_role: "main".into(),
            profile: "amazon".into(),
            file_name: "x_main_1_amazon.jpg".into(),
            sha256: "ab".repeat(32),
            width: 2000,
            height: 2000,
            bytes: 123_456,
            source_task_id: "task-1".into(),
            source_artifact_id: "art-1".into(),
            charge: "charged".into(),
            cost_micros: Some(40_000),
            currency: Some("USD".into()),
            remote_id: Some("9b2cf535f27731c974343645a3985328".into()),
        }
    }

    /// A small RFC 4180 reader, to read back what [`csv`] wrote.
    fn parse(text: &str) -> Vec<Vec<String>> {
        let (mut rows, mut row, mut cell) = (Vec::new(), Vec::new(), String::new());
        let mut chars = text.chars().peekable();
        let mut quoted = false;
        while let Some(c) = chars.next() {
            match (quoted, c) {
                (true, '"') if chars.peek() == Some(&'"') => {
                    chars.next();
                    cell.push('"');
                }
                (true, '"') => quoted = false,
                (true, c) => cell.push(c),
                (false, '"') => quoted = true,
                (false, ',') => row.push(std::mem::take(&mut cell)),
                (false, '\r') => {}
                (false, '\n') => {
                    row.push(std::mem::take(&mut cell));
                    rows.push(std::mem::take(&mut row));
                }
                (false, c) => cell.push(c),
            }
        }
        rows
    }

    #[test]
    fn csv_quotes_what_needs_quoting_and_reads_back() {
        let awkward = "Teapot, \"green\"\nlarge 绿";
        let text = String::from_utf8(csv(&[row(awkward), row("=cmd()")])).expect("utf-8");
        let rows = parse(&text);
        assert_eq!(rows[0], COLUMNS);
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[1][0], awkward);
        assert_eq!(rows[2][0], "'=cmd()", "a formula stays text");
        assert_eq!(rows[1][5..8], ["2000", "2000", "123456"]);
        assert_eq!(rows[1][10..], ["charged", "0.04", "USD", "9b2cf535f27731c974343645a3985328"]);
        assert!(text.ends_with("\r\n"));
    }

    #[test]
    fn json_has_every_column_per_file() {
        let v: serde_json::Value = serde_json::from_slice(&json(&[row("mug")])).expect("json");
        let f = &v["files"][0];
        for c in COLUMNS {
            assert!(f.get(c).is_some(), "{c} missing in {f}");
        }
        assert_eq!(f["cost"], "0.04");
        assert_eq!(f["width"], 2000);
        assert_eq!(f["sha256"], "ab".repeat(32));
        let v: serde_json::Value = serde_json::from_slice(&json(&[ManifestRow {
            cost_micros: None,
            currency: None,
            remote_id: None,
            ..row("mug")
        }]))
        .expect("json");
        assert!(v["files"][0]["cost"].is_null());
        assert!(v["files"][0]["remote_id"].is_null());
    }

    #[test]
    fn each_delivery_gets_its_own_manifest_names() {
        assert_eq!(names_for("0193a1b2"), ("manifest-0193a1b2.csv".into(), "manifest-0193a1b2.json".into()));
        let id = "0193a1b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b";
        assert_eq!(names_for(id).1, format!("manifest-{id}.json"), "a delivery's whole id fits");
        assert_eq!(names_for("../x"), ("manifest-x.csv".into(), "manifest-x.json".into()));
        assert_eq!(names_for(""), (CSV_NAME.into(), JSON_NAME.into()));
    }

    #[test]
    fn prices_print_as_decimals() {
        assert_eq!(decimal(40_000), "0.04");
        assert_eq!(decimal(1_500_000), "1.5");
        assert_eq!(decimal(2_000_000), "2");
        assert_eq!(decimal(0), "0");
        assert_eq!(decimal(-250_000), "-0.25");
    }
}
