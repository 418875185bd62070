//! Harmony (gpt-oss): reasoning and tool calls taken out of replies the way the server chains the parsers
//! (reasoning first, tool calls on its content), streamed at every split equal to the whole text; detection
//! from gpt-oss's chat template and by name; and that template rendered as transformers renders it.

use serde_json::Value;
use tf_text::{
    ChatRenderOptions, ChatTemplate, ReasoningEvent, ReasoningFormat, ReasoningParser, TextError, ToolEvent,
    ToolFormat, ToolParser,
};

const TEMPLATE: &str = include_str!("../../../fixtures/chat/templates/gpt-oss.jinja");

/// What a reply split into: reasoning, content, calls as streamed (name, concatenated argument deltas), the
/// finished calls (name, arguments), whether it was cut inside a call, and the reasoning flags.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Split {
    reasoning: String,
    content: String,
    streamed: Vec<(String, String)>,
    calls: Vec<(String, String)>,
    cut: bool,
    opened: bool,
    closed: bool,
}

/// Runs `pieces` through the harmony reasoning split (when `reasoning`) and the harmony tool parser on its
/// content (when `tools`), as the server does.
fn run(reasoning: bool, tools: bool, pieces: &[&str]) -> Split {
    let mut r = reasoning.then(|| ReasoningParser::new(ReasoningFormat::Harmony).stream());
    let mut t = tools.then(|| ToolParser::new(ToolFormat::Harmony, "call_"));
    let mut out = Split {
        reasoning: String::new(),
        content: String::new(),
        streamed: Vec::new(),
        calls: Vec::new(),
        cut: false,
        opened: false,
        closed: false,
    };
    let tool_events = |t: &mut Option<ToolParser>, text: &str, out: &mut Split| match t {
        None => out.content.push_str(text),
        Some(p) => {
            for e in p.push(text) {
                take_tool_event(e, out);
            }
        }
    };
    for piece in pieces {
        match r.as_mut() {
            None => tool_events(&mut t, piece, &mut out),
            Some(s) => {
                for e in s.push(piece) {
                    match e {
                        ReasoningEvent::Reasoning(x) => {
                            assert!(!x.is_empty());
                            out.reasoning.push_str(&x)
                        }
                        ReasoningEvent::Content(x) => {
                            assert!(!x.is_empty());
                            tool_events(&mut t, &x, &mut out)
                        }
                    }
                }
            }
        }
    }
    if let Some(s) = r.as_mut() {
        for e in s.finish() {
            match e {
                ReasoningEvent::Reasoning(x) => out.reasoning.push_str(&x),
                ReasoningEvent::Content(x) => tool_events(&mut t, &x, &mut out),
            }
        }
        out.opened = s.opened();
        out.closed = s.closed();
    }
    if let Some(p) = t.as_mut() {
        let end = p.finish();
        for e in end.events {
            take_tool_event(e, &mut out);
        }
        for (i, c) in end.calls.iter().enumerate() {
            assert_eq!(c.id, format!("call_{i}"));
        }
        out.calls = end.calls.into_iter().map(|c| (c.name, c.arguments)).collect();
        out.cut = end.cut;
    }
    out
}

fn take_tool_event(e: ToolEvent, out: &mut Split) {
    match e {
        ToolEvent::Content(x) => {
            assert!(!x.is_empty(), "empty content event");
            out.content.push_str(&x)
        }
        ToolEvent::CallStart { index, id, name } => {
            assert_eq!(index, out.streamed.len(), "calls are announced in order");
            assert_eq!(id, format!("call_{index}"));
            out.streamed.push((name, String::new()));
        }
        ToolEvent::CallArgs { index, delta } => {
            assert!(!delta.is_empty(), "empty argument delta");
            assert_eq!(index + 1, out.streamed.len(), "deltas belong to the last call announced");
            out.streamed[index].1.push_str(&delta);
        }
    }
}

