//! The grammar that forces tool calls (`tool_choice` `required` or a named function): a Lark grammar in
//! llguidance's dialect that accepts exactly the call syntax of a [`ToolFormat`] around `%json{...}` of
//! `{"name": <const>, "arguments": <that tool's parameters schema>}`, one alternative per offered tool. The JSON
//! is laid out as Python's `json.dumps` does (`", "` and `": "`), the layout chat templates render calls in.
//!
//! Mistral's named syntax (tokenizer v11 and later) writes the name outside the JSON: `[TOOL_CALLS]NAME[ARGS]`
//! then `%json` of that tool's parameters schema, one alternative per tool, repeated (each call behind its own
//! `[TOOL_CALLS]`) when `parallel`. [`tool_call_grammar`] writes each format's first syntax (Mistral's JSON
//! list); [`ToolFormat::call_grammar`] the syntax a model's chat template writes.
//!
//! Harmony (gpt-oss) names the function in the message header, so its body is `%json` of that tool's parameters
//! schema alone: `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{ARGS}`, one alternative per
//! tool, after an optional `analysis` message (`<|channel|>analysis<|message|>…<|end|><|start|>assistant`), so
//! the model may reason first. The grammar starts where the reply does (the prompt ends with
//! `<|start|>assistant`) and ends with the arguments: `<|call|>`, an end-of-sequence token of gpt-oss, follows.
//! It accepts one call whatever `parallel` says (a harmony call ends the generation).

use crate::ToolFormat;
use serde_json::{json, Map, Value as Json};

/// One offered tool: its name and the JSON schema of its arguments (`None`: any object).
#[derive(Clone, Copy, Debug)]
pub struct ToolSpec<'a> {
    pub name: &'a str,
    pub parameters: Option<&'a Json>,
}

