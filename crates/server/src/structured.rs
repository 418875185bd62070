//! Structured output: the request fields that constrain a reply (`response_format` on chat and completions,
//! `text.format` on responses, and the extensions `guided_json`, `guided_regex`, `guided_choice`,
//! `guided_grammar`) read into a [`Grammar`], compiled against the server's [`GrammarEnv`] into the constraint
//! the engine applies (DESIGN.md §8).

use crate::error::ApiError;
use crate::params::{kind, Fields};
use crate::AppState;
use serde_json::{Map, Value};
use std::sync::Arc;
use tf_core::ConstraintSpec;
use tf_grammar::{Grammar, GrammarEnv};

/// A grammar and the request field it came from (named in errors).
#[derive(Clone, Debug, PartialEq)]
pub struct OutputGrammar {
    pub grammar: Grammar,
    pub param: String,
}

/// Where the output format sits in a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FormatField {
    /// `response_format` (chat and completions).
    ResponseFormat,
    /// `text.format` (responses).
    TextFormat,
}

/// The grammar a request asks for, if any. At most one of the format field (other than plain text) and the
/// `guided_*` extensions may be given.
pub fn output_grammar(f: &Fields<'_>, field: FormatField) -> Result<Option<OutputGrammar>, ApiError> {
    let mut found: Vec<OutputGrammar> = Vec::new();
    match field {
        FormatField::ResponseFormat => {
            if let Some(g) = response_format(f.get("response_format"))? {
                found.push(g);
            }
        }
        FormatField::TextFormat => match f.get("text") {
            None => {}
            Some(Value::Object(t)) => {
                if let Some(g) = text_format(t.get("format").filter(|v| !v.is_null()))? {
                    found.push(g);
                }
            }
            Some(v) => return Err(ApiError::field("text", format!("expected an object, got {}", kind(v)))),
        },
    }
    if let Some(v) = f.get("guided_json") {
        let schema = match v {
            Value::String(s) => serde_json::from_str::<Value>(s)
                .map_err(|e| ApiError::field("guided_json", format!("the string is not JSON: {e}")))?,
            v => v.clone(),
        };
        check_schema(&schema, "guided_json")?;
        found.push(OutputGrammar {
            grammar: Grammar::JsonSchema { schema, strict: false },
            param: "guided_json".into(),
        });
    }
    if let Some(rx) = f.str("guided_regex")? {
        found.push(OutputGrammar { grammar: Grammar::Regex(rx.to_string()), param: "guided_regex".into() });
    }
    if let Some(v) = f.get("guided_choice") {
        let Value::Array(items) = v else {
            return Err(ApiError::field("guided_choice", format!("expected an array of strings, got {}", kind(v))));
        };
        let mut choices = Vec::with_capacity(items.len());
        for (i, x) in items.iter().enumerate() {
            match x {
                Value::String(s) => choices.push(s.clone()),
                v => {
                    return Err(ApiError::field(
                        &format!("guided_choice[{i}]"),
                        format!("expected a string, got {}", kind(v)),
                    ))
                }
            }
        }
        found.push(OutputGrammar { grammar: Grammar::Choice(choices), param: "guided_choice".into() });
    }
    if let Some(g) = f.str("guided_grammar")? {
        found.push(OutputGrammar { grammar: Grammar::Lark(g.to_string()), param: "guided_grammar".into() });
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|g| g.param.as_str()).collect();
        return Err(ApiError::field(
            &found[1].param,
            format!("only one output constraint per request; this request gives {}", names.join(", ")),
        ));
    }
    Ok(found.pop())
}

/// A JSON schema must be an object or a boolean.
fn check_schema(schema: &Value, param: &str) -> Result<(), ApiError> {
    match schema {
        Value::Object(_) | Value::Bool(_) => Ok(()),
        v => Err(ApiError::field(param, format!("a JSON schema is an object or a boolean, not {}", kind(v)))),
    }
}

