//! The reasoning parser: streamed == whole at every split, markers never leak, the parts are exactly the
//! generated ones, and the selection from templates, names and prompts.

use tf_text::{
    ParsedReasoning, ReasoningEvent, ReasoningFormat, ReasoningParser, MISTRAL_THINK_END, MISTRAL_THINK_START,
    THINK_END, THINK_START,
};

/// A small deterministic generator (xorshift64*), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Pieces text is made of: marker look-alikes that are not markers, newlines, multi-byte characters.
const ATOMS: &[&str] = &[
    "a",
    "b",
    " ",
    "\n",
    "\n\n",
    "<",
    "</",
    "</t",
    "</thin",
    "</think",
    "<thi",
    "<think",
    "think>",
    ">",
    "/",
    "é",
    "日本",
    "🙂",
    "\t",
    "x</th",
    "\n</",
    "<th",
    "ink>",
    "[",
    "[/",
    "[/TH",
    "[THI",
    "INK]",
    "]",
    "\n[/THINK",
];

fn random_text(rng: &mut Rng, max: usize) -> String {
    loop {
        let n = rng.below(max + 1);
        let s: String = (0..n).map(|_| ATOMS[rng.below(ATOMS.len())]).collect();
        let markers = [THINK_START, THINK_END, MISTRAL_THINK_START, MISTRAL_THINK_END];
        if !markers.iter().any(|m| s.contains(m)) {
            return s;
        }
    }
}

fn collect(events: &[ReasoningEvent]) -> (String, String) {
    let (mut r, mut c) = (String::new(), String::new());
    let mut seen_content = false;
    for e in events {
        match e {
            ReasoningEvent::Reasoning(x) => {
                assert!(!seen_content, "reasoning after content: {events:?}");
                assert!(!x.is_empty());
                r.push_str(x);
            }
            ReasoningEvent::Content(x) => {
                seen_content = true;
                assert!(!x.is_empty());
                c.push_str(x);
            }
        }
    }
    (r, c)
}

/// The reply streamed in `pieces`: (reasoning, content, opened, closed).
fn streamed(p: &ReasoningParser, pieces: &[&str]) -> (String, String, bool, bool) {
    let mut s = p.stream();
    let mut events = Vec::new();
    for piece in pieces {
        events.extend(s.push(piece));
    }
    events.extend(s.finish());
    let (r, c) = collect(&events);
    (r, c, s.opened(), s.closed())
}

fn as_tuple(w: &ParsedReasoning) -> (String, String, bool, bool) {
    (w.reasoning.clone(), w.content.clone(), w.opened, w.closed)
}

/// Streamed at every split into two pieces, at every pair of splits for short texts, and in random pieces: always
/// the whole parse.
fn check_splits(p: &ReasoningParser, text: &str, rng: &mut Rng) -> ParsedReasoning {
    let whole = p.parse(text);
    let want = as_tuple(&whole);
    let cuts: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
    for &i in &cuts {
        assert_eq!(streamed(p, &[&text[..i], &text[i..]]), want, "split at {i} of {text:?}");
    }
    if cuts.len() <= 40 {
        for &i in &cuts {
            for &j in cuts.iter().filter(|&&j| j >= i) {
                assert_eq!(streamed(p, &[&text[..i], &text[i..j], &text[j..]]), want, "splits {i}, {j} of {text:?}");
            }
        }
    }
    for _ in 0..8 {
        let mut pieces = Vec::new();
        let mut at = 0;
        while at < text.len() {
            let mut end = (at + 1 + rng.below(6)).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            pieces.push(&text[at..end]);
            at = end;
        }
        assert_eq!(streamed(p, &pieces), want, "pieces {pieces:?}");
    }
    // Byte by byte where possible (each char as one piece).
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(streamed(p, &refs), want, "char by char: {text:?}");
    whole
}

#[test]
fn streamed_equals_whole_and_parts_are_exact() {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    for case in 0..800 {
        // Qwen3's markers, then Mistral's (`[THINK]`, `[/THINK]`) by the same rules.
        let format = if case < 400 { ReasoningFormat::Qwen3 } else { ReasoningFormat::Mistral };
        let qwen = ReasoningParser::new(format);
        let (think_start, think_end) = (qwen.start_marker(), qwen.end_marker());
        let lead = ["", " ", "\n", " \n\t"][rng.below(4)];
        let reasoning = random_text(&mut rng, 10);
        let content = random_text(&mut rng, 10);
        let close = rng.below(5) != 0;
        let starts_inside = rng.below(2) == 0;
        let with_open = !starts_inside || rng.below(3) == 0;
        let mut text = String::from(lead);
        if with_open {
            text.push_str(think_start);
        }
        text.push_str(&reasoning);
        if close {
            text.push_str(think_end);
            text.push_str(&content);
        }
        let p = qwen.with_starts_inside(starts_inside);
        let got = check_splits(&p, &text, &mut rng);
        let (want_r, want_c) = if with_open {
            (reasoning.trim_matches('\n').to_string(), if close { content.trim_start_matches('\n') } else { "" })
        } else {
            // Starts inside: the leading whitespace is part of the reasoning (its newlines trimmed).
            let r = format!("{lead}{reasoning}");
            (r.trim_matches('\n').to_string(), if close { content.trim_start_matches('\n') } else { "" })
        };
        assert_eq!(got.reasoning, want_r, "case {case}: {text:?}");
        assert_eq!(got.content, want_c, "case {case}: {text:?}");
        assert!(got.opened);
        assert_eq!(got.closed, close);
        for part in [&got.reasoning, &got.content] {
            assert!(!part.contains(think_start) && !part.contains(think_end), "case {case}: marker leaked: {part:?}");
        }
    }
}

