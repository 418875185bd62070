//! From a request's grammar to a compiled, shared [`ConstraintSpec`].

use std::fmt;
use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::Matcher;
use serde_json::{json, Value};
use tf_core::{ConstraintError, ConstraintSpec, TokenConstraint};

use crate::matcher::GrammarMatcher;
use crate::{GrammarEnv, GrammarError};

/// How JSON grammars lay a value out: `", "` between items and `": "` after keys, as Python's `json.dumps` writes
/// and chat templates render JSON, and no other whitespace. A reply then spends no tokens on indentation and a
/// sampled one cannot wander through whitespace. A schema's own `x-guidance` options replace this.
pub const JSON_LAYOUT: (&str, &str) = (", ", ": ");

/// What a request constrains its reply to. JSON grammars follow [`JSON_LAYOUT`], and strings may hold `\uXXXX` escapes of any printable character (as `ensure_ascii` JSON
/// writers produce) except where the string has a `pattern` or `format`.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// Any JSON object.
    JsonObject,
    /// A JSON value valid under `schema`. `strict`: unsupported keywords and formats are errors; otherwise they
    /// are ignored (and `oneOf` is treated as `anyOf`).
    JsonSchema { schema: Value, strict: bool },
    /// Text matching the regex as a whole (Rust `regex` syntax).
    Regex(String),
    /// Exactly one of the strings.
    Choice(Vec<String>),
    /// An llguidance Lark grammar, with `%json{...}` embedded schemas.
    Lark(String),
}

impl Grammar {
    /// The request field the grammar comes from, for error messages.
    fn context(&self) -> &'static str {
        match self {
            Grammar::JsonObject => "response_format.json_object",
            Grammar::JsonSchema { .. } => "response_format.json_schema",
            Grammar::Regex(_) => "regex",
            Grammar::Choice(_) => "choice",
            Grammar::Lark(_) => "grammar",
        }
    }
}

fn json_grammar(mut schema: Value, strict: bool) -> Result<TopLevelGrammar, String> {
    match &mut schema {
        Value::Object(map) => {
            if !map.contains_key("x-guidance") {
                map.insert(
                    "x-guidance".into(),
                    json!({
                        "whitespace_flexible": false,
                        "item_separator": JSON_LAYOUT.0,
                        "key_separator": JSON_LAYOUT.1,
                        "lenient": !strict,
                        "json_allow_general_unicode_escapes": true
                    }),
                );
            }
        }
        Value::Bool(_) => {}
        other => return Err(format!("the schema must be an object or a boolean, not {}", kind_of(other))),
    }
    Ok(TopLevelGrammar::from_json_schema(schema))
}

