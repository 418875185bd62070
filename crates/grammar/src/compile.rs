//! From a request's grammar to a compiled, shared [`ConstraintSpec`].

use std::fmt;
use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::Matcher;
use serde_json::{json, Value};
use tf_core::{ConstraintError, ConstraintSpec, TokenConstraint};

use crate::matcher::GrammarMatcher;
use crate::{GrammarEnv, GrammarError};

/// The whitespace JSON grammars allow between tokens (one run per gap): at most 32 blanks, so indented
/// output is possible and a sampled reply cannot loop on whitespace forever. A schema's own `x-guidance`
/// options replace this.
pub const JSON_WHITESPACE: &str = r"[\x20\x0A\x0D\x09]{1,32}";

/// What a request constrains its reply to.
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
                map.insert("x-guidance".into(), json!({ "whitespace_pattern": JSON_WHITESPACE, "lenient": !strict }));
            }
        }
        Value::Bool(_) => {}
        other => return Err(format!("the schema must be an object or a boolean, not {}", kind_of(other))),
    }
    Ok(TopLevelGrammar::from_json_schema(schema))
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

/// The first line of llguidance's message without its internal prefixes (`Grammar error:`, `at line ...`
/// trailers are kept: they point into the user's grammar).
fn clean_message(raw: &str) -> String {
    let mut msg = raw.trim();
    for prefix in ["Grammar error:", "error:"] {
        if let Some(rest) = msg.strip_prefix(prefix) {
            msg = rest.trim_start();
        }
    }
    let lines: Vec<&str> = msg.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let mut out = lines.join("; ");
    if out.chars().count() > 600 {
        out = out.chars().take(600).collect::<String>() + "…";
    }
    if out.is_empty() {
        "invalid grammar".into()
    } else {
        out
    }
}

/// Compiles `g` against `env`. The result is shared by every sequence using the grammar; the work is the
/// grammar's (lexer and parser tables), not the vocabulary's.
pub fn compile(env: &GrammarEnv, g: &Grammar) -> Result<Arc<dyn ConstraintSpec>, GrammarError> {
    let ctx = g.context();
    let top = match g {
        Grammar::JsonObject => json_grammar(json!({ "type": "object" }), true),
        Grammar::JsonSchema { schema, strict } => json_grammar(schema.clone(), *strict),
        Grammar::Regex(rx) => Ok(TopLevelGrammar::from_regex(rx)),
        Grammar::Choice(options) => choice_grammar(options),
        Grammar::Lark(src) => {
            if src.trim().is_empty() {
                Err("the grammar is empty".into())
            } else {
                Ok(TopLevelGrammar::from_lark(src.clone()))
            }
        }
    }
    .map_err(|m| GrammarError::new(ctx, m))?;

    let parser =
        env.factory().create_parser(top).map_err(|e| GrammarError::new(ctx, clean_message(&format!("{e:#}"))))?;
    let proto = Matcher::new(Ok(parser));
    if let Some(e) = proto.get_error() {
        return Err(GrammarError::new(ctx, clean_message(&e)));
    }
    Ok(Arc::new(Spec { env: env.clone(), proto, kind: ctx }))
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