#[test]
fn replies_without_a_block_are_content_unchanged() {
    let mut rng = Rng(0x5eed_0000_0000_0002);
    let p = ReasoningParser::new(ReasoningFormat::Qwen3);
    assert!(!p.starts_inside());
    for _ in 0..200 {
        let text = random_text(&mut rng, 12);
        let got = check_splits(&p, &text, &mut rng);
        assert_eq!(got, ParsedReasoning { content: text.clone(), ..Default::default() }, "{text:?}");
    }
    // A block that does not open the reply is content, markers and all.
    let text = "Sure.\n<think>\nnot reasoning\n</think>\nok";
    let got = check_splits(&p, text, &mut rng);
    assert_eq!((got.reasoning.as_str(), got.content.as_str(), got.opened), ("", text, false));
    // A second block after the first is content.
    let got = check_splits(&p, "<think>a</think>b<think>c</think>d", &mut rng);
    assert_eq!((got.reasoning.as_str(), got.content.as_str()), ("a", "b<think>c</think>d"));
}

#[test]
fn qwen3_and_deepseek_shapes() {
    let mut rng = Rng(3);
    let qwen = ReasoningParser::new(ReasoningFormat::Qwen3);
    let got = check_splits(&qwen, "<think>\nLet me see: 2 + 2.\n\nIt is 4.\n</think>\n\nThe answer is 4.", &mut rng);
    assert_eq!(got.reasoning, "Let me see: 2 + 2.\n\nIt is 4.");
    assert_eq!(got.content, "The answer is 4.");
    assert!(got.opened && got.closed);
    // Thinking turned off: Qwen3's template wrote the empty block into the prompt; the reply is content.
    let off = qwen.for_prompt("<|im_start|>assistant\n<think>\n\n</think>\n\n");
    assert_eq!(off.parse("\n\nHello").content, "\n\nHello");
    // Cut by max_tokens inside thinking: all reasoning, a partial marker kept as text.
    let got = check_splits(&qwen, "<think>\nStill thinking\n\n</thi", &mut rng);
    assert_eq!((got.reasoning.as_str(), got.content.as_str(), got.closed), ("Still thinking\n\n</thi", "", false));
    let got = check_splits(&qwen, "<think>\nStill thinking\n\n", &mut rng);
    assert_eq!((got.reasoning.as_str(), got.closed), ("Still thinking", false));
    // An empty block.
    let got = check_splits(&qwen, "<think>\n\n</think>\n\nHi", &mut rng);
    assert_eq!((got.reasoning.as_str(), got.content.as_str(), got.opened), ("", "Hi", true));

    let r1 = ReasoningParser::new(ReasoningFormat::DeepSeekR1);
    assert!(r1.starts_inside());
    let p = r1.for_prompt("<｜User｜>2+2?<｜Assistant｜><think>\n");
    assert!(p.starts_inside());
    let got = check_splits(&p, "Okay, 2 + 2 = 4.\n</think>\n\n**4**", &mut rng);
    assert_eq!((got.reasoning.as_str(), got.content.as_str()), ("Okay, 2 + 2 = 4.", "**4**"));
    // A model that writes `<think>` again anyway.
    let got = check_splits(&p, "<think>\nOkay.\n</think>\n\n4", &mut rng);
    assert_eq!((got.reasoning.as_str(), got.content.as_str()), ("Okay.", "4"));
    // Ends inside thinking.
    assert_eq!(p.parse("Hmm").reasoning, "Hmm");
    assert!(!p.parse("Hmm").closed);
}

