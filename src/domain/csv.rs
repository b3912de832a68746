//! The one CSV writer of every export (`manifest.csv`, the spend export): RFC 4180 fields,
//! guarded against spreadsheet formula injection. Pure.

/// One CSV field, quoted when it holds a comma, quote, CR or LF (quotes doubled), and when it
/// starts with a character a spreadsheet would run as a formula (`=`, `+`, `-`, `@`, tab, CR):
/// those get a leading `'` inside the quotes, so a product named `=HYPERLINK(…)` or a
/// provider's message `+1 credit` stays text.
pub fn field(value: &str) -> String {
    let formula = value.starts_with(['=', '+', '-', '@', '\t', '\r']);
    let value = if formula { format!("'{value}") } else { value.to_string() };
    if formula || value.contains([',', '"', '\r', '\n']) {
        format!("\"{}\"", value.replace('"', "\"\""))
    } else {
        value
    }
}

/// One CSV line of `fields` (each through [`field`]), ended with CRLF.
pub fn line<S: AsRef<str>>(fields: &[S]) -> String {
    let mut out = fields.iter().map(|f| field(f.as_ref())).collect::<Vec<_>>().join(",");
    out.push_str("\r\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formulas_stay_text_and_separators_are_quoted() {
        for bad in ["=HYPERLINK(\"http://x\",\"y\")", "+1", "-2", "@SUM(A1)", "\tx"] {
            let f = field(bad);
            assert!(f.starts_with("\"'"), "{bad} -> {f}");
        }
        assert_eq!(field("a,b"), "\"a,b\"");
        assert_eq!(field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(field("plain"), "plain");
        assert_eq!(line(&["a", "=b"]), "a,\"'=b\"\r\n");
    }
}