/// The split of the whole text, checked equal to the stream of every split into two pieces and of one char at a
/// time, for every combination of the two parsers; returns the split with both on.
fn check(text: &str) -> Split {
    let mut both = None;
    for (reasoning, tools) in [(true, true), (true, false), (false, true)] {
        let whole = run(reasoning, tools, &[text]);
        for i in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
            let two = run(reasoning, tools, &[&text[..i], &text[i..]]);
            assert_eq!(two, whole, "{text:?} split at {i} (reasoning {reasoning}, tools {tools})");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(run(reasoning, tools, &refs), whole, "{text:?} char by char");
        if tools {
            // Every finished call was streamed exactly so; a cut reply may have announced one more.
            let n = whole.calls.len();
            assert_eq!(&whole.streamed[..n], &whole.calls[..], "{text:?}");
            assert!(whole.streamed.len() == n || (whole.cut && whole.streamed.len() == n + 1), "{text:?}");
        }
        if (reasoning, tools) == (true, true) {
            both = Some(whole);
        }
    }
    both.unwrap()
}

fn calls(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(n, a)| (n.to_string(), a.to_string())).collect()
}

const ANALYSIS: &str = "<|channel|>analysis<|message|>The user asks for {weather} in \"Oslo\" <b>.<|end|>";

#[test]
fn reasoning_then_final() {
    let text = format!("{ANALYSIS}<|start|>assistant<|channel|>final<|message|>It is 3 °C.\nEnjoy.<|return|>");
    let s = check(&text);
    assert_eq!(s.reasoning, "The user asks for {weather} in \"Oslo\" <b>.");
    assert_eq!(s.content, "It is 3 °C.\nEnjoy.");
    assert!(s.calls.is_empty() && !s.cut && s.opened && s.closed);
    // The stop token <|return|> is usually not part of the text.
    let stripped = check(text.strip_suffix("<|return|>").unwrap());
    assert_eq!((stripped.reasoning, stripped.content), (s.reasoning, s.content));
}

#[test]
fn reasoning_then_a_call() {
    let text = format!(
        "{ANALYSIS}<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>\
         {{\"city\": \"Oslo\", \"q\": \"a}}b\\\"c{{\", \"n\": {{\"x\": [1, 2]}}}}<|call|>"
    );
    let s = check(&text);
    assert_eq!(s.reasoning, "The user asks for {weather} in \"Oslo\" <b>.");
    assert_eq!(s.content, "");
    let args = "{\"city\": \"Oslo\", \"q\": \"a}b\\\"c{\", \"n\": {\"x\": [1, 2]}}";
    serde_json::from_str::<Value>(args).expect("the expected arguments are JSON");
    assert_eq!(s.calls, calls(&[("get_weather", args)]));
    assert!(!s.cut && s.closed);
    // Without <|call|> (a stop token, not in the text) the call is complete all the same.
    let stripped = check(text.strip_suffix("<|call|>").unwrap());
    assert_eq!((stripped.calls, stripped.cut), (s.calls, false));
}

#[test]
fn recipient_before_the_channel() {
    // The order gpt-oss's template renders calls in; the prompt ended with `<|start|>assistant`.
    let s = check(" to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Oslo\"}");
    assert_eq!(s.calls, calls(&[("get_weather", "{\"city\": \"Oslo\"}")]));
    assert_eq!((s.content.as_str(), s.reasoning.as_str(), s.opened), ("", "", false));
    let s = check(&format!(
        "{ANALYSIS}<|start|>assistant to=functions.now<|channel|>commentary <|constrain|>json<|message|>{{}}<|call|>"
    ));
    assert_eq!(s.calls, calls(&[("now", "{}")]));
}

#[test]
fn several_calls_in_one_reply() {
    let text = format!(
        "{ANALYSIS}<|start|>assistant<|channel|>commentary to=functions.a <|constrain|>json<|message|>{{\"x\": 1}}\
         <|call|><|start|>assistant to=functions.b<|channel|>commentary json<|message|> {{}} <|call|>\
         <|start|>assistant<|channel|>commentary<|message|>Both sent.<|end|>"
    );
    let s = check(&text);
    assert_eq!(s.calls, calls(&[("a", "{\"x\": 1}"), ("b", "{}")]));
    assert_eq!(s.content, "Both sent.");
    for m in ["<|call|>", "<|return|>", "<|end|>", "<|channel|>", "<|message|>", "<|start|>"] {
        assert!(!s.content.contains(m) && !s.reasoning.contains(m), "{m} leaked: {s:?}");
    }
}