#[test]
fn streaming_holds_back_only_possible_markers() {
    let p = ReasoningParser::new(ReasoningFormat::Qwen3);
    let mut s = p.stream();
    assert_eq!(s.push(" <th"), vec![]);
    assert!(!s.in_reasoning());
    assert_eq!(s.push("ink>\nStep one"), vec![ReasoningEvent::Reasoning("Step one".into())]);
    assert!(s.in_reasoning() && s.opened());
    assert_eq!(s.push(".\n\n</"), vec![ReasoningEvent::Reasoning(".".into())]);
    assert_eq!(s.push("b>"), vec![ReasoningEvent::Reasoning("\n\n</b>".into())]);
    assert_eq!(s.push("\n</think"), vec![]);
    assert_eq!(s.push(">\n\nAns"), vec![ReasoningEvent::Content("Ans".into())]);
    assert!(!s.in_reasoning() && s.closed());
    assert_eq!(s.push("wer\n"), vec![ReasoningEvent::Content("wer\n".into())]);
    assert_eq!(s.finish(), vec![]);

    // Undecided text at the start that turns out not to open a block is content at once.
    let mut s = p.stream();
    assert_eq!(s.push("\n<t"), vec![]);
    assert_eq!(s.push("x"), vec![ReasoningEvent::Content("\n<tx".into())]);
    // A reply that ends undecided: its text is content (or reasoning when it starts inside).
    let mut s = p.stream();
    assert_eq!(s.push("<thi"), vec![]);
    assert_eq!(s.finish(), vec![ReasoningEvent::Content("<thi".into())]);
    let mut s = p.with_starts_inside(true).stream();
    assert!(s.in_reasoning());
    assert_eq!(s.push("<thi"), vec![]);
    assert_eq!(s.finish(), vec![ReasoningEvent::Reasoning("<thi".into())]);
}

#[test]
fn selection_from_templates_names_and_prompts() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("tiny-qwen3/tokenizer_config.json")).unwrap()).unwrap();
    let qwen3 = cfg["chat_template"].as_str().unwrap();
    assert_eq!(ReasoningParser::from_template(qwen3).map(|p| p.format()), Some(ReasoningFormat::Qwen3));
    // Templates without thinking markers (Qwen2.5, SmolLM2) select nothing.
    for name in ["qwen05", "qwen15", "smollm2"] {
        let src = std::fs::read_to_string(root.join(format!("chat/templates/{name}.jinja"))).unwrap();
        assert_eq!(ReasoningParser::from_template(&src), None, "{name}");
    }
    let r1 =
        "{% for m in messages %}{% if m['role'] == 'user' %}{{'<｜User｜>' + m['content']}}{% endif %}{% endfor %}\
              {% if add_generation_prompt %}{{'<｜Assistant｜><think>\\n'}}{% endif %}";
    assert_eq!(ReasoningParser::from_template(r1).map(|p| p.format()), Some(ReasoningFormat::DeepSeekR1));

    assert_eq!(ReasoningParser::by_name("qwen3").unwrap().map(|p| p.format()), Some(ReasoningFormat::Qwen3));
    assert_eq!(ReasoningParser::by_name("deepseek_r1").unwrap().map(|p| p.format()), Some(ReasoningFormat::DeepSeekR1));
    assert_eq!(ReasoningParser::by_name("none").unwrap(), None);
    let err = ReasoningParser::by_name("r2").unwrap_err();
    assert!(err.contains("qwen3") && err.contains("deepseek_r1") && err.contains("none"), "{err}");
    // A name overrides the template, `none` included.
    assert_eq!(ReasoningParser::select(Some("none"), Some(qwen3)).unwrap(), None);
    assert_eq!(
        ReasoningParser::select(Some("deepseek_r1"), Some(qwen3)).unwrap().unwrap().format(),
        ReasoningFormat::DeepSeekR1
    );
    assert_eq!(ReasoningParser::select(None, Some(qwen3)).unwrap().unwrap().format(), ReasoningFormat::Qwen3);
    assert_eq!(ReasoningParser::select(None, None).unwrap(), None);

    let q = ReasoningParser::new(ReasoningFormat::Qwen3);
    assert!(q.for_prompt("<|im_start|>assistant\n<think>\n").starts_inside());
    assert!(q.for_prompt("<|im_start|>assistant\n<think>").starts_inside());
    assert!(!q.for_prompt("<|im_start|>assistant\n").starts_inside());
    assert!(!q.for_prompt("<|im_start|>assistant\n<think>\n\n</think>\n\n").starts_inside());
    let d = ReasoningParser::new(ReasoningFormat::DeepSeekR1);
    assert!(d.for_prompt("<｜Assistant｜>").starts_inside());
    assert!(!d.for_prompt("<｜Assistant｜><think>\n\n</think>\n\n").starts_inside());
    assert_eq!((q.start_marker(), q.end_marker()), ("<think>", "</think>"));
    assert_eq!(ReasoningFormat::from_name("qwen3"), Some(ReasoningFormat::Qwen3));
    assert_eq!(ReasoningFormat::DeepSeekR1.name(), "deepseek_r1");
}
