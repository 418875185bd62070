//! Tool-call parsing through the public API: Mistral's named syntax (tokenizer v11 and later) next to its JSON
//! list, and parsers that keep only the first call (`parallel_tool_calls: false`). Every text is parsed whole
//! and streamed split at every char boundary, around every pair of neighbouring boundaries, and char by char;
//! all must agree.

use tf_text::{parse_tool_calls, ParsedTools, ToolCall, ToolEvent, ToolFormat, ToolParser};

fn call(i: usize, name: &str, args: &str) -> ToolCall {
    ToolCall { id: format!("c{i}"), name: name.into(), arguments: args.into() }
}

fn parser(format: ToolFormat, first_only: bool) -> ToolParser {
    let p = ToolParser::new(format, "c");
    if first_only {
        p.end_at_first_call()
    } else {
        p
    }
}

/// Streams `pieces`, checking the events: calls announced in order with their final ids and names, argument
/// deltas of the last call announced that add up to its final arguments, no empty pieces.
fn streamed(format: ToolFormat, first_only: bool, pieces: &[&str]) -> ParsedTools {
    let mut p = parser(format, first_only);
    let mut events = Vec::new();
    for piece in pieces {
        events.extend(p.push(piece));
    }
    let end = p.finish();
    events.extend(end.events.clone());
    let mut content = String::new();
    let mut announced: Vec<(String, String, String)> = Vec::new();
    for e in events {
        match e {
            ToolEvent::Content(s) => {
                assert!(!s.is_empty(), "empty content event");
                content.push_str(&s);
            }
            ToolEvent::CallStart { index, id, name } => {
                assert_eq!(index, announced.len(), "calls are announced in order");
                announced.push((id, name, String::new()));
            }
            ToolEvent::CallArgs { index, delta } => {
                assert!(!delta.is_empty(), "empty argument delta");
                assert_eq!(index + 1, announced.len(), "deltas belong to the last call announced");
                announced[index].2.push_str(&delta);
            }
        }
    }
    for (c, (id, name, args)) in end.calls.iter().zip(&announced) {
        assert_eq!((id, name, args), (&c.id, &c.name, &c.arguments), "streamed call differs from the final one");
    }
    let extra = announced.len() - end.calls.len();
    assert!(extra == 0 || (end.cut && extra == 1), "{} announced, {} final", announced.len(), end.calls.len());
    ParsedTools { content, calls: end.calls, cut: end.cut }
}

fn whole(format: ToolFormat, first_only: bool, text: &str) -> ParsedTools {
    if first_only {
        streamed(format, true, &[text])
    } else {
        parse_tool_calls(format, text, "c")
    }
}

