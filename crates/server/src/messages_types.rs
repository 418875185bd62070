//! Reading an Anthropic Messages request into what the chat machinery takes: `system` and `messages` as the
//! OpenAI-style messages chat templates expect, `tools` / `tool_choice` as a [`ToolRequest`], and `thinking` as
//! a [`ThinkingRequest`].
//!
//! Mapping: `system` (a string or text blocks) is a `system` message; a user turn's `text` blocks are one `user`
//! message and each `tool_result` block is a `tool` message with `tool_call_id` (in block order); an assistant
//! turn's `text` blocks are its `content`, its `tool_use` blocks are `tool_calls` (`function.arguments` as the
//! `input` object) and its `thinking` blocks are `reasoning_content`. Text blocks of one turn are joined with a
//! blank line. A last assistant turn of text only is a prefill: the reply continues it.

use crate::error::ApiError;
use crate::params::{kind, Fields};
use crate::reply::ThinkingRequest;
use crate::tools::{Tool, ToolChoice, ToolRequest};
use serde_json::{json, Map, Value};

/// The conversation of a request.
#[derive(Clone, Debug, PartialEq)]
pub struct Conversation {
    /// OpenAI-style messages (`system`, `user`, `assistant` with `tool_calls`, `tool`).
    pub messages: Vec<Value>,
    /// The text of a last assistant turn that the reply continues (rendered after the generation prompt).
    pub prefill: Option<String>,
}

fn err_type(at: &str, v: &Value, what: &str) -> ApiError {
    ApiError::field(at, format!("expected {what}, got {}", kind(v)))
}

fn str_field<'a>(o: &'a Map<String, Value>, at: &str, key: &str) -> Result<&'a str, ApiError> {
    match o.get(key) {
        Some(Value::String(s)) => Ok(s),
        Some(v) => Err(err_type(&format!("{at}.{key}"), v, "a string")),
        None => Err(ApiError::field(&format!("{at}.{key}"), "is required")),
    }
}

/// The blocks of a `content` field: a string is one text block.
fn blocks(v: &Value, at: &str) -> Result<Vec<Map<String, Value>>, ApiError> {
    match v {
        Value::String(s) => Ok(vec![json!({"type": "text", "text": s}).as_object().cloned().unwrap_or_default()]),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, b)| match b {
                Value::Object(o) => Ok(o.clone()),
                v => Err(err_type(&format!("{at}[{i}]"), v, "a content block")),
            })
            .collect(),
        v => Err(err_type(at, v, "a string or an array of content blocks")),
    }
}

fn block_type<'a>(b: &'a Map<String, Value>, at: &str) -> Result<&'a str, ApiError> {
    str_field(b, at, "type")
}

/// Text blocks only (`system`, `tool_result` content), joined with a blank line.
fn text_only(v: &Value, at: &str) -> Result<String, ApiError> {
    let mut parts = Vec::new();
    for (i, b) in blocks(v, at)?.iter().enumerate() {
        let bat = format!("{at}[{i}]");
        match block_type(b, &bat)? {
            "text" => parts.push(str_field(b, &bat, "text")?.to_string()),
            t => return Err(unsupported(&bat, t)),
        }
    }
    Ok(parts.join("\n\n"))
}

fn unsupported(at: &str, t: &str) -> ApiError {
    ApiError::field(at, format!("content blocks of type `{t}` are not supported here"))
}

/// `system` and `messages`.
pub fn read_conversation(f: &Fields<'_>) -> Result<Conversation, ApiError> {
    let mut out = Vec::new();
    if let Some(s) = f.get("system") {
        out.push(json!({"role": "system", "content": text_only(s, "system")?}));
    }
    let items = match f.get("messages") {
        None => return Err(ApiError::field("messages", "is required")),
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(ApiError::field("messages", "must hold at least one message"))
        }
        Some(Value::Array(a)) => a,
        Some(v) => return Err(err_type("messages", v, "an array of messages")),
    };
    let mut prefill = None;
    for (i, m) in items.iter().enumerate() {
        let at = format!("messages[{i}]");
        let Value::Object(m) = m else { return Err(err_type(&at, m, "an object")) };
        let content = m.get("content").ok_or_else(|| ApiError::field(&format!("{at}.content"), "is required"))?;
        let cat = format!("{at}.content");
        match str_field(m, &at, "role")? {
            "user" => user_turn(content, &cat, &mut out)?,
            "assistant" => {
                let (msg, text_only) = assistant_turn(content, &cat)?;
                if i + 1 == items.len() && text_only {
                    prefill = msg.get("content").and_then(Value::as_str).map(str::to_string);
                } else {
                    out.push(msg);
                }
            }
            r => {
                return Err(ApiError::field(
                    &format!("{at}.role"),
                    format!("unknown role `{r}` (expected user or assistant; the system prompt is `system`)"),
                ))
            }
        }
    }
    Ok(Conversation { messages: out, prefill })
}

