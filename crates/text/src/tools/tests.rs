use super::*;

fn call(i: usize, name: &str, args: &str) -> ToolCall {
    ToolCall { id: format!("call_{i}"), name: name.into(), arguments: args.into() }
}

fn whole(format: ToolFormat, text: &str) -> ParsedTools {
    parse_tool_calls(format, text, "call_")
}

/// Feeds `pieces` and checks the stream's own consistency: calls announced in order with the final ids and
/// names, argument deltas that concatenate to the final arguments; returns the parse.
fn streamed(format: ToolFormat, pieces: &[&str]) -> ParsedTools {
    let mut p = ToolParser::new(format, "call_");
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
                content.push_str(&s)
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
    for (i, c) in end.calls.iter().enumerate() {
        let (id, name, args) = &announced[i];
        assert_eq!((id, name, args), (&c.id, &c.name, &c.arguments), "streamed call {i} differs from the final one");
    }
    assert!(announced.len() == end.calls.len() || (end.cut && announced.len() == end.calls.len() + 1));
    ParsedTools { content, calls: end.calls, cut: end.cut }
}

/// The whole-text parse equals the stream of every split into two pieces (at each char boundary), three
/// pieces around every position, and one char at a time.
fn check_splits(format: ToolFormat, text: &str) -> ParsedTools {
    let reference = whole(format, text);
    assert_eq!(streamed(format, &[text]), reference);
    let bounds: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
    for &i in &bounds {
        let got = streamed(format, &[&text[..i], &text[i..]]);
        assert_eq!(got, reference, "split at byte {i} of {text:?}");
    }
    for w in bounds.windows(3) {
        let got = streamed(format, &[&text[..w[0]], &text[w[0]..w[2]], &text[w[2]..]]);
        assert_eq!(got, reference, "split at bytes {} and {} of {text:?}", w[0], w[2]);
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(streamed(format, &refs), reference, "one char at a time: {text:?}");
    reference
}

#[test]
fn hermes_one_call() {
    let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2]}}\n</tool_call>";
    let p = check_splits(ToolFormat::Hermes, text);
    assert_eq!(p.content, "");
    assert_eq!(p.calls, vec![call(0, "get_weather", "{\"city\": \"Paris\", \"days\": [1, 2]}")]);
    assert!(!p.cut);
}

#[test]
fn hermes_several_calls_and_content_around() {
    let text = "Let me check both.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": \"}{\\\"<tool_call>\"}}\n</tool_call>\n\
                <tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>\nDone é.";
    let p = check_splits(ToolFormat::Hermes, text);
    assert_eq!(p.content, "Let me check both.Done é.");
    assert_eq!(p.calls, vec![call(0, "a", "{\"x\": \"}{\\\"<tool_call>\"}"), call(1, "b", "{}")]);
}

#[test]
fn hermes_plain_replies_are_unchanged() {
    for text in [
        "",
        "Hello there.\n\n",
        "  indented\n\ttext  ",
        "a < b and <tool_ is not a call, nor is <tool_call",
        "{\"name\": \"x\", \"arguments\": {}}",
        "日本語のテキスト <tool",
    ] {
        let p = check_splits(ToolFormat::Hermes, text);
        assert_eq!((p.content.as_str(), p.calls.len(), p.cut), (text, 0, false), "{text:?}");
    }
}

#[test]
fn hermes_broken_call_before_its_name_is_content() {
    let text = "x <tool_call>\nnot json</tool_call> y";
    let p = check_splits(ToolFormat::Hermes, text);
    assert_eq!(p.content, "x <tool_call>\nnot json</tool_call> y");
    assert!(p.calls.is_empty() && !p.cut);
    let text = "<tool_call>\n{\"arguments\": {}, \"name\": 5}</tool_call>";
    let p = check_splits(ToolFormat::Hermes, text);
    assert_eq!(p.content, text);
}

#[test]
fn hermes_arguments_before_name_as_string_and_missing() {
    let text = "<tool_call>{\"arguments\": {\"q\": 1}, \"name\": \"f\"}</tool_call>\
                <tool_call>{\"name\": \"g\", \"arguments\": \"{\\\"k\\\": \\\"v\\\"}\"}</tool_call>\
                <tool_call>{\"name\": \"h\"}</tool_call>";
    let p = check_splits(ToolFormat::Hermes, text);
    assert_eq!(p.content, "");
    assert_eq!(p.calls, vec![call(0, "f", "{\"q\": 1}"), call(1, "g", "{\"k\": \"v\"}"), call(2, "h", "{}")]);
}

