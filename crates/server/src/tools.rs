//! Function tools on chat and responses: reading `tools`, `tool_choice` and `parallel_tool_calls`, passing
//! earlier calls back through the chat template, taking calls out of replies with the model's [`ToolFormat`]
//! parser, and forcing a call (`required` or a named function) with a grammar in that format.

use crate::error::ApiError;
use crate::params::{kind, Fields};
use crate::reply::ReplyEvent;
use crate::structured::OutputGrammar;
use crate::AppState;
use serde_json::{json, Map, Value};
use tf_grammar::Grammar;
use tf_text::{ToolFormat, ToolParser, ToolSpec};

/// Which tool-call parser a server uses (`serve --tool-parser`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ToolParserSetting {
    /// From the chat template (and the vocabulary).
    #[default]
    Auto,
    /// Never parse calls: they stay in the reply's text.
    Off,
    Format(ToolFormat),
}

impl ToolParserSetting {
    /// `auto`, `none`, `hermes`, `llama3`, `mistral`, `harmony`.
    pub fn parse(s: &str) -> Result<ToolParserSetting, String> {
        match s {
            "auto" => Ok(ToolParserSetting::Auto),
            "none" => Ok(ToolParserSetting::Off),
            _ => ToolFormat::from_name(s).map(ToolParserSetting::Format).ok_or_else(|| {
                format!("unknown tool parser `{s}` (expected auto, none, hermes, llama3, mistral or harmony)")
            }),
        }
    }

    /// The format in use for a model with this template and tokenizer.
    pub fn resolve(self, template: Option<&str>, tok: &tf_text::Tokenizer) -> Option<ToolFormat> {
        match self {
            ToolParserSetting::Off => None,
            ToolParserSetting::Format(f) => Some(f),
            ToolParserSetting::Auto => ToolFormat::detect(template?, &|t| tok.id_of(t).is_some()),
        }
    }
}

/// One offered function.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    /// The JSON schema of its arguments (an object), if given.
    pub parameters: Option<Value>,
}

/// `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// Tools are shown to the model, but replies are not parsed for calls.
    None,
    Auto,
    /// At least one call, forced.
    Required,
    /// A call of this function, forced.
    Named(String),
}

/// The tools of one request.
#[derive(Clone, Debug)]
pub struct ToolRequest {
    pub tools: Vec<Tool>,
    /// The tools as chat templates take them (`[{"type": "function", "function": {...}}]`).
    pub rendered: Value,
    pub choice: ToolChoice,
    pub parallel: bool,
}

/// The request shape of `tools`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// `{"type": "function", "function": {"name", "description", "parameters"}}`
    Chat,
    /// `{"type": "function", "name", "description", "parameters"}`
    Responses,
}