fn user_turn(content: &Value, at: &str, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let mut text: Vec<String> = Vec::new();
    let flush = |text: &mut Vec<String>, out: &mut Vec<Value>| {
        if !text.is_empty() {
            out.push(json!({"role": "user", "content": text.join("\n\n")}));
            text.clear();
        }
    };
    let bs = blocks(content, at)?;
    if bs.is_empty() {
        out.push(json!({"role": "user", "content": ""}));
    }
    for (i, b) in bs.iter().enumerate() {
        let bat = format!("{at}[{i}]");
        match block_type(b, &bat)? {
            "text" => text.push(str_field(b, &bat, "text")?.to_string()),
            "tool_result" => {
                flush(&mut text, out);
                let id = str_field(b, &bat, "tool_use_id")?;
                let body = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(c) => text_only(c, &format!("{bat}.content"))?,
                };
                let mut msg = json!({"role": "tool", "tool_call_id": id, "content": body});
                match b.get("is_error") {
                    None | Some(Value::Null) | Some(Value::Bool(false)) => {}
                    Some(Value::Bool(true)) => msg["is_error"] = Value::Bool(true),
                    Some(v) => return Err(err_type(&format!("{bat}.is_error"), v, "a boolean")),
                }
                out.push(msg);
            }
            t => return Err(unsupported(&bat, t)),
        }
    }
    flush(&mut text, out);
    Ok(())
}

/// An assistant turn as one message, and whether it is text only (no `tool_use`, no `thinking`).
fn assistant_turn(content: &Value, at: &str) -> Result<(Value, bool), ApiError> {
    let (mut text, mut reasoning, mut calls) = (Vec::<String>::new(), Vec::<String>::new(), Vec::new());
    for (i, b) in blocks(content, at)?.iter().enumerate() {
        let bat = format!("{at}[{i}]");
        match block_type(b, &bat)? {
            "text" => text.push(str_field(b, &bat, "text")?.to_string()),
            "thinking" => reasoning.push(str_field(b, &bat, "thinking")?.to_string()),
            "redacted_thinking" => {}
            "tool_use" => {
                let id = str_field(b, &bat, "id")?;
                let name = str_field(b, &bat, "name")?;
                let input = match b.get("input") {
                    Some(v @ Value::Object(_)) => v.clone(),
                    Some(v) => return Err(err_type(&format!("{bat}.input"), v, "an object")),
                    None => return Err(ApiError::field(&format!("{bat}.input"), "is required")),
                };
                calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input}}));
            }
            t => return Err(unsupported(&bat, t)),
        }
    }
    let plain = calls.is_empty() && reasoning.is_empty();
    let mut msg = json!({"role": "assistant", "content": text.join("\n\n")});
    if !calls.is_empty() {
        if text.is_empty() {
            msg["content"] = Value::Null;
        }
        msg["tool_calls"] = Value::Array(calls);
    }
    if !reasoning.is_empty() {
        msg["reasoning_content"] = Value::String(reasoning.join("\n\n"));
    }
    Ok((msg, plain))
}