fn check(format: ToolFormat, first_only: bool, text: &str) -> ParsedTools {
    let reference = whole(format, first_only, text);
    assert_eq!(streamed(format, first_only, &[text]), reference);
    let bounds: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
    for &i in &bounds {
        let got = streamed(format, first_only, &[&text[..i], &text[i..]]);
        assert_eq!(got, reference, "split at byte {i} of {text:?}");
    }
    for w in bounds.windows(3) {
        let got = streamed(format, first_only, &[&text[..w[0]], &text[w[0]..w[2]], &text[w[2]..]]);
        assert_eq!(got, reference, "split at bytes {} and {} of {text:?}", w[0], w[2]);
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(streamed(format, first_only, &refs), reference, "char by char: {text:?}");
    reference
}

fn mistral(text: &str) -> ParsedTools {
    check(ToolFormat::Mistral, false, text)
}

#[test]
fn mistral_named_one_call() {
    let p = mistral("[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"days\": [1, {\"x\": \"}]\"}]}");
    assert_eq!(p.calls, vec![call(0, "get_weather", "{\"city\": \"Paris\", \"days\": [1, {\"x\": \"}]\"}]}")]);
    assert_eq!((p.content.as_str(), p.cut), ("", false));
}

#[test]
fn mistral_named_several_calls_with_content_and_ids() {
    let text = "Let me look é.\n[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[CALL_ID]a1B2c3D4e[ARGS]{}\
                \n[TOOL_CALLS]fs.read_file[ARGS] {\"path\": \"/tmp/[ARGS]\"}";
    let p = mistral(text);
    assert_eq!(
        p.calls,
        vec![
            call(0, "get_weather", "{\"city\": \"Paris\"}"),
            call(1, "get_time", "{}"),
            call(2, "fs.read_file", "{\"path\": \"/tmp/[ARGS]\"}"),
        ]
    );
    assert_eq!((p.content.as_str(), p.cut), ("Let me look é.", false));
    // Text after the calls is content; a name straight before its object (no `[ARGS]` shown) is a call too.
    let p = mistral("[TOOL_CALLS]a{\"k\": 1}\n\nDone.");
    assert_eq!((p.calls.clone(), p.content.as_str()), (vec![call(0, "a", "{\"k\": 1}")], "Done."));
}

#[test]
fn mistral_both_syntaxes() {
    let list = "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {}}]";
    let named = "[TOOL_CALLS]a[ARGS]{\"x\": 1}[TOOL_CALLS]b[ARGS]{}";
    let want = vec![call(0, "a", "{\"x\": 1}"), call(1, "b", "{}")];
    assert_eq!(mistral(list).calls, want);
    assert_eq!(mistral(named).calls, want);
    // The older syntax with a space before the list (SentencePiece templates) and a bare object.
    assert_eq!(mistral(" [TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"x\": 1}}]").calls, want[..1]);
    assert_eq!(mistral("[TOOL_CALLS]{\"name\": \"a\", \"arguments\": {\"x\": 1}}").calls, want[..1]);
}

#[test]
fn mistral_named_malformed_is_content() {
    for text in [
        "[TOOL_CALLS]get weather[ARGS]{}",
        "[TOOL_CALLS]f[ARGS]city=Paris",
        "[TOOL_CALLS]f[ARG]{}",
        "[TOOL_CALLS]f[CALL_ID]x y[ARGS]{}",
        "[TOOL_CALLS][ARGS]{}",
        "[TOOL_CALLS]\"f\"[ARGS]{}",
        "a [TOOL_CALLS] is a token",
        "[TOOL_CALLS]f[ARGS][1, 2]",
    ] {
        let p = mistral(text);
        assert_eq!((p.content.as_str(), p.calls.len(), p.cut), (text, 0, false), "{text:?}");
    }
    // A broken call does not stop the next one.
    let p = mistral("[TOOL_CALLS]f[ARGS]oops [TOOL_CALLS]g[ARGS]{\"a\": true}");
    assert_eq!((p.content.as_str(), p.calls.clone()), ("[TOOL_CALLS]f[ARGS]oops", vec![call(0, "g", "{\"a\": true}")]));
}

#[test]
fn mistral_named_cut() {
    // Cut in the arguments: announced, left out of the calls, its text dropped.
    let p = mistral("Sure.[TOOL_CALLS]a[ARGS]{}[TOOL_CALLS]b[ARGS]{\"x\": [1,");
    assert_eq!((p.content.as_str(), p.calls.clone(), p.cut), ("Sure.", vec![call(0, "a", "{}")], true));
    // Cut before the arguments start: nothing announced.
    for text in ["[TOOL_CALLS]get_wea", "[TOOL_CALLS]f[AR", "[TOOL_CALLS]f[CALL_ID]abc", "[TOOL_CALLS]f[ARGS]"] {
        let p = mistral(text);
        assert_eq!((p.content.as_str(), p.calls.len(), p.cut), ("", 0, true), "{text:?}");
    }
}

#[test]
fn mistral_arguments_stream_as_generated() {
    let mut p = ToolParser::new(ToolFormat::Mistral, "c");
    assert_eq!(p.push("Hi [TOOL_CALLS]get_"), vec![ToolEvent::Content("Hi".into())]);
    assert_eq!(p.push("weather[AR"), vec![]);
    assert_eq!(
        p.push("GS]{\"ci"),
        vec![
            ToolEvent::CallStart { index: 0, id: "c0".into(), name: "get_weather".into() },
            ToolEvent::CallArgs { index: 0, delta: "{\"ci".into() }
        ]
    );
    assert_eq!(p.push("ty\": 1}"), vec![ToolEvent::CallArgs { index: 0, delta: "ty\": 1}".into() }]);
    let end = p.finish();
    assert_eq!((end.calls, end.cut), (vec![call(0, "get_weather", "{\"city\": 1}")], false));
}

#[test]
fn mistral_markers_include_the_named_syntax() {
    assert_eq!(ToolFormat::Mistral.markers(), ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"]);
    let v11 = "{{- '[TOOL_CALLS]' + tool['function']['name'] + '[ARGS]' + arguments }}";
    let v3 = "{{- '[TOOL_CALLS][' }}{{- '{\"name\": \"' + name + '\", \"arguments\": ' + arguments + '}' }}";
    assert!(ToolFormat::Mistral.writes_named_calls(v11));
    assert!(!ToolFormat::Mistral.writes_named_calls(v3));
    assert!(!ToolFormat::Hermes.writes_named_calls(v11));
}

/// `(format, text, content, calls)` where the first call ends the reply.
fn first_call_cases() -> Vec<(ToolFormat, &'static str, &'static str, Vec<ToolCall>)> {
    let harmony_two = "<|channel|>analysis<|message|>Two calls.<|end|><|start|>assistant<|channel|>commentary \
                       to=functions.a <|constrain|>json<|message|>{\"x\": 1}<|call|><|start|>assistant<|channel|>\
                       commentary to=functions.b <|constrain|>json<|message|>{}<|call|>";
    vec![
        (
            ToolFormat::Hermes,
            "Both.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \
             \"arguments\": {}}\n</tool_call>",
            "Both.",
            vec![call(0, "a", "{\"x\": 1}")],
        ),
        (
            ToolFormat::Hermes,
            "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\nAnd some words after.",
            "",
            vec![call(0, "a", "{}")],
        ),
        (
            ToolFormat::Mistral,
            "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {}}]",
            "",
            vec![call(0, "a", "{\"x\": 1}")],
        ),
        (ToolFormat::Mistral, "[TOOL_CALLS]a[ARGS]{\"x\": 1}[TOOL_CALLS]b[ARGS]{}", "", vec![call(0, "a", "{\"x\": 1}")]),
        (
            ToolFormat::Llama3,
            "{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {}}",
            "",
            vec![call(0, "a", "{\"x\": 1}")],
        ),
        (ToolFormat::Harmony, harmony_two, "<|channel|>analysis<|message|>Two calls.<|end|>", vec![call(0, "a", "{\"x\": 1}")]),
    ]
}

#[test]
fn first_call_ends_the_reply() {
    for (format, text, content, calls) in first_call_cases() {
        let p = check(format, true, text);
        assert_eq!((p.content.as_str(), &p.calls, p.cut), (content, &calls, false), "{format:?} {text:?}");
        // Without the limit the same text has more than one call.
        assert!(parse_tool_calls(format, text, "c").calls.len() > 1 || text.contains("after"), "{text:?}");
    }
}

#[test]
fn first_call_parser_reports_the_end() {
    let mut p = parser(ToolFormat::Hermes, true);
    p.push("<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1");
    assert!(!p.ended());
    p.push("}");
    assert!(!p.ended(), "the call object is still open");
    let events = p.push("}\n</tool_call>\n<tool_call>\n{\"name\": \"b\"");
    assert!(p.ended());
    assert!(!events.iter().any(|e| matches!(e, ToolEvent::CallStart { index: 1, .. })), "{events:?}");
    assert_eq!(p.push("more text"), vec![]);
    let end = p.finish();
    assert_eq!((end.calls, end.cut, end.events), (vec![call(0, "a", "{\"x\": 1}")], false, vec![]));
    // A reply without calls, or cut in its first call, is as without the limit.
    for text in ["Just words.", "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\""] {
        let p = check(ToolFormat::Hermes, true, text);
        assert_eq!(p, parse_tool_calls(ToolFormat::Hermes, text, "c"), "{text:?}");
    }
    let mut h = parser(ToolFormat::Harmony, true);
    h.push("<|channel|>commentary to=functions.a <|constrain|>json<|message|>{\"x\": ");
    assert!(!h.ended());
    h.push("1}");
    assert!(h.ended());
}

const MISTRAL_SMALL_32: &str = include_str!("../../../fixtures/chat/templates/mistral-small-3.2.jinja");

/// Mistral Small 3.2's template (tokenizer v11): an earlier call renders as `[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]`
/// then its arguments, which the parser reads back; the template is detected as Mistral's and forces the named
/// syntax.
#[test]
fn mistral_small_32_template_renders_named_calls() {
    use tf_text::{ChatRenderOptions, ChatTemplate, ToolSpec};
    let t = ChatTemplate::new(MISTRAL_SMALL_32).expect("template");
    let messages = serde_json::json!([
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "abcDEF123", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
        ]},
        {"role": "tool", "tool_call_id": "abcDEF123", "content": "22C"},
    ]);
    let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
    let opts = ChatRenderOptions {
        tools: Some(tools),
        bos_token: Some("<s>".into()),
        eos_token: Some("</s>".into()),
        add_generation_prompt: true,
        ..Default::default()
    };
    let rendered = t.render(&messages, &opts).expect("render");
    assert_eq!(
        rendered,
        "<s>[SYSTEM_PROMPT]S[/SYSTEM_PROMPT][AVAILABLE_TOOLS][{\"type\": \"function\", \"function\": {\"name\": \
         \"get_weather\", \"parameters\": {\"type\": \"object\"}}}][/AVAILABLE_TOOLS][INST]Weather in Paris?[/INST]\
         [TOOL_CALLS]get_weather[CALL_ID]abcDEF123[ARGS]{\"city\": \"Paris\"}</s>\
         [TOOL_RESULTS]abcDEF123[TOOL_CONTENT]22C[/TOOL_RESULTS]"
    );
    let turn = &rendered[rendered.find("[/INST]").unwrap() + "[/INST]".len()..rendered.find("</s>").unwrap()];
    let p = mistral(turn);
    assert_eq!(
        (p.content.as_str(), p.calls, p.cut),
        ("", vec![call(0, "get_weather", "{\"city\": \"Paris\"}")], false)
    );
    // Ids must be 9 alphanumerics in this template.
    let mut bad = messages.clone();
    bad[2]["tool_calls"][0]["id"] = "call_1".into();
    bad[3]["tool_call_id"] = "call_1".into();
    assert!(t.render(&bad, &opts).is_err());

    let vocab = |s: &str| ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"].contains(&s);
    assert_eq!(ToolFormat::detect(MISTRAL_SMALL_32, &vocab), Some(ToolFormat::Mistral));
    assert!(ToolFormat::Mistral.writes_named_calls(MISTRAL_SMALL_32));
    let tools = [ToolSpec { name: "get_weather", parameters: None }];
    let g = ToolFormat::Mistral.call_grammar(Some(MISTRAL_SMALL_32), &tools, false, &|_| None);
    assert!(g.contains("call_0: \"get_weather\" \"[ARGS]\" %json"), "{g}");
}