/// Reads `tools`, `tool_choice` and `parallel_tool_calls`. `None` when no tools are given (a `tool_choice` of
/// `auto` or `none` is then fine; `required` or a name is a 400).
pub fn read(f: &Fields<'_>, shape: Shape) -> Result<Option<ToolRequest>, ApiError> {
    let parallel = f.bool("parallel_tool_calls")?.unwrap_or(true);
    let list = match f.get("tools") {
        None => None,
        Some(Value::Array(a)) if a.is_empty() => None,
        Some(Value::Array(a)) => Some(a),
        Some(v) => return Err(ApiError::field("tools", format!("expected an array, got {}", kind(v)))),
    };
    let mut tools = Vec::new();
    let mut rendered = Vec::new();
    for (i, t) in list.into_iter().flatten().enumerate() {
        let at = format!("tools[{i}]");
        let Value::Object(o) = t else {
            return Err(ApiError::field(&at, format!("expected an object, got {}", kind(t))));
        };
        match o.get("type") {
            Some(Value::String(ty)) if ty == "function" => {}
            Some(Value::String(ty)) => {
                return Err(ApiError::field(
                    &format!("{at}.type"),
                    format!("tools of type `{ty}` are not supported (only \"function\")"),
                ))
            }
            _ => return Err(ApiError::field(&format!("{at}.type"), "must be \"function\"")),
        }
        let (def, def_at) = match shape {
            Shape::Chat => match o.get("function") {
                Some(Value::Object(d)) => (d, format!("{at}.function")),
                _ => return Err(ApiError::field(&format!("{at}.function"), "expected an object")),
            },
            Shape::Responses => (o, at.clone()),
        };
        let name = match def.get("name") {
            Some(Value::String(n)) if !n.is_empty() => n.clone(),
            _ => return Err(ApiError::field(&format!("{def_at}.name"), "expected a non-empty string")),
        };
        if tools.iter().any(|t: &Tool| t.name == name) {
            return Err(ApiError::field(&format!("{def_at}.name"), format!("the function `{name}` is given twice")));
        }
        let parameters = match def.get("parameters") {
            None | Some(Value::Null) => None,
            Some(p @ Value::Object(_)) => Some(p.clone()),
            Some(p) => {
                return Err(ApiError::field(
                    &format!("{def_at}.parameters"),
                    format!("expected a JSON schema object, got {}", kind(p)),
                ))
            }
        };
        let mut func = Map::new();
        func.insert("name".into(), Value::String(name.clone()));
        if let Some(d) = def.get("description").filter(|d| !d.is_null()) {
            func.insert("description".into(), d.clone());
        }
        if let Some(p) = &parameters {
            func.insert("parameters".into(), p.clone());
        }
        rendered.push(json!({"type": "function", "function": func}));
        tools.push(Tool { name, parameters });
    }
    let choice = match f.get("tool_choice") {
        None => ToolChoice::Auto,
        Some(Value::String(c)) => match c.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::field(
                    "tool_choice",
                    format!("expected \"none\", \"auto\", \"required\" or a function, got \"{other}\""),
                ))
            }
        },
        Some(Value::Object(o)) => {
            // Chat: {"type": "function", "function": {"name"}}; responses: {"type": "function", "name"}.
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .or_else(|| o.get("name"))
                .and_then(Value::as_str)
                .filter(|_| o.get("type").and_then(Value::as_str) == Some("function"));
            match name {
                Some(n) => ToolChoice::Named(n.to_string()),
                None => {
                    return Err(ApiError::field(
                        "tool_choice",
                        "expected {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    ))
                }
            }
        }
        Some(v) => {
            return Err(ApiError::field("tool_choice", format!("expected a string or an object, got {}", kind(v))))
        }
    };
    match &choice {
        ToolChoice::Required if tools.is_empty() => {
            return Err(ApiError::field("tool_choice", "\"required\" needs `tools`"))
        }
        ToolChoice::Named(n) if !tools.iter().any(|t| &t.name == n) => {
            return Err(ApiError::field("tool_choice", format!("the function `{n}` is not among `tools`")))
        }
        _ => {}
    }
    if tools.is_empty() {
        return Ok(None);
    }
    Ok(Some(ToolRequest { tools, rendered: Value::Array(rendered), choice, parallel }))
}

/// Earlier calls in assistant messages go back to the template as transformers expects them: `arguments` as
/// an object (templates render it with `tojson`), so a JSON string sent by an OpenAI client is parsed; text
/// that is not a JSON object stays a string.
pub fn arguments_as_objects(messages: &mut [Value]) {
    for m in messages.iter_mut() {
        let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) else { continue };
        for c in calls {
            let Some(args) = c.get_mut("function").and_then(|f| f.get_mut("arguments")) else { continue };
            if let Value::String(s) = args {
                if let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(s) {
                    *args = v;
                }
            }
        }
    }
}

/// Mistral's templates take call ids of exactly 9 ASCII letters and digits and refuse others (OpenAI-style
/// `call_…` ids, this server's included). For a template that writes `[TOOL_CALLS]`, every other id of an earlier
/// call (`tool_calls[].id`) and of a tool result (`tool_call_id`) is rendered as 9 letters and digits derived
/// from it (the same id always gives the same ones), so calls and results still pair up.
pub fn call_ids_for_template(template: &str, messages: &mut [Value]) {
    if !template.contains("[TOOL_CALLS]") {
        return;
    }
    let fix = |v: &mut Value| {
        if let Value::String(id) = v {
            if id.len() != 9 || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
                *id = nine_alphanumerics(id);
            }
        }
    };
    for m in messages.iter_mut() {
        if let Some(id) = m.get_mut("tool_call_id") {
            fix(id);
        }
        for c in m.get_mut("tool_calls").and_then(Value::as_array_mut).into_iter().flatten() {
            if let Some(id) = c.get_mut("id") {
                fix(id);
            }
        }
    }
}

/// 9 letters and digits from a 64-bit FNV-1a hash of `id` (62^9 > 2^64, so every hash has its own).
fn nine_alphanumerics(id: &str) -> String {
    const DIGITS: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    (0..9)
        .map(|_| {
            let d = DIGITS[(h % 62) as usize] as char;
            h /= 62;
            d
        })
        .collect()
}

/// How a request's reply is handled for tools: the parser (when calls are parsed), the grammar that forces
/// a call (`required` or named), and whether the reply ends with its first call.
pub struct ToolPlan {
    pub format: Option<ToolFormat>,
    pub forced: Option<OutputGrammar>,
    /// `parallel_tool_calls: false` (Anthropic: `disable_parallel_tool_use`): at most one call, and the reply
    /// ends as soon as it is complete (`ReplySetup::first_call_only`).
    pub first_only: bool,
}