/// `type` of a format object, checked.
fn format_type<'a>(m: &'a Map<String, Value>, param: &str) -> Result<&'a str, ApiError> {
    match m.get("type") {
        Some(Value::String(t)) if matches!(t.as_str(), "text" | "json_object" | "json_schema") => Ok(t),
        Some(other) => Err(ApiError::field(
            param,
            format!("type must be \"text\", \"json_object\" or \"json_schema\", got {other}"),
        )),
        None => Err(ApiError::field(param, "needs a `type` (\"text\", \"json_object\" or \"json_schema\")")),
    }
}

fn strict_of(m: &Map<String, Value>, param: &str) -> Result<bool, ApiError> {
    match m.get("strict") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(ApiError::field(&format!("{param}.strict"), format!("expected a boolean, got {}", kind(v)))),
    }
}

fn name_of(m: &Map<String, Value>, param: &str) -> Result<(), ApiError> {
    match m.get("name") {
        None | Some(Value::Null) | Some(Value::String(_)) => Ok(()),
        Some(v) => Err(ApiError::field(&format!("{param}.name"), format!("expected a string, got {}", kind(v)))),
    }
}

/// Chat/completions `response_format`: `{"type": "text" | "json_object"}` or
/// `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`.
fn response_format(v: Option<&Value>) -> Result<Option<OutputGrammar>, ApiError> {
    let param = "response_format";
    let Some(v) = v else { return Ok(None) };
    let Value::Object(m) = v else {
        return Err(ApiError::field(param, format!("expected an object, got {}", kind(v))));
    };
    match format_type(m, param)? {
        "text" => Ok(None),
        "json_object" => Ok(Some(OutputGrammar { grammar: Grammar::JsonObject, param: param.into() })),
        _ => {
            let at = "response_format.json_schema";
            let js = match m.get("json_schema") {
                Some(Value::Object(js)) => js,
                Some(v) => return Err(ApiError::field(at, format!("expected an object, got {}", kind(v)))),
                None => return Err(ApiError::field(at, "is required for type \"json_schema\"")),
            };
            name_of(js, at)?;
            let strict = strict_of(js, at)?;
            let schema = js.get("schema").cloned().unwrap_or_else(|| Value::Object(Map::new()));
            let param = format!("{at}.schema");
            check_schema(&schema, &param)?;
            Ok(Some(OutputGrammar { grammar: Grammar::JsonSchema { schema, strict }, param }))
        }
    }
}

/// Responses `text.format`: `{"type": "text" | "json_object"}` or `{"type": "json_schema", "name", "schema",
/// "strict"}`.
fn text_format(v: Option<&Value>) -> Result<Option<OutputGrammar>, ApiError> {
    let param = "text.format";
    let Some(v) = v else { return Ok(None) };
    let Value::Object(m) = v else {
        return Err(ApiError::field(param, format!("expected an object, got {}", kind(v))));
    };
    match format_type(m, param)? {
        "text" => Ok(None),
        "json_object" => Ok(Some(OutputGrammar { grammar: Grammar::JsonObject, param: param.into() })),
        _ => {
            name_of(m, param)?;
            let strict = strict_of(m, param)?;
            let param = "text.format.schema".to_string();
            let schema = match m.get("schema") {
                Some(s) => s.clone(),
                None => return Err(ApiError::field(&param, "is required for type \"json_schema\"")),
            };
            check_schema(&schema, &param)?;
            Ok(Some(OutputGrammar { grammar: Grammar::JsonSchema { schema, strict }, param }))
        }
    }
}

/// The server's grammar environment, built once from the tokenizer and the model's stop ids; the reason
/// when it could not be built.
pub fn build_env(tok: &Arc<tf_text::Tokenizer>) -> Result<GrammarEnv, String> {
    GrammarEnv::new(tok.clone(), tok.stop_ids()).map_err(|e| e.to_string())
}