/// `tools` (`{"name", "description", "input_schema"}`; `type` absent or `"custom"`) and `tool_choice`
/// (`auto`, `any`, `tool` with `name`, `none`; `disable_parallel_tool_use`). `None` without tools.
pub fn read_tools(f: &Fields<'_>) -> Result<Option<ToolRequest>, ApiError> {
    let list = match f.get("tools") {
        None => &Vec::new(),
        Some(Value::Array(a)) => a,
        Some(v) => return Err(err_type("tools", v, "an array")),
    };
    let (mut tools, mut rendered) = (Vec::<Tool>::new(), Vec::new());
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        let Value::Object(o) = t else { return Err(err_type(&at, t, "an object")) };
        match o.get("type") {
            None | Some(Value::Null) => {}
            Some(Value::String(ty)) if ty == "custom" => {}
            Some(Value::String(ty)) => {
                return Err(ApiError::field(
                    &format!("{at}.type"),
                    format!("tools of type `{ty}` are not supported (only client tools with an input_schema)"),
                ))
            }
            Some(v) => return Err(err_type(&format!("{at}.type"), v, "a string")),
        }
        let name = str_field(o, &at, "name")?;
        if name.is_empty() {
            return Err(ApiError::field(&format!("{at}.name"), "must not be empty"));
        }
        if tools.iter().any(|t| t.name == name) {
            return Err(ApiError::field(&format!("{at}.name"), format!("the tool `{name}` is given twice")));
        }
        let schema = match o.get("input_schema") {
            Some(s @ Value::Object(_)) => s.clone(),
            Some(v) => return Err(err_type(&format!("{at}.input_schema"), v, "a JSON schema object")),
            None => return Err(ApiError::field(&format!("{at}.input_schema"), "is required")),
        };
        let mut func = json!({"name": name, "parameters": schema});
        match o.get("description") {
            None | Some(Value::Null) => {}
            Some(d @ Value::String(_)) => func["description"] = d.clone(),
            Some(v) => return Err(err_type(&format!("{at}.description"), v, "a string")),
        }
        rendered.push(json!({"type": "function", "function": func}));
        tools.push(Tool { name: name.to_string(), parameters: Some(schema) });
    }
    let (choice, parallel) = match f.get("tool_choice") {
        None => (ToolChoice::Auto, true),
        Some(Value::Object(o)) => {
            let parallel = match o.get("disable_parallel_tool_use") {
                None | Some(Value::Null) => true,
                Some(Value::Bool(b)) => !b,
                Some(v) => return Err(err_type("tool_choice.disable_parallel_tool_use", v, "a boolean")),
            };
            let choice = match str_field(o, "tool_choice", "type")? {
                "auto" => ToolChoice::Auto,
                "any" => ToolChoice::Required,
                "none" => ToolChoice::None,
                "tool" => ToolChoice::Named(str_field(o, "tool_choice", "name")?.to_string()),
                t => {
                    return Err(ApiError::field(
                        "tool_choice.type",
                        format!("expected \"auto\", \"any\", \"tool\" or \"none\", got \"{t}\""),
                    ))
                }
            };
            (choice, parallel)
        }
        Some(v) => return Err(err_type("tool_choice", v, "an object")),
    };
    match &choice {
        ToolChoice::Required if tools.is_empty() => {
            return Err(ApiError::field("tool_choice", "{\"type\": \"any\"} needs `tools`"))
        }
        ToolChoice::Named(n) if !tools.iter().any(|t| &t.name == n) => {
            return Err(ApiError::field("tool_choice.name", format!("the tool `{n}` is not among `tools`")))
        }
        _ => {}
    }
    if tools.is_empty() {
        return Ok(None);
    }
    Ok(Some(ToolRequest { tools, rendered: Value::Array(rendered), choice, parallel }))
}