/// The Lark grammar accepting one call of any of `tools` (one or more when `parallel`) in `format`, and
/// nothing else (Mistral: its JSON list). `token_id` gives the id of a marker that is a single special (control)
/// token of the vocabulary (written `<[id]>`, so the grammar asks for that token); other markers are matched as
/// text.
pub fn tool_call_grammar(
    format: ToolFormat,
    tools: &[ToolSpec<'_>],
    parallel: bool,
    token_id: &dyn Fn(&str) -> Option<u32>,
) -> String {
    grammar(format, false, tools, parallel, token_id)
}

impl ToolFormat {
    /// [`tool_call_grammar`] in the syntax the model's chat template (`template`, when there is one) writes:
    /// Mistral's named syntax when the template writes `[ARGS]` ([`ToolFormat::writes_named_calls`]).
    pub fn call_grammar(
        self,
        template: Option<&str>,
        tools: &[ToolSpec<'_>],
        parallel: bool,
        token_id: &dyn Fn(&str) -> Option<u32>,
    ) -> String {
        let named = template.is_some_and(|t| self.writes_named_calls(t));
        grammar(self, named, tools, parallel, token_id)
    }
}

fn grammar(
    format: ToolFormat,
    named: bool,
    tools: &[ToolSpec<'_>],
    parallel: bool,
    token_id: &dyn Fn(&str) -> Option<u32>,
) -> String {
    let marker = |text: &str| match token_id(text) {
        Some(id) => format!("<[{id}]>"),
        None => lark_string(text),
    };
    let key = format.arguments_key();
    let alternatives: Vec<Json> = tools.iter().map(|t| call_schema(t, key)).collect();
    let one = if alternatives.len() == 1 {
        alternatives.into_iter().next().unwrap_or(Json::Null)
    } else {
        json!({ "anyOf": alternatives })
    };
    let layout = json!({"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": false});
    match format {
        ToolFormat::Harmony => harmony_grammar(tools, &marker),
        ToolFormat::Mistral if named => mistral_named_grammar(tools, parallel, &marker),
        ToolFormat::Hermes => {
            let mut schema = one;
            set_layout(&mut schema, &layout);
            let repeat = if parallel { " (\"\\n\" call)*" } else { "" };
            format!(
                "start: call{repeat}\ncall: {} \"\\n\" args \"\\n\" {}\nargs: %json {}\n",
                marker("<tool_call>"),
                marker("</tool_call>"),
                schema
            )
        }
        ToolFormat::Llama3 => {
            let mut schema = one;
            set_layout(&mut schema, &layout);
            let repeat = if parallel { " (\"; \" call)*" } else { "" };
            format!("start: call{repeat}\ncall: %json {schema}\n")
        }
        ToolFormat::Mistral => {
            let mut list = json!({"type": "array", "items": one, "minItems": 1});
            if !parallel {
                list["maxItems"] = json!(1);
            }
            set_layout(&mut list, &layout);
            format!("start: {} calls\ncalls: %json {list}\n", marker("[TOOL_CALLS]"))
        }
    }
}

/// Harmony's grammar (see the module documentation).
fn harmony_grammar(tools: &[ToolSpec<'_>], marker: &dyn Fn(&str) -> String) -> String {
    use crate::harmony::{CHANNEL, CONSTRAIN, END, MESSAGE, START};
    // The thinking text runs to `<|end|>`: a special token no text regex can match, or else text, where the
    // lexeme is lazy and includes it.
    let end = marker(END);
    let (thought, rule) = if end.starts_with("<[") {
        (format!("thought {end}"), "thought: /(.|\\n)*/".to_string())
    } else {
        ("thought".to_string(), format!("thought[suffix={end}]: /(.|\\n)*/"))
    };
    let mut g = format!(
        "start: analysis? call\nanalysis: {ch} \"analysis\" {msg} {thought} {start} \"assistant\"\n{rule}\ncall: {}\n",
        (0..tools.len()).map(|i| format!("call_{i}")).collect::<Vec<_>>().join(" | "),
        ch = marker(CHANNEL),
        msg = marker(MESSAGE),
        start = marker(START),
    );
    for (i, t) in tools.iter().enumerate() {
        let mut params = t.parameters.cloned().unwrap_or_else(|| json!({"type": "object"}));
        set_layout(&mut params, &json!({"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": false}));
        g.push_str(&format!(
            "call_{i}: {} {} {} \"json\" {} %json {params}\n",
            marker(CHANNEL),
            lark_string(&format!("commentary to=functions.{} ", t.name)),
            marker(CONSTRAIN),
            marker(MESSAGE),
        ));
    }
    g
}

/// Mistral's named syntax (see the module documentation).
fn mistral_named_grammar(tools: &[ToolSpec<'_>], parallel: bool, marker: &dyn Fn(&str) -> String) -> String {
    let repeat = if parallel { " call*" } else { "" };
    let mut g = format!(
        "start: call{repeat}\ncall: {} ({})\n",
        marker("[TOOL_CALLS]"),
        (0..tools.len()).map(|i| format!("call_{i}")).collect::<Vec<_>>().join(" | "),
    );
    for (i, t) in tools.iter().enumerate() {
        let mut params = t.parameters.cloned().unwrap_or_else(|| json!({"type": "object"}));
        set_layout(&mut params, &json!({"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": false}));
        g.push_str(&format!("call_{i}: {} {} %json {params}\n", lark_string(t.name), marker("[ARGS]")));
    }
    g
}

/// `{"name": const, <key>: parameters}`, both required, nothing else.
fn call_schema(t: &ToolSpec<'_>, key: &str) -> Json {
    let params = t.parameters.cloned().unwrap_or_else(|| json!({"type": "object"}));
    let mut props = Map::new();
    props.insert("name".into(), json!({"const": t.name}));
    props.insert(key.into(), params);
    json!({"type": "object", "properties": props, "required": ["name", key], "additionalProperties": false})
}

fn set_layout(schema: &mut Json, layout: &Json) {
    if let Json::Object(m) = schema {
        m.insert("x-guidance".into(), layout.clone());
    }
}

/// A Lark string literal.
fn lark_string(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hermes_grammar_names_each_tool() {
        let p = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
        let tools =
            [ToolSpec { name: "get_weather", parameters: Some(&p) }, ToolSpec { name: "noop", parameters: None }];
        let ids = |t: &str| match t {
            "<tool_call>" => Some(151657),
            "</tool_call>" => Some(151658),
            _ => None,
        };
        let g = tool_call_grammar(ToolFormat::Hermes, &tools, false, &ids);
        let lines: Vec<&str> = g.lines().collect();
        assert_eq!(lines[0], "start: call");
        assert_eq!(lines[1], "call: <[151657]> \"\\n\" args \"\\n\" <[151658]>");
        let schema: Json = serde_json::from_str(lines[2].strip_prefix("args: %json ").unwrap()).unwrap();
        assert_eq!(schema["anyOf"][0]["properties"]["name"], json!({"const": "get_weather"}));
        assert_eq!(schema["anyOf"][0]["properties"]["arguments"], p);
        assert_eq!(schema["anyOf"][1]["properties"]["arguments"], json!({"type": "object"}));
        assert_eq!(schema["anyOf"][1]["required"], json!(["name", "arguments"]));
        assert_eq!(schema["x-guidance"]["key_separator"], ": ");
        let g = tool_call_grammar(ToolFormat::Hermes, &tools[..1], true, &|_| None);
        assert!(g.starts_with("start: call (\"\\n\" call)*\ncall: \"<tool_call>\" \"\\n\" args"), "{g}");
        let schema: Json =
            serde_json::from_str(g.lines().nth(2).unwrap().strip_prefix("args: %json ").unwrap()).unwrap();
        assert_eq!(schema["properties"]["name"]["const"], "get_weather");
    }

    #[test]
    fn llama3_and_mistral_grammars() {
        let tools = [ToolSpec { name: "f", parameters: None }];
        let g = tool_call_grammar(ToolFormat::Llama3, &tools, true, &|_| None);
        assert!(g.starts_with("start: call (\"; \" call)*\ncall: %json {"), "{g}");
        assert!(g.contains("\"parameters\":{\"type\":\"object\"}"), "{g}");
        let g = tool_call_grammar(ToolFormat::Mistral, &tools, false, &|t| (t == "[TOOL_CALLS]").then_some(5));
        assert!(g.starts_with("start: <[5]> calls\ncalls: %json {\"type\":\"array\""), "{g}");
        let list: Json =
            serde_json::from_str(g.lines().nth(1).unwrap().strip_prefix("calls: %json ").unwrap()).unwrap();
        assert_eq!((list["minItems"].clone(), list["maxItems"].clone()), (json!(1), json!(1)));
    }

    #[test]
    fn mistral_named_grammar_writes_name_then_args() {
        let p = json!({"type": "object", "properties": {"city": {"type": "string"}}});
        let tools =
            [ToolSpec { name: "get_weather", parameters: Some(&p) }, ToolSpec { name: "noop", parameters: None }];
        let ids = |t: &str| match t {
            "[TOOL_CALLS]" => Some(9),
            "[ARGS]" => Some(32),
            _ => None,
        };
        let v11 = Some("{{- '[TOOL_CALLS]' + name + '[ARGS]' + arguments }}");
        let g = ToolFormat::Mistral.call_grammar(v11, &tools, false, &ids);
        let lines: Vec<&str> = g.lines().collect();
        assert_eq!(lines[..2], ["start: call", "call: <[9]> (call_0 | call_1)"]);
        let schema: Json =
            serde_json::from_str(lines[2].strip_prefix("call_0: \"get_weather\" <[32]> %json ").unwrap()).unwrap();
        assert_eq!(schema["properties"], p["properties"]);
        assert_eq!(schema["x-guidance"]["item_separator"], ", ");
        let schema: Json =
            serde_json::from_str(lines[3].strip_prefix("call_1: \"noop\" <[32]> %json ").unwrap()).unwrap();
        assert_eq!(schema["type"], "object");
        assert_eq!(lines.len(), 4);
        // Several calls, each behind its own marker; markers that are not one token are text.
        let g = ToolFormat::Mistral.call_grammar(v11, &tools[..1], true, &|_| None);
        assert!(
            g.starts_with(
                "start: call call*\ncall: \"[TOOL_CALLS]\" (call_0)\ncall_0: \"get_weather\" \"[ARGS]\" %json {"
            ),
            "{g}"
        );
        // Other formats have one syntax.
        let same = |f: ToolFormat, t| f.call_grammar(t, &tools, true, &ids) == tool_call_grammar(f, &tools, true, &ids);
        assert!(same(ToolFormat::Hermes, v11) && same(ToolFormat::Llama3, v11) && same(ToolFormat::Harmony, v11));
        // A Mistral template without `[ARGS]`, or none, gets the JSON list.
        let v3 = Some("{{- '[TOOL_CALLS][' }}{{- tool_calls|tojson }}");
        assert!(same(ToolFormat::Mistral, v3) && same(ToolFormat::Mistral, None) && !same(ToolFormat::Mistral, v11));
    }
}
