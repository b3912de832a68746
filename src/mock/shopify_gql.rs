//! A small GraphQL reader for the mock's Shopify stand-in ([`super::shopify`]): an operation's
//! selection set with its arguments (literals and `$variables`), inline fragments and aliases,
//! enough to hold a client to the request shapes Shopify documents without a GraphQL engine.
//! Anything it cannot read is a GraphQL parse error, as Shopify's own answer would be.

use serde_json::{Map, Value};

/// One field of a selection set.
#[derive(Debug, Clone)]
pub(super) struct Field {
    /// The name the answer uses (the alias, or the field's name).
    pub key: String,
    /// The field's name in the schema.
    pub name: String,
    /// Its arguments, with variables already replaced by their values.
    pub args: Map<String, Value>,
    /// Its own selection (empty for a scalar); inline fragments' fields are merged in.
    pub fields: Vec<Field>,
}

/// Read `query` (one operation, `query`/`mutation` or a bare selection) with `variables`:
/// whether it is a mutation, and its root fields.
pub(super) fn parse(query: &str, variables: &Map<String, Value>) -> Result<(bool, Vec<Field>), String> {
    let mut p = P { s: query.as_bytes(), i: 0, vars: variables };
    p.ws();
    let mut mutation = false;
    if p.peek() != Some(b'{') {
        let kw = p.name()?;
        match kw.as_str() {
            "query" => {}
            "mutation" => mutation = true,
            other => return Err(format!("syntax error, unexpected {other}")),
        }
        p.ws();
        if p.peek().is_some_and(is_name_start) {
            p.name()?;
            p.ws();
        }
        if p.peek() == Some(b'(') {
            p.skip_var_defs()?;
        }
    }
    let fields = p.selection()?;
    p.ws();
    if p.i != p.s.len() {
        return Err("syntax error, unexpected text after the operation".into());
    }
    Ok((mutation, fields))
}

fn is_name_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}

struct P<'a> {
    s: &'a [u8],
    i: usize,
    vars: &'a Map<String, Value>,
}