/// Decides parsing and forcing for a request. With `tool_choice: "none"` the tools are rendered but nothing is
/// parsed or forced; forcing needs a known format (the template's, or `--tool-parser`).
pub fn plan(st: &AppState, req: Option<&ToolRequest>) -> Result<ToolPlan, ApiError> {
    let Some(req) = req else { return Ok(ToolPlan { format: None, forced: None, first_only: false }) };
    if req.choice == ToolChoice::None {
        return Ok(ToolPlan { format: None, forced: None, first_only: false });
    }
    let format = st.tool_format;
    let forced = match (&req.choice, format) {
        (ToolChoice::Auto | ToolChoice::None, _) => None,
        (_, None) => {
            return Err(ApiError::field(
                "tool_choice",
                format!(
                    "the model `{}` has no known tool-call format (its chat template shows none), so a call cannot \
                     be forced; start the server with --tool-parser",
                    st.model.id
                ),
            ))
        }
        (ToolChoice::Required, Some(fmt)) => Some(forcing(st, fmt, &req.tools, req.parallel)),
        (ToolChoice::Named(n), Some(fmt)) => {
            let one: Vec<Tool> = req.tools.iter().filter(|t| &t.name == n).cloned().collect();
            Some(forcing(st, fmt, &one, false))
        }
    };
    Ok(ToolPlan { format, forced, first_only: !req.parallel })
}

fn forcing(st: &AppState, format: ToolFormat, tools: &[Tool], parallel: bool) -> OutputGrammar {
    let specs: Vec<ToolSpec<'_>> =
        tools.iter().map(|t| ToolSpec { name: &t.name, parameters: t.parameters.as_ref() }).collect();
    let tok = &st.model.tokenizer;
    // Only control tokens are referenced by id; other markers (Qwen's `<tool_call>` is an ordinary added token)
    // are matched as their text, which the tokenizer spells as that one token.
    let special = |m: &str| tok.id_of(m).filter(|&id| tok.token_kind(id).is_some_and(|k| k.is_special()));
    let template = st.model.template.as_ref().map(|t| t.source());
    let lark = format.call_grammar(template, &specs, parallel, &special);
    OutputGrammar { grammar: Grammar::Lark(lark), param: "tools".into() }
}

/// Marker tokens of `format` that decoding would hide (control tokens), with their text: the parser must see
/// them.
pub fn shown_markers(st: &AppState, format: Option<ToolFormat>) -> Vec<(u32, String)> {
    let Some(format) = format else { return Vec::new() };
    let tok = &st.model.tokenizer;
    format
        .markers()
        .iter()
        .filter_map(|m| {
            let id = tok.id_of(m)?;
            tok.token_kind(id).is_some_and(|k| k.is_special()).then(|| (id, m.to_string()))
        })
        .collect()
}

/// A new parser for one reply; call ids are `call_` + 24 hex chars + `_` + the call's index.
pub fn parser(format: ToolFormat) -> ToolParser {
    ToolParser::new(format, &format!("{}_", crate::new_id("call_")))
}

/// A chat `message.tool_calls` list.
pub fn chat_calls(calls: &[tf_text::ToolCall]) -> Value {
    Value::Array(
        calls
            .iter()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect(),
    )
}