#[test]
fn malformed_arguments_stay_content() {
    let call = "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>\
                city=Oslo<|call|>";
    let s = check(&format!("{ANALYSIS}{call}"));
    assert!(s.calls.is_empty() && s.streamed.is_empty() && !s.cut, "{s:?}");
    assert_eq!(s.content, call, "a refused call is content as generated");
    // An empty body is no call either.
    let empty = "<|channel|>commentary to=functions.f json<|message|><|call|>";
    let s = check(empty);
    assert_eq!((s.content.as_str(), s.calls.len()), (empty, 0));
}

#[test]
fn cut_inside_a_call() {
    let s =
        check(&format!("{ANALYSIS}<|start|>assistant<|channel|>commentary to=functions.f json<|message|>{{\"a\": [1"));
    assert!(s.calls.is_empty() && s.cut, "{s:?}");
    assert_eq!(s.streamed, calls(&[("f", "{\"a\": [1")]));
    let s = check(&format!("{ANALYSIS}<|start|>assistant<|channel|>commentary to=functions.f <|cons"));
    assert!(s.calls.is_empty() && s.streamed.is_empty() && s.cut && s.content.is_empty(), "{s:?}");
    // Cut inside the reasoning: all reasoning, the block not closed.
    let s = check("<|channel|>analysis<|message|>Still thinking <|en");
    assert_eq!(
        (s.reasoning.as_str(), s.content.as_str(), s.opened, s.closed),
        ("Still thinking <|en", "", true, false)
    );
}

#[test]
fn a_call_ended_early_keeps_what_was_sent() {
    let s = check("<|channel|>commentary to=functions.f json<|message|>{\"a\": 1<|end|><|start|>assistant<|channel|>final<|message|>ok");
    assert_eq!(s.calls, calls(&[("f", "{\"a\": 1")]));
    assert_eq!((s.content.as_str(), s.cut), ("ok", false));
}

#[test]
fn replies_outside_the_format_are_content() {
    for text in ["Hello, world!", "", "  to be or not", "<|chan", "a <|end|> b", "x\n<|channel|>final\nno"] {
        let s = check(text);
        assert!(s.reasoning.is_empty() && s.calls.is_empty() && !s.cut && !s.opened, "{text:?}: {s:?}");
        assert_eq!(s.content, text.replace("<|end|>", ""), "{text:?}");
    }
}

#[test]
fn each_parser_alone() {
    let text =
        format!("{ANALYSIS}<|start|>assistant<|channel|>commentary to=functions.f json<|message|>{{\"a\": 1}}<|call|>");
    // Reasoning only: the call stays in the content as generated.
    let r = run(true, false, &[&text]);
    assert_eq!(r.content, "<|start|>assistant<|channel|>commentary to=functions.f json<|message|>{\"a\": 1}<|call|>");
    assert!(!r.reasoning.is_empty());
    // Tools only: the analysis message stays in the content as generated.
    let t = run(false, true, &[&text]);
    assert_eq!(t.content, ANALYSIS);
    assert_eq!(t.calls, calls(&[("f", "{\"a\": 1}")]));
    let p = ReasoningParser::new(ReasoningFormat::Harmony).parse(&text);
    assert_eq!((p.reasoning, p.content, p.opened, p.closed), (r.reasoning, r.content, true, true));
    let whole = tf_text::parse_tool_calls(ToolFormat::Harmony, &text, "call_");
    assert_eq!((whole.content, whole.calls.len(), whole.cut), (t.content, 1, false));
}