impl P<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn ws(&mut self) {
        while let Some(c) = self.peek() {
            if c == b'#' {
                while self.peek().is_some_and(|c| c != b'\n') {
                    self.i += 1;
                }
            } else if c.is_ascii_whitespace() || c == b',' {
                self.i += 1;
            } else {
                break;
            }
        }
    }

    fn eat(&mut self, c: u8) -> Result<(), String> {
        self.ws();
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(format!("syntax error, expected `{}` at {}", c as char, self.i))
        }
    }

    fn name(&mut self) -> Result<String, String> {
        self.ws();
        let start = self.i;
        if !self.peek().is_some_and(is_name_start) {
            return Err(format!("syntax error, expected a name at {}", self.i));
        }
        while self.peek().is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_') {
            self.i += 1;
        }
        Ok(String::from_utf8_lossy(&self.s[start..self.i]).into_owned())
    }

    /// `($a: T!, $b: [T!]! = …)`: the types are the client's business; skipped.
    fn skip_var_defs(&mut self) -> Result<(), String> {
        let mut depth = 0usize;
        while let Some(c) = self.peek() {
            self.i += 1;
            match c {
                b'(' => depth += 1,
                b')' => {
                    depth -= 1;
                    if depth == 0 {
                        return Ok(());
                    }
                }
                b'"' => {
                    self.i -= 1;
                    self.string()?;
                }
                _ => {}
            }
        }
        Err("syntax error, unterminated variable definitions".into())
    }

    fn selection(&mut self) -> Result<Vec<Field>, String> {
        self.eat(b'{')?;
        let mut out = Vec::new();
        loop {
            self.ws();
            match self.peek() {
                Some(b'}') => {
                    self.i += 1;
                    return Ok(out);
                }
                Some(b'.') => {
                    for _ in 0..3 {
                        self.eat(b'.')?;
                    }
                    if self.name()? != "on" {
                        return Err("syntax error, only inline fragments (`... on Type`) are read".into());
                    }
                    self.name()?;
                    out.extend(self.selection()?);
                }
                None => return Err("syntax error, unexpected end of document".into()),
                _ => {
                    let first = self.name()?;
                    self.ws();
                    let (key, name) = if self.peek() == Some(b':') {
                        self.i += 1;
                        (first, self.name()?)
                    } else {
                        (first.clone(), first)
                    };
                    self.ws();
                    let args = if self.peek() == Some(b'(') { self.args()? } else { Map::new() };
                    self.ws();
                    let fields = if self.peek() == Some(b'{') { self.selection()? } else { Vec::new() };
                    out.push(Field { key, name, args, fields });
                }
            }
        }
    }

    fn args(&mut self) -> Result<Map<String, Value>, String> {
        self.eat(b'(')?;
        let mut out = Map::new();
        loop {
            self.ws();
            if self.peek() == Some(b')') {
                self.i += 1;
                return Ok(out);
            }
            let k = self.name()?;
            self.eat(b':')?;
            let v = self.value()?;
            out.insert(k, v);
        }
    }

    fn string(&mut self) -> Result<String, String> {
        self.eat(b'"')?;
        let mut out = Vec::new();
        while let Some(c) = self.peek() {
            self.i += 1;
            match c {
                b'"' => return Ok(String::from_utf8_lossy(&out).into_owned()),
                b'\\' => {
                    let e = self.peek().ok_or("syntax error, unterminated string")?;
                    self.i += 1;
                    out.push(match e {
                        b'n' => b'\n',
                        b't' => b'\t',
                        other => other,
                    });
                }
                other => out.push(other),
            }
        }
        Err("syntax error, unterminated string".into())
    }

    fn value(&mut self) -> Result<Value, String> {
        self.ws();
        match self.peek() {
            Some(b'$') => {
                self.i += 1;
                let n = self.name()?;
                Ok(self.vars.get(&n).cloned().unwrap_or(Value::Null))
            }
            Some(b'"') => Ok(Value::String(self.string()?)),
            Some(b'[') => {
                self.i += 1;
                let mut out = Vec::new();
                loop {
                    self.ws();
                    if self.peek() == Some(b']') {
                        self.i += 1;
                        return Ok(Value::Array(out));
                    }
                    out.push(self.value()?);
                }
            }
            Some(b'{') => {
                self.i += 1;
                let mut out = Map::new();
                loop {
                    self.ws();
                    if self.peek() == Some(b'}') {
                        self.i += 1;
                        return Ok(Value::Object(out));
                    }
                    let k = self.name()?;
                    self.eat(b':')?;
                    out.insert(k, self.value()?);
                }
            }
            Some(c) if c == b'-' || c.is_ascii_digit() => {
                let start = self.i;
                self.i += 1;
                while self.peek().is_some_and(|c| c.is_ascii_digit() || c == b'.') {
                    self.i += 1;
                }
                let t = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
                t.parse::<i64>()
                    .map(Value::from)
                    .or_else(|_| t.parse::<f64>().map(Value::from))
                    .map_err(|_| format!("syntax error, bad number {t}"))
            }
            Some(c) if is_name_start(c) => {
                let n = self.name()?;
                Ok(match n.as_str() {
                    "true" => Value::Bool(true),
                    "false" => Value::Bool(false),
                    "null" => Value::Null,
                    // An enum value: kept as its name.
                    _ => Value::String(n),
                })
            }
            _ => Err(format!("syntax error, expected a value at {}", self.i)),
        }
    }
}

/// Keep of `full` only what `fields` selects (under their keys), as a GraphQL server answers.
pub(super) fn project(full: &Value, fields: &[Field]) -> Value {
    match full {
        Value::Array(items) => Value::Array(items.iter().map(|v| project(v, fields)).collect()),
        Value::Object(m) if !fields.is_empty() => {
            let mut out = Map::new();
            for f in fields {
                let v = m.get(&f.name).map(|v| project(v, &f.fields)).unwrap_or(Value::Null);
                // An inline fragment on another type leaves its fields out, not null.
                if v.is_null() && !m.contains_key(&f.name) && f.name != "__typename" {
                    continue;
                }
                out.insert(f.key.clone(), v);
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_operations_with_variables_literals_and_fragments() {
        let vars = serde_json::json!({"files": [{"filename": "a.png"}]});
        let vars = vars.as_object().cloned().unwrap_or_default();
        let (m, f) = parse(
            "mutation FileCreate($files: [FileCreateInput!]!) { fileCreate(files: $files) { files { id ... on MediaImage { image { url } } } userErrors { field message code } } }",
            &vars,
        )
        .expect("parses");
        assert!(m);
        assert_eq!(f[0].name, "fileCreate");
        assert_eq!(f[0].args["files"][0]["filename"], "a.png");
        assert_eq!(f[0].fields[0].fields.len(), 2);
        let (m, f) = parse(
            r#"query { product(id: "gid://shopify/Product/1") { media(first: 50) { nodes { id } } } }"#,
            &Map::new(),
        )
        .expect("parses");
        assert!(!m);
        assert_eq!(f[0].args["id"], "gid://shopify/Product/1");
        assert_eq!(f[0].fields[0].args["first"], 50);
        assert!(parse("query { product(id: ", &Map::new()).is_err());
    }
}