/// Compiles a request's grammar: a grammar that cannot compile is a 400 naming its field.
pub fn compile(st: &AppState, g: &OutputGrammar) -> Result<Arc<dyn ConstraintSpec>, ApiError> {
    let env = st.grammar.as_ref().map_err(|why| {
        ApiError::field(&g.param, format!("constrained decoding is not available for this model: {why}"))
            .with_code("unsupported_response_format")
    })?;
    tf_grammar::compile(env, &g.grammar).map_err(|e| ApiError::field(&g.param, e.message).with_code("invalid_grammar"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(body: Value, field: FormatField) -> Result<Option<OutputGrammar>, ApiError> {
        let m = body.as_object().unwrap().clone();
        output_grammar(&Fields::new(&m), field)
    }

    #[test]
    fn formats_map_to_grammars() {
        let rf = FormatField::ResponseFormat;
        assert_eq!(parse(json!({}), rf).unwrap(), None);
        assert_eq!(parse(json!({"response_format": {"type": "text"}}), rf).unwrap(), None);
        let g = parse(json!({"response_format": {"type": "json_object"}}), rf).unwrap().unwrap();
        assert_eq!(g.grammar, Grammar::JsonObject);
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let g = parse(
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}}}),
            rf,
        )
        .unwrap()
        .unwrap();
        assert_eq!(g.grammar, Grammar::JsonSchema { schema: schema.clone(), strict: true });
        assert_eq!(g.param, "response_format.json_schema.schema");
        let g = parse(
            json!({"text": {"format": {"type": "json_schema", "name": "x", "schema": schema}}}),
            FormatField::TextFormat,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (g.grammar, g.param.as_str()),
            (Grammar::JsonSchema { schema, strict: false }, "text.format.schema")
        );
        let g = parse(json!({"guided_choice": ["yes", "no"]}), rf).unwrap().unwrap();
        assert_eq!(g.grammar, Grammar::Choice(vec!["yes".into(), "no".into()]));
        let g = parse(json!({"guided_json": "{\"type\": \"string\"}"}), rf).unwrap().unwrap();
        assert_eq!(g.grammar, Grammar::JsonSchema { schema: json!({"type": "string"}), strict: false });
        let g = parse(json!({"guided_regex": "[0-9]+"}), rf).unwrap().unwrap();
        assert_eq!(g.grammar, Grammar::Regex("[0-9]+".into()));
        let g = parse(json!({"guided_grammar": "start: \"a\""}), rf).unwrap().unwrap();
        assert_eq!(g.grammar, Grammar::Lark("start: \"a\"".into()));
    }

    #[test]
    fn bad_formats_name_their_field() {
        let rf = FormatField::ResponseFormat;
        for (body, param) in [
            (json!({"response_format": "json"}), "response_format"),
            (json!({"response_format": {"type": "yaml"}}), "response_format"),
            (json!({"response_format": {}}), "response_format"),
            (json!({"response_format": {"type": "json_schema"}}), "response_format.json_schema"),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"schema": 5}}}),
                "response_format.json_schema.schema",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"strict": "yes"}}}),
                "response_format.json_schema.strict",
            ),
            (json!({"guided_choice": "a"}), "guided_choice"),
            (json!({"guided_choice": ["a", 1]}), "guided_choice[1]"),
            (json!({"guided_json": "{"}), "guided_json"),
            (json!({"guided_json": [1]}), "guided_json"),
            (json!({"guided_regex": "a", "guided_choice": ["a"]}), "guided_choice"),
            (json!({"response_format": {"type": "json_object"}, "guided_regex": "a"}), "guided_regex"),
        ] {
            let e = parse(body.clone(), rf).expect_err(&body.to_string());
            assert_eq!((e.param.as_deref(), e.status.as_u16()), (Some(param), 400), "{body}");
        }
        for (body, param) in [
            (json!({"text": 1}), "text"),
            (json!({"text": {"format": {"type": "json_schema", "name": "x"}}}), "text.format.schema"),
            (json!({"text": {"format": {"type": "json_schema", "schema": "s"}}}), "text.format.schema"),
        ] {
            let e = parse(body.clone(), FormatField::TextFormat).expect_err(&body.to_string());
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
        }
    }
}