#[test]
fn detected_from_the_template_and_by_name() {
    assert_eq!(ReasoningFormat::detect(TEMPLATE), Some(ReasoningFormat::Harmony));
    assert_eq!(ToolFormat::detect(TEMPLATE, &|_| true), Some(ToolFormat::Harmony));
    assert_eq!(ReasoningParser::from_template(TEMPLATE).map(|p| p.format()), Some(ReasoningFormat::Harmony));
    assert_eq!(ToolFormat::from_name("harmony"), Some(ToolFormat::Harmony));
    assert_eq!(ToolFormat::Harmony.name(), "harmony");
    assert_eq!(ReasoningParser::by_name("harmony").unwrap().map(|p| p.format()), Some(ReasoningFormat::Harmony));
    for m in ["<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>"] {
        assert!(ToolFormat::Harmony.markers().contains(&m), "{m}");
        assert!(ReasoningParser::new(ReasoningFormat::Harmony).markers().contains(&m), "{m}");
    }
    // The prompt does not decide where a harmony reply starts.
    let p = ReasoningParser::new(ReasoningFormat::Harmony).for_prompt("<|start|>assistant<think>");
    assert!(!p.starts_inside());
    // Other templates are not taken for harmony.
    let qwen = include_str!("../../../fixtures/chat/templates/qwen05.jinja");
    assert_eq!(ToolFormat::detect(qwen, &|_| true), Some(ToolFormat::Hermes));
    assert_eq!(ReasoningFormat::detect(qwen), None);
}

/// gpt-oss's template rendered by us equals transformers' rendering (fixtures/chat/gpt-oss.json, made by
/// tools/reference/harmony_chat_fixture.py with `strftime_now` fixed to the fixture's date).
#[test]
fn the_gpt_oss_template_renders_as_transformers() {
    let fx: Value = serde_json::from_str(include_str!("../../../fixtures/chat/gpt-oss.json")).unwrap();
    let date = fx["strftime_now"].as_str().unwrap();
    let tmpl = ChatTemplate::new(TEMPLATE).unwrap();
    let cases = fx["cases"].as_array().unwrap();
    assert!(cases.len() >= 5);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let opts = ChatRenderOptions {
            add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
            tools: case.get("tools").filter(|t| !t.is_null()).cloned(),
            extra: case["kwargs"].as_object().cloned().unwrap_or_default(),
            ..Default::default()
        };
        let today = |_: ()| {
            let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
            tf_text::strftime_utc("%Y-%m-%d", secs as i64)
        };
        let before = today(());
        let got = tmpl.render(&case["messages"], &opts);
        let after = today(());
        match (got, case["rendered"].as_str()) {
            (Ok(g), Some(want)) => {
                let g = [before, after]
                    .iter()
                    .map(|d| g.replacen(&format!("Current date: {d}\n"), &format!("Current date: {date}\n"), 1))
                    .find(|x| x == want)
                    .unwrap_or(g);
                assert_eq!(g, want, "{name}");
            }
            (Err(TextError::TemplateRaised(msg)), None) => {
                let err = case["error"].as_str().unwrap();
                assert!(err.ends_with(&msg), "{name}: {msg} vs {err}");
            }
            (got, _) => panic!("{name}: {got:?} but the reference gave {:?}", case["error"]),
        }
    }
}