/// A chat stream's `delta` for one event of the reply splitter.
pub fn chat_delta(ev: &ReplyEvent) -> Value {
    match ev {
        ReplyEvent::Reasoning(s) => json!({"reasoning_content": s}),
        ReplyEvent::Content(s) => json!({"content": s}),
        ReplyEvent::CallStart { index, id, name } => json!({"tool_calls": [{
            "index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}),
        ReplyEvent::CallArgs { index, delta } => {
            json!({"tool_calls": [{"index": index, "function": {"arguments": delta}}]})
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_json(body: Value, shape: Shape) -> Result<Option<ToolRequest>, ApiError> {
        let m = body.as_object().unwrap().clone();
        read(&Fields::new(&m), shape)
    }

    #[test]
    fn chat_and_responses_tools() {
        let params = json!({"type": "object", "properties": {"city": {"type": "string"}}});
        let chat = json!({"tools": [{"type": "function", "function": {"name": "w", "description": "d", "parameters": params}}],
                          "tool_choice": {"type": "function", "function": {"name": "w"}}, "parallel_tool_calls": false});
        let r = read_json(chat, Shape::Chat).unwrap().unwrap();
        assert_eq!(r.tools, vec![Tool { name: "w".into(), parameters: Some(params.clone()) }]);
        assert_eq!((r.choice.clone(), r.parallel), (ToolChoice::Named("w".into()), false));
        assert_eq!(
            r.rendered[0],
            json!({"type": "function", "function": {"name": "w", "description": "d", "parameters": params}})
        );
        let resp =
            json!({"tools": [{"type": "function", "name": "w", "parameters": params}], "tool_choice": "required"});
        let r2 = read_json(resp, Shape::Responses).unwrap().unwrap();
        assert_eq!((r2.tools, r2.choice, r2.parallel), (r.tools, ToolChoice::Required, true));
        assert!(read_json(json!({"tool_choice": "none"}), Shape::Chat).unwrap().is_none());
        assert!(read_json(json!({"tools": [], "tool_choice": "auto"}), Shape::Chat).unwrap().is_none());
    }

    #[test]
    fn bad_tools_and_choices() {
        let t = json!([{"type": "function", "function": {"name": "w"}}]);
        for (body, param) in [
            (json!({"tools": {}}), "tools"),
            (json!({"tools": [1]}), "tools[0]"),
            (json!({"tools": [{"type": "web_search"}]}), "tools[0].type"),
            (json!({"tools": [{"type": "function"}]}), "tools[0].function"),
            (json!({"tools": [{"type": "function", "function": {"name": ""}}]}), "tools[0].function.name"),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a", "parameters": "x"}}]}),
                "tools[0].function.parameters",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a", "parameters": []}}]}),
                "tools[0].function.parameters",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "a"}}]}),
                "tools[1].function.name",
            ),
            (json!({"tools": t, "tool_choice": "sometimes"}), "tool_choice"),
            (json!({"tools": t, "tool_choice": {"type": "function", "function": {"name": "nope"}}}), "tool_choice"),
            (json!({"tools": t, "tool_choice": {"type": "function"}}), "tool_choice"),
            (json!({"tools": t, "tool_choice": 3}), "tool_choice"),
            (json!({"tool_choice": "required"}), "tool_choice"),
            (json!({"tools": t, "parallel_tool_calls": "yes"}), "parallel_tool_calls"),
        ] {
            let e = read_json(body.clone(), Shape::Chat).expect_err(&body.to_string());
            assert_eq!((e.param.as_deref(), e.status.as_u16()), (Some(param), 400), "{body}");
        }
    }

    #[test]
    fn call_arguments_become_objects_for_templates() {
        let mut m = vec![json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}},
            {"id": "d", "type": "function", "function": {"name": "g", "arguments": "not json"}},
            {"id": "e", "type": "function", "function": {"name": "h", "arguments": {"b": 2}}}]})];
        arguments_as_objects(&mut m);
        let calls = &m[0]["tool_calls"];
        assert_eq!(calls[0]["function"]["arguments"], json!({"a": 1}));
        assert_eq!(calls[1]["function"]["arguments"], json!("not json"));
        assert_eq!(calls[2]["function"]["arguments"], json!({"b": 2}));
    }

    #[test]
    fn mistral_templates_get_nine_character_call_ids() {
        let conv = || {
            vec![
                json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_0123456789abcdef01234567_0", "type": "function", "function": {"name": "f", "arguments": {}}},
                    {"id": "abcDEF123", "type": "function", "function": {"name": "g", "arguments": {}}}]}),
                json!({"role": "tool", "tool_call_id": "call_0123456789abcdef01234567_0", "content": "1"}),
                json!({"role": "tool", "tool_call_id": "abcDEF123", "content": "2"}),
                json!({"role": "tool", "tool_call_id": "call_0123456789abcdef01234567_1", "content": "3"}),
            ]
        };
        let mut m = conv();
        call_ids_for_template("{{ '[TOOL_CALLS]' }}", &mut m);
        let id = m[0]["tool_calls"][0]["id"].as_str().unwrap().to_string();
        assert!(id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()), "{id}");
        assert_eq!(m[1]["tool_call_id"], json!(id), "a result keeps pairing with its call");
        assert_eq!((&m[0]["tool_calls"][1]["id"], &m[2]["tool_call_id"]), (&json!("abcDEF123"), &json!("abcDEF123")));
        let other = m[3]["tool_call_id"].as_str().unwrap();
        assert!(other.len() == 9 && other != id, "{other}");
        // Other templates get the ids as sent.
        let mut m = conv();
        call_ids_for_template("<tool_call>", &mut m);
        assert_eq!(m, conv());
    }

    #[test]
    fn parser_settings() {
        assert_eq!(ToolParserSetting::parse("hermes"), Ok(ToolParserSetting::Format(ToolFormat::Hermes)));
        assert_eq!(ToolParserSetting::parse("none"), Ok(ToolParserSetting::Off));
        assert_eq!(ToolParserSetting::parse("auto"), Ok(ToolParserSetting::Auto));
        assert!(ToolParserSetting::parse("xml").is_err());
    }
}