/// `thinking`: `{"type": "enabled", "budget_tokens": N}` renders with `enable_thinking=true` and limits the
/// thinking block to N tokens; `{"type": "adaptive"}` enables it without a budget; `{"type": "disabled"}`
/// renders with `enable_thinking=false`; absent leaves the template's default.
pub fn read_thinking(f: &Fields<'_>) -> Result<ThinkingRequest, ApiError> {
    let mut t = ThinkingRequest::default();
    let Some(v) = f.get("thinking") else { return Ok(t) };
    let Value::Object(o) = v else { return Err(err_type("thinking", v, "an object")) };
    match str_field(o, "thinking", "type")? {
        "disabled" => t.enable = Some(false),
        "adaptive" => t.enable = Some(true),
        "enabled" => {
            let n = Fields::new(o).int_in("budget_tokens", 0, u32::MAX as i64).map_err(|e| ApiError {
                message: format!("thinking.{}", e.message),
                param: Some("thinking.budget_tokens".into()),
                ..e
            })?;
            let n = n.ok_or_else(|| ApiError::field("thinking.budget_tokens", "is required for type \"enabled\""))?;
            t.enable = Some(true);
            t.budget = Some(n as usize);
            t.budget_param = Some("thinking.budget_tokens".into());
            t.budget_explicit = true;
        }
        other => {
            return Err(ApiError::field(
                "thinking.type",
                format!("expected \"enabled\", \"disabled\" or \"adaptive\", got \"{other}\""),
            ))
        }
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(v: &Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn conversation_maps_to_chat_messages() {
        let body = json!({
            "system": [{"type": "text", "text": "be brief"}, {"type": "text", "text": "use tools"}],
            "messages": [
                {"role": "user", "content": "weather in Oslo?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "need a tool", "signature": ""},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"city": "Oslo"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "3 C"}]},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": true},
                    {"type": "text", "text": "and tomorrow?"}]},
                {"role": "assistant", "content": "Tomorrow"}]});
        let m = fields(&body);
        let c = read_conversation(&Fields::new(&m)).unwrap();
        assert_eq!(c.prefill.as_deref(), Some("Tomorrow"));
        assert_eq!(
            c.messages,
            vec![
                json!({"role": "system", "content": "be brief\n\nuse tools"}),
                json!({"role": "user", "content": "weather in Oslo?"}),
                json!({"role": "assistant", "content": "Checking.", "reasoning_content": "need a tool",
                       "tool_calls": [{"id": "toolu_1", "type": "function",
                                       "function": {"name": "w", "arguments": {"city": "Oslo"}}}]}),
                json!({"role": "tool", "tool_call_id": "toolu_1", "content": "3 C"}),
                json!({"role": "tool", "tool_call_id": "toolu_2", "content": "boom", "is_error": true}),
                json!({"role": "user", "content": "and tomorrow?"}),
            ]
        );
    }

    #[test]
    fn bad_conversations_name_the_field() {
        for (body, param) in [
            (json!({}), "messages"),
            (json!({"messages": []}), "messages"),
            (json!({"messages": [{"role": "system", "content": "x"}]}), "messages[0].role"),
            (json!({"messages": [{"role": "user"}]}), "messages[0].content"),
            (json!({"messages": [{"role": "user", "content": [{"type": "image"}]}]}), "messages[0].content[0]"),
            (json!({"messages": [{"role": "user", "content": 5}]}), "messages[0].content"),
            (
                json!({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": "x"}]}]}),
                "messages[0].content[0].input",
            ),
            (json!({"system": 1, "messages": [{"role": "user", "content": "x"}]}), "system"),
        ] {
            let m = fields(&body);
            let e = read_conversation(&Fields::new(&m)).expect_err(&body.to_string());
            assert_eq!((e.param.as_deref(), e.status.as_u16()), (Some(param), 400), "{body}");
        }
    }

    #[test]
    fn tools_choices_and_thinking() {
        let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}});
        let body = json!({"tools": [{"name": "w", "description": "d", "input_schema": schema}],
                          "tool_choice": {"type": "tool", "name": "w", "disable_parallel_tool_use": true},
                          "thinking": {"type": "enabled", "budget_tokens": 4}});
        let m = fields(&body);
        let f = Fields::new(&m);
        let t = read_tools(&f).unwrap().unwrap();
        assert_eq!((t.choice, t.parallel), (ToolChoice::Named("w".into()), false));
        assert_eq!(
            t.rendered[0],
            json!({"type": "function", "function": {"name": "w", "description": "d", "parameters": schema}})
        );
        let th = read_thinking(&f).unwrap();
        assert_eq!((th.enable, th.budget, th.budget_explicit), (Some(true), Some(4), true));
        let any = fields(&json!({"tools": [{"name": "w", "input_schema": schema}], "tool_choice": {"type": "any"}}));
        assert_eq!(read_tools(&Fields::new(&any)).unwrap().unwrap().choice, ToolChoice::Required);
        let off = fields(&json!({"thinking": {"type": "disabled"}}));
        assert_eq!(read_thinking(&Fields::new(&off)).unwrap().enable, Some(false));
        for (body, param) in [
            (json!({"tools": [{"name": "w"}]}), "tools[0].input_schema"),
            (json!({"tools": [{"type": "web_search_20250305", "name": "w"}]}), "tools[0].type"),
            (
                json!({"tools": [{"name": "w", "input_schema": schema}], "tool_choice": {"type": "tool", "name": "x"}}),
                "tool_choice.name",
            ),
            (json!({"tool_choice": {"type": "any"}}), "tool_choice"),
            (json!({"tools": [{"name": "w", "input_schema": schema}], "tool_choice": "auto"}), "tool_choice"),
            (json!({"thinking": {"type": "enabled"}}), "thinking.budget_tokens"),
            (json!({"thinking": {"type": "enabled", "budget_tokens": -1}}), "thinking.budget_tokens"),
            (json!({"thinking": {"type": "on"}}), "thinking.type"),
        ] {
            let m = fields(&body);
            let f = Fields::new(&m);
            let e = read_tools(&f).and_then(|_| read_thinking(&f)).expect_err(&body.to_string());
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
        }
    }
}