/// A tokenizer.json with harmony's markers: `<|return|>` and `<|call|>` end generation, `<|end|>` (which ends
/// a message) does not, and every marker is a special token the parsers must be shown.
#[test]
fn harmony_stop_tokens() {
    let mut j: Value =
        serde_json::from_str(include_str!("../../../fixtures/tiny/byte-tokenizer.json")).expect("byte tokenizer");
    let markers = ["<|start|>", "<|channel|>", "<|constrain|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>"];
    j["added_tokens"] = markers
        .iter()
        .enumerate()
        .map(|(i, m)| {
            serde_json::json!({"id": 256 + i, "content": m, "single_word": false, "lstrip": false,
                               "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let tok = tf_text::Tokenizer::from_hf_json(&serde_json::to_vec(&j).unwrap(), None, &[]).unwrap();
    let id = |m: &str| tok.id_of(m).unwrap();
    assert!(tok.is_stop(id("<|return|>")) && tok.is_stop(id("<|call|>")));
    assert!(!tok.is_stop(id("<|end|>")));
    for m in markers {
        assert!(tok.token_kind(id(m)).is_some_and(|k| k.is_special()), "{m}");
    }
}

/// `reasoning_content` (as OpenAI-style clients send an assistant turn's reasoning) renders as gpt-oss's
/// `thinking`.
#[test]
fn reasoning_content_renders_as_thinking() {
    let fx: Value = serde_json::from_str(include_str!("../../../fixtures/chat/gpt-oss.json")).unwrap();
    let case = fx["cases"].as_array().unwrap().iter().find(|c| c["name"] == "call_with_reasoning_then_result").unwrap();
    let tmpl = ChatTemplate::new(TEMPLATE).unwrap();
    let opts =
        ChatRenderOptions { add_generation_prompt: true, tools: Some(case["tools"].clone()), ..Default::default() };
    let want = tmpl.render(&case["messages"], &opts).unwrap();
    assert!(want.contains("<|channel|>analysis<|message|>The user wants the weather; call get_weather.<|end|>"));
    let mut messages = case["messages"].clone();
    let turn = messages[1].as_object_mut().unwrap();
    let thinking = turn.remove("thinking").unwrap();
    turn.insert("reasoning_content".into(), thinking);
    turn.insert("content".into(), Value::Null);
    assert_eq!(tmpl.render(&messages, &opts).unwrap(), want);
    // With content as well the content stays the turn's reasoning, as the template has it.
    messages[1]["content"] = Value::String("Checking.".into());
    let got = tmpl.render(&messages, &opts).unwrap();
    assert!(got.contains("<|channel|>analysis<|message|>Checking.<|end|>"), "{got}");
}

/// A small deterministic generator (xorshift64*), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n as u64) as usize
    }
}

/// Pieces replies are made of: whole and partial markers, header words, JSON pieces, text, multi-byte characters.
const ATOMS: &[&str] = &[
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
    "<|constrain|>",
    "<|",
    "<|chan",
    "<|en",
    "|>",
    "assistant",
    "analysis",
    "final",
    "commentary",
    " to=functions.f",
    "to=functions.g ",
    " json",
    "{",
    "}",
    "\"a}\"",
    "[1, {",
    " ",
    "\n",
    "x",
    "é漢",
    ".",
];

/// Random replies, and random replies that follow the format, streamed at every split into two pieces and char
/// by char: always the whole parse, whichever parsers are on; markers never reach the content of a reply that
/// follows the format and has no refused call.
#[test]
fn random_replies_stream_as_whole() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for case in 0..300 {
        let text: String = if case % 2 == 0 {
            (0..rng.below(14)).map(|_| ATOMS[rng.below(ATOMS.len())]).collect()
        } else {
            // Well-formed messages in random order.
            let mut t = String::new();
            for i in 0..1 + rng.below(3) {
                if i > 0 || rng.below(2) == 0 {
                    t.push_str("<|start|>assistant");
                }
                match rng.below(3) {
                    0 => t.push_str("<|channel|>analysis<|message|>think {a} <x>\n<|end|>"),
                    1 => t.push_str(&format!(
                        "<|channel|>commentary to=functions.f{i} <|constrain|>json<|message|>{{\"k\": [{i}, \"}}\"]}}<|call|>"
                    )),
                    _ => t.push_str("<|channel|>final<|message|>Done é.<|return|>"),
                }
            }
            t
        };
        let s = check(&text);
        if case % 2 == 1 {
            for m in ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>"] {
                assert!(!s.content.contains(m) && !s.reasoning.contains(m), "{m} leaked from {text:?}: {s:?}");
            }
            assert_eq!(s.calls.len(), text.matches("to=functions").count(), "{text:?}");
            assert!(!s.cut, "{text:?}");
        }
    }
}