#[test]
fn hermes_without_end_marker_and_cut_end_marker() {
    let p = check_splits(ToolFormat::Hermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n");
    assert_eq!((p.calls.len(), p.cut, p.content.as_str()), (1, false, ""));
    let p = check_splits(ToolFormat::Hermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_");
    assert_eq!((p.calls.len(), p.cut, p.content.as_str()), (1, false, ""));
    let p = check_splits(ToolFormat::Hermes, "<tool_call>{\"name\": \"f\", \"arguments\": {}} and more");
    assert_eq!((p.calls.len(), p.content.as_str()), (1, "and more"));
}

#[test]
fn hermes_cut_inside_a_call_drops_it() {
    // Cut after the name: announced in a stream, left out of the final calls.
    let text = "Sure.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1,";
    let p = check_splits(ToolFormat::Hermes, text);
    assert_eq!(p.content, "Sure.");
    assert_eq!(p.calls, vec![call(0, "a", "{}")]);
    assert!(p.cut);
    // Cut before the name: nothing was announced; the partial text is dropped.
    let p = check_splits(ToolFormat::Hermes, "Sure.\n<tool_call>\n{\"na");
    assert_eq!((p.content.as_str(), p.calls.len(), p.cut), ("Sure.", 0, true));
    let p = check_splits(ToolFormat::Hermes, "<tool_call>");
    assert_eq!((p.content.as_str(), p.calls.len(), p.cut), ("", 0, true));
}

#[test]
fn streamed_arguments_arrive_as_generated() {
    let mut p = ToolParser::new(ToolFormat::Hermes, "id");
    assert_eq!(p.push("Hi <tool"), vec![ToolEvent::Content("Hi".into())]);
    assert_eq!(
        p.push("_call>\n{\"name\": \"f\""),
        vec![ToolEvent::CallStart { index: 0, id: "id0".into(), name: "f".into() }]
    );
    assert_eq!(p.push(", \"arguments\": {\"a\""), vec![ToolEvent::CallArgs { index: 0, delta: "{\"a\"".into() }]);
    assert_eq!(p.push(": 1}"), vec![ToolEvent::CallArgs { index: 0, delta: ": 1}".into() }]);
    assert_eq!(p.push("}\n</tool_call>"), vec![]);
    let end = p.finish();
    assert_eq!(end.calls, vec![ToolCall { id: "id0".into(), name: "f".into(), arguments: "{\"a\": 1}".into() }]);
}

#[test]
fn llama3_calls() {
    let text = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}";
    let p = check_splits(ToolFormat::Llama3, text);
    assert_eq!((p.content.as_str(), p.calls.clone()), ("", vec![call(0, "get_weather", "{\"city\": \"Oslo\"}")]));
    let text = "<|python_tag|>{\"type\": \"function\", \"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"n\": -1.5e3}}";
    let p = check_splits(ToolFormat::Llama3, text);
    assert_eq!(p.calls, vec![call(0, "a", "{}"), call(1, "b", "{\"n\": -1.5e3}")]);
    assert_eq!(p.content, "");
    // JSON that is not a call, and text, are content.
    for text in ["{\"answer\": 42}", "The answer is {\"name\": \"x\"}", "  plain  ", "<|python_ta"] {
        let p = check_splits(ToolFormat::Llama3, text);
        assert_eq!((p.content.as_str(), p.calls.len()), (text, 0), "{text:?}");
    }
    let p = check_splits(ToolFormat::Llama3, "{\"name\": \"a\", \"parameters\": {}}\nThat is all.");
    assert_eq!((p.content.as_str(), p.calls.len()), ("That is all.", 1));
}

#[test]
fn mistral_calls() {
    let text = "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"k\": [1, {\"z\": null}]}}, {\"name\": \"b\", \"arguments\": {}}]";
    let p = check_splits(ToolFormat::Mistral, text);
    assert_eq!(p.calls, vec![call(0, "a", "{\"k\": [1, {\"z\": null}]}"), call(1, "b", "{}")]);
    assert_eq!(p.content, "");
    let p = check_splits(ToolFormat::Mistral, "Checking. [TOOL_CALLS] {\"name\": \"a\", \"arguments\": {}}");
    assert_eq!((p.content.as_str(), p.calls.len()), ("Checking.", 1));
    let p = check_splits(ToolFormat::Mistral, "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}, {\"name\"");
    assert_eq!((p.calls.len(), p.cut), (1, true));
    let p = check_splits(ToolFormat::Mistral, "no [TOOL_CALLS here");
    assert_eq!((p.content.as_str(), p.calls.len()), ("no [TOOL_CALLS here", 0));
}

#[test]
fn formats_from_templates() {
    let qwen = include_str!("../../../../fixtures/chat/templates/qwen05.jinja");
    let smol = include_str!("../../../../fixtures/chat/templates/smollm2.jinja");
    let none = |_: &str| false;
    assert_eq!(ToolFormat::detect(qwen, &none), Some(ToolFormat::Hermes));
    assert_eq!(ToolFormat::detect(smol, &none), None);
    let mistral = "{% for m in messages %}[TOOL_CALLS]{{ m.tool_calls | tojson }}{% endfor %}";
    assert_eq!(ToolFormat::detect(mistral, &|t| t == "[TOOL_CALLS]"), Some(ToolFormat::Mistral));
    assert_eq!(ToolFormat::detect(mistral, &none), None);
    let llama = "<|start_header_id|>{{ '{\"name\": function name, \"parameters\": dictionary}' }}";
    assert_eq!(ToolFormat::detect(llama, &none), Some(ToolFormat::Llama3));
    for f in ToolFormat::ALL {
        assert_eq!(ToolFormat::from_name(f.name()), Some(f));
    }
    assert_eq!(ToolFormat::from_name("none"), None);
}