/// Strict schemas follow OpenAI's strict mode: an object schema that does not say `additionalProperties` allows
/// no other properties (in OpenAI's strict mode such a schema is refused; here it is read that way), so a reply
/// has only the properties the schema names and cannot grow without bound.
fn close_objects(v: &mut Value) {
    let Value::Object(m) = v else { return };
    let is_object = m.contains_key("properties")
        || m.get("type").is_some_and(|t| t == "object" || t.as_array().is_some_and(|a| a.contains(&json!("object"))));
    if is_object && !m.contains_key("additionalProperties") {
        m.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (k, child) in m.iter_mut() {
        match (k.as_str(), child) {
            // Maps from names to schemas.
            ("properties" | "patternProperties" | "$defs" | "definitions", Value::Object(map)) => {
                map.values_mut().for_each(close_objects)
            }
            // Lists of schemas.
            ("anyOf" | "oneOf" | "allOf" | "prefixItems", Value::Array(list)) => {
                list.iter_mut().for_each(close_objects)
            }
            // One schema (`items` may also be a list in older drafts).
            ("items", Value::Array(list)) => list.iter_mut().for_each(close_objects),
            ("items" | "additionalProperties" | "not" | "contains" | "if" | "then" | "else", c) => close_objects(c),
            _ => {}
        }
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn choice_grammar(options: &[String]) -> Result<TopLevelGrammar, String> {
    if options.is_empty() {
        return Err("at least one choice is required".into());
    }
    if options.iter().any(|o| o.is_empty()) {
        return Err("choices must not be empty strings".into());
    }
    let alts: Vec<String> = options.iter().map(|o| serde_json::to_string(o).expect("a string")).collect();
    Ok(TopLevelGrammar::from_lark(format!("start: {}", alts.join(" | "))))
}

/// llguidance's message on one line, without source excerpts (`1 | ...`, `^`). Regex syntax errors become
/// `invalid regex: <what>`; `at line(column)` positions are kept unless `in_lark` is false (the regex was
/// wrapped into a grammar of ours, so the position would not point into the user's text).
fn clean_message(raw: &str, in_lark: bool) -> String {
    let is_excerpt = |l: &str| {
        l.chars().all(|c| c == '^' || c == '~' || c == ' ')
            || l.split_once(" |").is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
    };
    let lines: Vec<&str> = raw.lines().map(str::trim).filter(|l| !l.is_empty() && !is_excerpt(l)).collect();
    let Some(&first) = lines.first() else { return "invalid grammar".into() };
    let (pos, first) = match first.split_once("): ") {
        Some((p, rest)) if p.starts_with("at ") => (Some(format!("{p})")), rest),
        _ => (None, first),
    };
    let mut out = if first.contains("regex parse error") {
        let what = lines.iter().find_map(|l| l.strip_prefix("error: ")).unwrap_or("syntax error");
        format!("invalid regex: {what}")
    } else {
        let mut parts = vec![first];
        parts.extend(&lines[1..]);
        parts.join("; ")
    };
    if let Some(p) = pos.filter(|_| in_lark) {
        out = format!("{p}: {out}");
    }
    if out.chars().count() > 600 {
        out = out.chars().take(600).collect::<String>() + "…";
    }
    out
}

/// The JSON pointer of the first subschema (depth-first, in key order) that `hit` selects.
fn locate(schema: &Value, hit: &dyn Fn(&serde_json::Map<String, Value>) -> bool) -> Option<String> {
    let obj = schema.as_object()?;
    if hit(obj) {
        return Some(String::new());
    }
    let esc = |k: &str| k.replace('~', "~0").replace('/', "~1");
    for (k, v) in obj {
        let found = match k.as_str() {
            "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" => v
                .as_object()
                .into_iter()
                .flatten()
                .find_map(|(name, sub)| locate(sub, hit).map(|p| format!("/{}{p}", esc(name)))),
            "anyOf" | "oneOf" | "allOf" | "prefixItems" | "items" if v.is_array() => v
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
                .find_map(|(i, sub)| locate(sub, hit).map(|p| format!("/{i}{p}"))),
            "items"
            | "additionalProperties"
            | "additionalItems"
            | "not"
            | "if"
            | "then"
            | "else"
            | "contains"
            | "propertyNames"
            | "unevaluatedItems"
            | "unevaluatedProperties" => locate(v, hit),
            _ => None,
        };
        if let Some(p) = found {
            return Some(format!("/{}{p}", esc(k)));
        }
    }
    None
}

/// llguidance's schema errors name the keyword or format but not where it is; this adds the location.
fn schema_message(schema: &Value, msg: String) -> String {
    let keyword = msg
        .split_once("Unimplemented keys: [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .and_then(|(list, _)| list.split(',').next())
        .map(|k| k.trim().trim_matches('"').to_string());
    if let Some(k) = keyword.filter(|k| !k.is_empty()) {
        let at = locate(schema, &|o| o.contains_key(&k)).map(|p| if p.is_empty() { "/".into() } else { p });
        return match at {
            Some(at) => format!("unsupported keyword '{k}' at {at}"),
            None => format!("unsupported keyword '{k}'"),
        };
    }
    if let Some((_, fmt)) = msg.split_once("Unknown format: ") {
        let fmt = fmt.split([';', '\n']).next().unwrap_or_default().trim().to_string();
        let at = locate(schema, &|o| o.get("format").and_then(Value::as_str) == Some(fmt.as_str()));
        if let Some(at) = at {
            return format!("unsupported format '{fmt}' at {}", if at.is_empty() { "/" } else { &at });
        }
    }
    msg
}

/// Compiles `g` against `env`. The result is shared by every sequence using the grammar; the work is the
/// grammar's (lexer and parser tables), not the vocabulary's.
pub fn compile(env: &GrammarEnv, g: &Grammar) -> Result<Arc<dyn ConstraintSpec>, GrammarError> {
    let ctx = g.context();
    let top = match g {
        Grammar::JsonObject => json_grammar(json!({ "type": "object" }), true),
        Grammar::JsonSchema { schema, strict } => {
            let mut schema = schema.clone();
            if *strict {
                close_objects(&mut schema);
            }
            json_grammar(schema, *strict)
        }
        Grammar::Regex(rx) => Ok(TopLevelGrammar::from_regex(rx)),
        Grammar::Choice(options) => choice_grammar(options),
        Grammar::Lark(src) => {
            if src.trim().is_empty() {
                Err("the grammar is empty".into())
            } else {
                token_refs_are_special(env, src).map(|()| TopLevelGrammar::from_lark(src.clone()))
            }
        }
    }
    .map_err(|m| GrammarError::new(ctx, m))?;

    let explain = |raw: String| {
        let msg = clean_message(&raw, !matches!(g, Grammar::Regex(_)));
        match g {
            Grammar::JsonSchema { schema, .. } => schema_message(schema, msg),
            _ => msg,
        }
    };
    let parser = env.factory().create_parser(top).map_err(|e| GrammarError::new(ctx, explain(format!("{e:#}"))))?;
    let proto = Matcher::new(Ok(parser));
    if let Some(e) = proto.get_error() {
        return Err(GrammarError::new(ctx, explain(e)));
    }
    Ok(Arc::new(Spec { env: env.clone(), proto, kind: ctx }))
}

/// Checks every `<[id]>` token reference of a Lark grammar: the id must be a special (control) token of the
/// vocabulary. llguidance matches such a reference by id when it builds a mask but by the token's bytes when it
/// consumes the token, and only special tokens are marked as such in the token trie; an ordinary token (an added
/// one such as Qwen's `</tool_call>`) must be written as its text instead.
fn token_refs_are_special(env: &GrammarEnv, src: &str) -> Result<(), String> {
    let tok = env.tokenizer();
    for (at, _) in src.match_indices("<[") {
        let rest = &src[at + 2..];
        let Some(end) = rest.find("]>") else { continue };
        let Ok(id) = rest[..end].parse::<u32>() else { continue };
        match tok.token_kind(id) {
            Some(k) if k.is_special() => {}
            Some(_) => {
                let text = String::from_utf8_lossy(tok.token_to_piece(id)).into_owned();
                return Err(format!(
                    "<[{id}]> is not a special token: write its text {} instead",
                    serde_json::to_string(&text).unwrap_or_default()
                ));
            }
            None => return Err(format!("<[{id}]> is outside the vocabulary ({} ids)", env.vocab_size())),
        }
    }
    Ok(())
}

/// A compiled grammar: the matcher in its start state, cloned for each sequence (clones share the lexer and
/// its caches).
pub(crate) struct Spec {
    env: GrammarEnv,
    proto: Matcher,
    kind: &'static str,
}

impl fmt::Debug for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrammarSpec").field("kind", &self.kind).field("env", &self.env).finish()
    }
}

impl ConstraintSpec for Spec {
    fn start(&self) -> Result<Box<dyn TokenConstraint>, ConstraintError> {
        Ok(Box::new(GrammarMatcher::new(self.env.clone(), self.proto.clone())))
    }
}
