//! Python-compatible text forms of JSON-like values, as the reference (Jinja2 under `transformers`) prints
//! them: `json.dumps` for the `tojson` filter, `repr`/`str` for `{{ value }}`, and float `repr`.

use serde_json::Value as Json;

/// Options of Python's `json.dumps` that chat templates pass to `tojson`.
#[derive(Debug, Clone, PartialEq)]
pub struct DumpOptions {
    /// `ensure_ascii`: escape every character outside printable ASCII as `\uXXXX`.
    pub ensure_ascii: bool,
    /// `indent`: `None` for one line; `Some(s)` puts each item on its own line, indented by `s` per level.
    pub indent: Option<String>,
    /// `separators`: (item separator, key separator). `None` takes Python's default, which depends on `indent`.
    pub separators: Option<(String, String)>,
    /// `sort_keys`
    pub sort_keys: bool,
}

impl Default for DumpOptions {
    /// What `transformers` passes: `ensure_ascii=False`, everything else Python's default.
    fn default() -> Self {
        Self { ensure_ascii: false, indent: None, separators: None, sort_keys: false }
    }
}

/// `json.dumps(value, ...)` with the given options.
pub fn json_dumps(value: &Json, opts: &DumpOptions) -> String {
    let (item_sep, key_sep) = match &opts.separators {
        Some((a, b)) => (a.clone(), b.clone()),
        None if opts.indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let mut out = String::new();
    let d = Dumper { opts, item_sep: &item_sep, key_sep: &key_sep };
    d.write(&mut out, value, 0);
    out
}

struct Dumper<'a> {
    opts: &'a DumpOptions,
    item_sep: &'a str,
    key_sep: &'a str,
}

impl Dumper<'_> {
    fn newline(&self, out: &mut String, level: usize) {
        if let Some(ind) = &self.opts.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    }

    fn write(&self, out: &mut String, v: &Json, level: usize) {
        match v {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Number(n) => out.push_str(&number_text(n)),
            Json::String(s) => json_string(out, s, self.opts.ensure_ascii),
            Json::Array(items) => {
                if items.is_empty() {
                    out.push_str("[]");
                    return;
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(self.item_sep);
                    }
                    self.newline(out, level + 1);
                    self.write(out, item, level + 1);
                }
                self.newline(out, level);
                out.push(']');
            }
            Json::Object(map) => {
                if map.is_empty() {
                    out.push_str("{}");
                    return;
                }
                let mut entries: Vec<(&String, &Json)> = map.iter().collect();
                if self.opts.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, item)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(self.item_sep);
                    }
                    self.newline(out, level + 1);
                    json_string(out, k, self.opts.ensure_ascii);
                    out.push_str(self.key_sep);
                    self.write(out, item, level + 1);
                }
                self.newline(out, level);
                out.push('}');
            }
        }
    }
}

fn number_text(n: &serde_json::Number) -> String {
    if let Some(i) = n.as_i64() {
        i.to_string()
    } else if let Some(u) = n.as_u64() {
        u.to_string()
    } else {
        float_repr(n.as_f64().unwrap_or(f64::NAN))
    }
}

/// A JSON string literal the way Python's `json` encoder writes it.
fn json_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ensure_ascii && !(' '..='~').contains(&c) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{:04x}", unit));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: the shortest digits that round-trip, positional for exponents in
/// [-4, 16), scientific (`1e-05`, `1.5e+16`) otherwise; integral values keep a `.0`.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.to_string();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "d.ddde<exp>".
    let sci = format!("{:e}", f);
    let (mantissa, exp) = sci.split_once('e').expect("`{:e}` always has an exponent");
    let exp: i32 = exp.parse().expect("exponent is an integer");
    let (neg, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let mut out = String::new();
    if neg {
        out.push('-');
    }
    if (-4..16).contains(&exp) {
        if exp < 0 {
            out.push_str("0.");
            for _ in 0..(-exp - 1) {
                out.push('0');
            }
            out.push_str(&digits);
        } else {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                for _ in digits.len()..int_len {
                    out.push('0');
                }
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push('e');
        out.push(if exp < 0 { '-' } else { '+' });
        out.push_str(&format!("{:02}", exp.abs()));
    }
    out
}

/// Python's `str(value)`: strings as they are, everything else as `repr`.
pub fn py_str(v: &Json) -> String {
    match v {
        Json::String(s) => s.clone(),
        other => {
            let mut out = String::new();
            py_repr(&mut out, other);
            out
        }
    }
}

/// Python's `repr(value)` for the JSON-like types (dict, list, str, int, float, bool, None).
pub fn py_repr(out: &mut String, v: &Json) {
    match v {
        Json::Null => out.push_str("None"),
        Json::Bool(b) => out.push_str(if *b { "True" } else { "False" }),
        Json::Number(n) => out.push_str(&number_text(n)),
        Json::String(s) => str_repr(out, s),
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr(out, item);
            }
            out.push(']');
        }
        Json::Object(map) => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                str_repr(out, k);
                out.push_str(": ");
                py_repr(out, item);
            }
            out.push('}');
        }
    }
}

/// Python's `repr(str)`: single quotes unless the text has `'` and no `"`.
fn str_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (0x80..0xa0).contains(&(c as u32)) => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push(quote);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn float_repr_matches_python() {
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.0, "123456789012345.0"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (0.00012, "0.00012"),
            (3.25, "3.25"),
            (1e100, "1e+100"),
            (0.0, "0.0"),
            (100.0, "100.0"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn dumps_default_separators_and_unicode() {
        let v = json!({"b": [1, 2.0, "x\"y\n"], "a": {"é": null, "t": true}});
        assert_eq!(
            json_dumps(&v, &DumpOptions::default()),
            r#"{"b": [1, 2.0, "x\"y\n"], "a": {"é": null, "t": true}}"#
        );
        let ascii = DumpOptions { ensure_ascii: true, ..Default::default() };
        assert_eq!(json_dumps(&json!("é😀\u{7f}"), &ascii), r#""\u00e9\ud83d\ude00\u007f""#);
    }

    #[test]
    fn dumps_indent_and_sort() {
        let v = json!({"b": [1, {}], "a": []});
        let opts = DumpOptions { indent: Some("  ".into()), sort_keys: true, ..Default::default() };
        assert_eq!(json_dumps(&v, &opts), "{\n  \"a\": [],\n  \"b\": [\n    1,\n    {}\n  ]\n}");
        let compact = DumpOptions { separators: Some((",".into(), ":".into())), ..Default::default() };
        assert_eq!(json_dumps(&v, &compact), r#"{"b":[1,{}],"a":[]}"#);
    }

    #[test]
    fn repr_matches_python() {
        let v = json!({"k": ["it's", "a\"b", null, true, 1.5], "n": 3});
        assert_eq!(py_str(&v), r#"{'k': ["it's", 'a"b', None, True, 1.5], 'n': 3}"#);
        assert_eq!(py_str(&json!("plain")), "plain");
    }
}
