//! Tool calls in model output: the formats chat templates teach models, parsed incrementally so that a stream
//! of text pieces gives the same content and calls as the whole text.
//!
//! | format | a call looks like |
//! |---|---|
//! | [`ToolFormat::Hermes`] (Qwen 2.5/3, Hermes) | `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`, one or several, anywhere in the reply |
//! | [`ToolFormat::Llama3`] | the reply is `{"name": "f", "parameters": {...}}` (optionally after `<|python_tag|>`), several joined by `;` |
//! | [`ToolFormat::Mistral`] | `[TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]` (tokenizer v3), or `[TOOL_CALLS]f[ARGS]{...}` per call (v11 and later, `tools/mistral.rs`) |
//! | [`ToolFormat::Harmony`] (gpt-oss) | `<|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}<|call|>`, a message per call |
//!
//! Harmony frames calls as messages and follows its own rules, given in `tools/harmony.rs`; the rules below are
//! those of the other formats (Mistral's named syntax announces a call when its arguments start, see
//! `tools/mistral.rs`).
//!
//! A parser made with [`ToolParser::end_at_first_call`] (`parallel_tool_calls: false`) keeps at most one call:
//! once the first call is complete, [`ToolParser::ended`] is true and the rest of the text is dropped, so the
//! reply is what came before that call and the call.
//!
//! Rules shared by every format (the same for a stream and for the whole text):
//!
//! * Text outside calls is content, byte for byte, except whitespace that touches a call (right before its
//!   marker or right after its end), which is dropped. A reply without calls is content unchanged.
//! * A call is announced ([`ToolEvent::CallStart`]) once its name is complete; its arguments follow as
//!   [`ToolEvent::CallArgs`] deltas as they are generated, and the deltas of a call concatenate to its final
//!   `arguments`. Arguments are the JSON text the model wrote for the `arguments`/`parameters` value (a JSON
//!   string value is decoded to its contents); a call without one gets `{}`.
//! * Call-looking text whose JSON breaks before the name is complete is content after all (nothing of it was
//!   announced). A call whose JSON breaks after its name ends there with the arguments already sent.
//! * A reply that ends inside a call (cut by `max_tokens`) ends with no half-parsed call: the partial call is
//!   left out of [`ToolsEnd::calls`] and its text is dropped, and [`ToolsEnd::cut`] is set. A stream has
//!   already sent what was announced of it.

use serde_json::Value as Json;

/// The tool-call formats this crate parses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Llama3,
    Mistral,
    /// OpenAI's harmony (gpt-oss): a call is a message to `functions.NAME` whose body is the JSON arguments.
    Harmony,
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";
const MISTRAL_OPEN: &str = "[TOOL_CALLS]";

impl ToolFormat {
    /// Every format, by name.
    pub const ALL: [ToolFormat; 4] = [ToolFormat::Hermes, ToolFormat::Llama3, ToolFormat::Mistral, ToolFormat::Harmony];

    /// `hermes`, `llama3`, `mistral`, `harmony`.
    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "hermes",
            ToolFormat::Llama3 => "llama3",
            ToolFormat::Mistral => "mistral",
            ToolFormat::Harmony => "harmony",
        }
    }

    /// The format of a name ([`ToolFormat::name`]).
    pub fn from_name(name: &str) -> Option<ToolFormat> {
        ToolFormat::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The format a chat template teaches, from its source; `has_token` says whether the vocabulary holds a
    /// token spelled so (a marker that must be one token, such as Mistral's `[TOOL_CALLS]`). `None` when the
    /// template shows no tool-call format.
    pub fn detect(template: &str, has_token: &dyn Fn(&str) -> bool) -> Option<ToolFormat> {
        if crate::harmony::is_harmony_template(template) {
            return Some(ToolFormat::Harmony);
        }
        if template.contains(HERMES_OPEN) {
            return Some(ToolFormat::Hermes);
        }
        if template.contains(MISTRAL_OPEN) && has_token(MISTRAL_OPEN) {
            return Some(ToolFormat::Mistral);
        }
        let llama_header = template.contains("<|start_header_id|>");
        if llama_header && (template.contains(PYTHON_TAG) || template.contains("\"parameters\"")) {
            return Some(ToolFormat::Llama3);
        }
        None
    }

    /// Marker texts of this format; where the vocabulary has them as control tokens (hidden when special
    /// tokens are skipped), the text must still reach the parser.
    pub fn markers(self) -> &'static [&'static str] {
        match self {
            ToolFormat::Hermes => &[HERMES_OPEN, HERMES_CLOSE],
            ToolFormat::Llama3 => &[PYTHON_TAG],
            ToolFormat::Mistral => &[MISTRAL_OPEN, mistral::ARGS, mistral::CALL_ID],
            ToolFormat::Harmony => &crate::harmony::MARKERS,
        }
    }

    /// Whether calls of this format are forced in Mistral's named syntax (`[TOOL_CALLS]NAME[ARGS]{...}`, tokenizer
    /// v11 and later) for a model with this chat template: Mistral, with a template that writes `[ARGS]`. The
    /// parser reads both syntaxes whatever this says.
    pub fn writes_named_calls(self, template: &str) -> bool {
        self == ToolFormat::Mistral && template.contains(mistral::ARGS)
    }

    /// The key that holds a call's arguments in this format.
    pub fn arguments_key(self) -> &'static str {
        match self {
            ToolFormat::Llama3 => "parameters",
            _ => "arguments",
        }
    }
}

/// One finished tool call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as JSON text (as the model wrote them).
    pub arguments: String,
}

/// What the parser releases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolEvent {
    /// Text that is not part of a call.
    Content(String),
    /// Call number `index` (from 0) begins; its name is known.
    CallStart { index: usize, id: String, name: String },
    /// More argument text of call `index`.
    CallArgs { index: usize, delta: String },
}

/// The end of a parse.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolsEnd {
    /// The last events (held-back content).
    pub events: Vec<ToolEvent>,
    /// Every complete call, in order.
    pub calls: Vec<ToolCall>,
    /// The text ended inside a call, which is left out of `calls`.
    pub cut: bool,
}

/// A whole text parsed at once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedTools {
    pub content: String,
    pub calls: Vec<ToolCall>,
    pub cut: bool,
}

/// Parses a whole reply (the same result as feeding it to a [`ToolParser`] in any pieces).
pub fn parse_tool_calls(format: ToolFormat, text: &str, id_prefix: &str) -> ParsedTools {
    let mut p = ToolParser::new(format, id_prefix);
    let mut events = p.push(text);
    let end = p.finish();
    events.extend(end.events);
    let content = events
        .into_iter()
        .filter_map(|e| match e {
            ToolEvent::Content(s) => Some(s),
            _ => None,
        })
        .collect();
    ParsedTools { content, calls: end.calls, cut: end.cut }
}

fn is_ws(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

fn trim_ws_start(s: &str) -> &str {
    s.trim_start_matches(is_ws)
}

fn trim_ws_end(s: &str) -> &str {
    s.trim_end_matches(is_ws)
}

/// The length of the longest suffix of `text` that is a proper prefix of `marker`.
pub(crate) fn partial_suffix(text: &str, marker: &str) -> usize {
    let max = (marker.len() - 1).min(text.len());
    (1..=max)
        .rev()
        .find(|&k| text.is_char_boundary(text.len() - k) && marker.starts_with(&text[text.len() - k..]))
        .unwrap_or(0)
}

/// Scanner of one JSON value, fed a character at a time.
#[derive(Clone, Debug, Default)]
struct ValueScan {
    first: Option<char>,
    depth: u32,
    in_str: bool,
    esc: bool,
}

enum Fed {
    /// The character belongs to the value, which goes on.
    Part,
    /// The character ends the value.
    Last,
    /// The value ended before this character (a number or literal).
    Before,
    /// Not JSON.
    Bad,
}

impl ValueScan {
    fn feed(&mut self, c: char) -> Fed {
        let Some(first) = self.first else {
            self.first = Some(c);
            return match c {
                '"' => {
                    self.in_str = true;
                    Fed::Part
                }
                '{' | '[' => {
                    self.depth = 1;
                    Fed::Part
                }
                c if c == '-' || c.is_ascii_alphanumeric() => Fed::Part,
                _ => Fed::Bad,
            };
        };
        if self.in_str {
            if self.esc {
                self.esc = false;
            } else if c == '\\' {
                self.esc = true;
            } else if c == '"' {
                self.in_str = false;
                if self.depth == 0 {
                    return Fed::Last;
                }
            }
            return Fed::Part;
        }
        if first == '{' || first == '[' {
            match c {
                '"' => self.in_str = true,
                '{' | '[' => self.depth += 1,
                '}' | ']' => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        return Fed::Last;
                    }
                }
                _ => {}
            }
            return Fed::Part;
        }
        match c {
            ',' | '}' | ']' => Fed::Before,
            c if is_ws(c) => Fed::Before,
            c if c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '-') => Fed::Part,
            _ => Fed::Bad,
        }
    }

    fn is_string(&self) -> bool {
        self.first == Some('"')
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ObjState {
    Open,
    Key,
    KeyText,
    Colon,
    Value,
    InValue,
    AfterValue,
}

/// One call object being read.
#[derive(Debug)]
struct CallScan {
    /// Everything consumed for this call (marker and dropped whitespace included), released as content if the
    /// call breaks before its name is known.
    raw: String,
    /// Began at a marker (else at a separator between calls, where only whitespace before `{` is no call).
    by_marker: bool,
    /// Llama 3 without a marker: only `name` or `type` may come first, else the object is plain content.
    probe: bool,
    st: ObjState,
    key: String,
    key_esc: bool,
    cur_key: String,
    val: ValueScan,
    val_text: String,
    name: Option<String>,
    args: Option<String>,
    /// The arguments value is a JSON string (sent decoded, at its end).
    args_string: bool,
    index: Option<usize>,
    /// Bytes of the arguments already sent.
    sent: usize,
}

impl CallScan {
    fn new(raw: String, by_marker: bool, probe: bool) -> CallScan {
        CallScan {
            raw,
            by_marker,
            probe,
            st: ObjState::Open,
            key: String::new(),
            key_esc: false,
            cur_key: String::new(),
            val: ValueScan::default(),
            val_text: String::new(),
            name: None,
            args: None,
            args_string: false,
            index: None,
            sent: 0,
        }
    }
}

enum Step {
    /// The character was taken; go on.
    Took,
    /// The object is complete.
    Done,
    /// Not a call object.
    Bad,
}

#[derive(Debug)]
enum Mode {
    /// Content, looking for the next call.
    Text,
    /// Inside a call object; `in_array` for Mistral's list.
    Call { scan: CallScan, in_array: bool },
    /// Right after a call object.
    After { in_array: bool },
    /// Inside a call in Mistral's named syntax.
    Named(mistral::NamedScan),
}

/// The incremental parser: [`ToolParser::push`] text pieces, then [`ToolParser::finish`].
#[derive(Debug)]
pub struct ToolParser {
    format: ToolFormat,
    id_prefix: String,
    buf: String,
    mode: Mode,
    events: Vec<ToolEvent>,
    calls: Vec<ToolCall>,
    started: usize,
    /// The last thing released was a call: whitespace here touches it.
    after_call: bool,
    /// Nothing but whitespace so far (Llama 3 calls begin the reply).
    at_start: bool,
    /// The parser of [`ToolFormat::Harmony`], which replaces the rest.
    harmony: Option<Box<harmony::HarmonyCalls>>,
    /// Most calls kept; the text after the last of them is dropped.
    max_calls: usize,
}

impl ToolParser {
    /// A parser for `format`; call ids are `id_prefix` followed by the call's index.
    pub fn new(format: ToolFormat, id_prefix: &str) -> ToolParser {
        ToolParser {
            format,
            id_prefix: id_prefix.to_string(),
            buf: String::new(),
            mode: Mode::Text,
            events: Vec::new(),
            calls: Vec::new(),
            started: 0,
            after_call: false,
            at_start: true,
            harmony: (format == ToolFormat::Harmony).then(|| Box::new(harmony::HarmonyCalls::new(id_prefix))),
            max_calls: usize::MAX,
        }
    }

    /// This parser, keeping only the reply's first call: the reply ends when that call is complete, and the
    /// text after it is dropped (`parallel_tool_calls: false`).
    pub fn end_at_first_call(mut self) -> ToolParser {
        self.max_calls = 1;
        if let Some(h) = self.harmony.as_mut() {
            h.max_calls = 1;
        }
        self
    }

    /// Whether the parser has all the calls it keeps ([`ToolParser::end_at_first_call`]): the reply is over.
    pub fn ended(&self) -> bool {
        match &self.harmony {
            Some(h) => h.ended(),
            None => self.calls.len() >= self.max_calls,
        }
    }

    /// Feeds a piece of text; returns what became certain.
    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        if let Some(h) = self.harmony.as_mut() {
            return h.push(text);
        }
        if self.ended() {
            return Vec::new();
        }
        self.buf.push_str(text);
        self.run(false);
        std::mem::take(&mut self.events)
    }

    /// Ends the text: releases what was held back and returns the complete calls.
    pub fn finish(&mut self) -> ToolsEnd {
        if let Some(h) = self.harmony.as_mut() {
            return h.finish();
        }
        self.run(true);
        let mut cut = false;
        match std::mem::replace(&mut self.mode, Mode::Text) {
            Mode::Call { scan, .. } => {
                // Only whitespace after a separator is no call at all.
                cut = scan.by_marker || scan.st != ObjState::Open || !scan.raw.chars().all(is_ws);
            }
            Mode::Named(_) => cut = true,
            Mode::After { .. } | Mode::Text => {}
        }
        self.buf.clear();
        ToolsEnd { events: std::mem::take(&mut self.events), calls: std::mem::take(&mut self.calls), cut }
    }

    fn run(&mut self, eof: bool) {
        loop {
            if self.ended() {
                self.buf.clear();
                self.mode = Mode::Text;
                break;
            }
            let progressed = match self.mode {
                Mode::Text => self.text_step(eof),
                Mode::Call { .. } => self.call_step(),
                Mode::After { in_array } => self.after_step(in_array, eof),
                Mode::Named(_) => self.named_step(),
            };
            if !progressed {
                break;
            }
        }
        self.flush_args();
    }

    fn content(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        self.after_call = false;
        if !text.chars().all(is_ws) {
            self.at_start = false;
        }
        if let Some(ToolEvent::Content(last)) = self.events.last_mut() {
            last.push_str(text);
        } else {
            self.events.push(ToolEvent::Content(text.to_string()));
        }
    }

    /// Releases and drops the first `n` bytes of the buffer as content.
    fn release(&mut self, n: usize) {
        let t: String = self.buf.drain(..n).collect();
        self.content(&t);
    }

    fn text_step(&mut self, eof: bool) -> bool {
        if self.after_call {
            let n = self.buf.len() - trim_ws_start(&self.buf).len();
            self.buf.drain(..n);
            if self.buf.is_empty() {
                return false;
            }
        }
        match self.format {
            ToolFormat::Hermes | ToolFormat::Mistral => {
                let marker = if self.format == ToolFormat::Hermes { HERMES_OPEN } else { MISTRAL_OPEN };
                if let Some(p) = self.buf.find(marker) {
                    let kept = trim_ws_end(&self.buf[..p]).len();
                    self.release(kept);
                    let raw: String = self.buf.drain(..p - kept + marker.len()).collect();
                    self.mode = Mode::Call { scan: CallScan::new(raw, true, false), in_array: false };
                    return true;
                }
                let hold = if eof {
                    0
                } else {
                    let k = partial_suffix(&self.buf, marker);
                    self.buf.len() - trim_ws_end(&self.buf[..self.buf.len() - k]).len()
                };
                self.release(self.buf.len() - hold);
                false
            }
            ToolFormat::Harmony => false,
            ToolFormat::Llama3 => {
                if self.at_start {
                    let lead = self.buf.len() - trim_ws_start(&self.buf).len();
                    let rest = &self.buf[lead..];
                    if rest.starts_with(PYTHON_TAG) {
                        let raw: String = self.buf.drain(..lead + PYTHON_TAG.len()).collect();
                        self.mode = Mode::Call { scan: CallScan::new(raw, true, false), in_array: false };
                        return true;
                    }
                    if rest.starts_with('{') {
                        let raw: String = self.buf.drain(..lead).collect();
                        self.mode = Mode::Call { scan: CallScan::new(raw, true, true), in_array: false };
                        return true;
                    }
                    if !eof && PYTHON_TAG.starts_with(rest) {
                        return false;
                    }
                }
                self.release(self.buf.len());
                false
            }
        }
    }

    fn after_step(&mut self, in_array: bool, eof: bool) -> bool {
        let n = self.buf.len() - trim_ws_start(&self.buf).len();
        self.buf.drain(..n);
        if self.buf.is_empty() {
            return false;
        }
        let text = |p: &mut ToolParser| {
            p.after_call = true;
            p.mode = Mode::Text;
            true
        };
        match self.format {
            ToolFormat::Hermes => {
                if self.buf.starts_with(HERMES_CLOSE) {
                    self.buf.drain(..HERMES_CLOSE.len());
                    return text(self);
                }
                if HERMES_CLOSE.starts_with(self.buf.as_str()) {
                    // A cut end marker is part of the call, not content.
                    if eof {
                        self.buf.clear();
                    }
                    return false;
                }
                text(self)
            }
            ToolFormat::Mistral if in_array => {
                if self.buf.starts_with(',') {
                    self.buf.drain(..1);
                    self.mode = Mode::Call { scan: CallScan::new(",".into(), false, false), in_array: true };
                    return true;
                }
                if self.buf.starts_with(']') {
                    self.buf.drain(..1);
                }
                text(self)
            }
            ToolFormat::Mistral | ToolFormat::Harmony => text(self),
            ToolFormat::Llama3 => {
                if self.buf.starts_with(';') {
                    self.buf.drain(..1);
                    self.mode = Mode::Call { scan: CallScan::new(";".into(), false, true), in_array: false };
                    return true;
                }
                self.at_start = false;
                text(self)
            }
        }
    }

    /// Feeds the call scanner from the buffer until it needs more text or the object ends.
    fn call_step(&mut self) -> bool {
        let Mode::Call { scan, in_array } = &mut self.mode else { return false };
        let mut in_array = *in_array;
        let mut taken = 0;
        let mut outcome = None;
        let mut starts = Vec::new();
        let mut named = false;
        for c in self.buf.chars() {
            // Mistral: the list opens before the first object; a name is the named syntax.
            if self.format == ToolFormat::Mistral && scan.by_marker && scan.st == ObjState::Open && !in_array {
                if c == '[' {
                    in_array = true;
                    scan.raw.push(c);
                    taken += c.len_utf8();
                    continue;
                }
                if c != '{' && !is_ws(c) {
                    named = true;
                    break;
                }
            }
            let r = feed_call(scan, c);
            if let (Some(name), None, false) = (&scan.name, scan.index, matches!(r, Step::Bad)) {
                let index = self.started + starts.len();
                scan.index = Some(index);
                starts.push((index, name.clone()));
            }
            match r {
                Step::Took => taken += c.len_utf8(),
                Step::Done => {
                    taken += c.len_utf8();
                    outcome = Some(true);
                    break;
                }
                Step::Bad => {
                    taken += c.len_utf8();
                    outcome = Some(false);
                    break;
                }
            }
        }
        if let Mode::Call { in_array: a, scan } = &mut self.mode {
            *a = in_array;
            if named {
                let raw = std::mem::take(&mut scan.raw);
                self.buf.drain(..taken);
                self.mode = Mode::Named(mistral::NamedScan::new(raw));
                return true;
            }
        }
        self.buf.drain(..taken);
        for (index, name) in starts {
            self.started += 1;
            let id = format!("{}{index}", self.id_prefix);
            self.events.push(ToolEvent::CallStart { index, id, name });
        }
        match outcome {
            None => false,
            Some(ok) => {
                let Mode::Call { scan, in_array } = std::mem::replace(&mut self.mode, Mode::Text) else {
                    return false;
                };
                self.end_call(scan, ok, in_array);
                true
            }
        }
    }

    /// Sends argument text not yet sent for the call being read.
    fn flush_args(&mut self) {
        self.flush_named_args();
        let Mode::Call { scan, .. } = &mut self.mode else { return };
        let Some(index) = scan.index else { return };
        let streaming = scan.st == ObjState::InValue && is_args_key(&scan.cur_key) && !scan.val.is_string();
        let text = match (&scan.args, streaming) {
            (Some(a), _) if !scan.args_string => a.as_str(),
            (_, true) => scan.val_text.as_str(),
            _ => return,
        };
        if text.len() > scan.sent {
            let delta = text[scan.sent..].to_string();
            scan.sent = text.len();
            self.events.push(ToolEvent::CallArgs { index, delta });
        }
    }

    fn end_call(&mut self, mut scan: CallScan, ok: bool, in_array: bool) {
        let Some(index) = scan.index else {
            // Broken before its name: it was content.
            let raw = std::mem::take(&mut scan.raw);
            self.content(&raw);
            self.at_start = false;
            self.mode = Mode::Text;
            return;
        };
        // The arguments in full; what was not sent yet goes now (a value read before the name, a decoded string,
        // the end of a value, or `{}` for none).
        let (full, sent) = match (&scan.args, scan.args_string) {
            (Some(a), true) => (a.clone(), 0),
            (Some(a), false) => (a.clone(), scan.sent),
            (None, _) if scan.sent > 0 => (scan.val_text.clone(), scan.sent),
            (None, _) => ("{}".to_string(), 0),
        };
        if full.len() > sent {
            self.events.push(ToolEvent::CallArgs { index, delta: full[sent..].to_string() });
        }
        let name = scan.name.take().unwrap_or_default();
        self.calls.push(ToolCall { id: format!("{}{index}", self.id_prefix), name, arguments: full });
        self.after_call = true;
        self.at_start = false;
        self.mode = if ok { Mode::After { in_array } } else { Mode::Text };
    }
}

fn is_args_key(k: &str) -> bool {
    k == "arguments" || k == "parameters"
}

/// A JSON string's contents (`text` includes the quotes).
fn decode_string(text: &str) -> Option<String> {
    match serde_json::from_str::<Json>(text) {
        Ok(Json::String(s)) => Some(s),
        _ => None,
    }
}

fn feed_call(scan: &mut CallScan, c: char) -> Step {
    if scan.index.is_none() {
        scan.raw.push(c);
    }
    match scan.st {
        ObjState::Open => match c {
            c if is_ws(c) => Step::Took,
            '{' => {
                scan.st = ObjState::Key;
                Step::Took
            }
            _ => Step::Bad,
        },
        ObjState::Key => match c {
            c if is_ws(c) => Step::Took,
            '"' => {
                scan.key.clear();
                scan.key_esc = false;
                scan.st = ObjState::KeyText;
                Step::Took
            }
            _ => Step::Bad,
        },
        ObjState::KeyText => {
            if scan.key_esc {
                scan.key_esc = false;
                scan.key.push(c);
                return Step::Took;
            }
            match c {
                '\\' => {
                    scan.key_esc = true;
                    scan.key.push(c);
                    Step::Took
                }
                '"' => {
                    let Some(key) = decode_string(&format!("\"{}\"", scan.key)) else { return Step::Bad };
                    if scan.probe && scan.name.is_none() && key != "name" && key != "type" {
                        return Step::Bad;
                    }
                    scan.cur_key = key;
                    scan.st = ObjState::Colon;
                    Step::Took
                }
                _ => {
                    scan.key.push(c);
                    Step::Took
                }
            }
        }
        ObjState::Colon => match c {
            c if is_ws(c) => Step::Took,
            ':' => {
                scan.st = ObjState::Value;
                Step::Took
            }
            _ => Step::Bad,
        },
        ObjState::Value => {
            if is_ws(c) {
                return Step::Took;
            }
            scan.val = ValueScan::default();
            scan.val_text.clear();
            scan.st = ObjState::InValue;
            value_char(scan, c)
        }
        ObjState::InValue => value_char(scan, c),
        ObjState::AfterValue => after_value(scan, c),
    }
}

fn value_char(scan: &mut CallScan, c: char) -> Step {
    match scan.val.feed(c) {
        Fed::Part => {
            scan.val_text.push(c);
            Step::Took
        }
        Fed::Last => {
            scan.val_text.push(c);
            if !value_done(scan) {
                return Step::Bad;
            }
            scan.st = ObjState::AfterValue;
            Step::Took
        }
        Fed::Before => {
            if !value_done(scan) {
                return Step::Bad;
            }
            scan.st = ObjState::AfterValue;
            after_value(scan, c)
        }
        Fed::Bad => Step::Bad,
    }
}

fn after_value(scan: &mut CallScan, c: char) -> Step {
    match c {
        c if is_ws(c) => Step::Took,
        ',' => {
            scan.st = ObjState::Key;
            Step::Took
        }
        '}' if scan.name.is_some() => Step::Done,
        _ => Step::Bad,
    }
}

/// A value ended: keep the name and the arguments. False when the name is not a string.
fn value_done(scan: &mut CallScan) -> bool {
    if scan.cur_key == "name" && scan.name.is_none() {
        match decode_string(&scan.val_text) {
            Some(n) if !n.is_empty() => scan.name = Some(n),
            _ => return false,
        }
    } else if is_args_key(&scan.cur_key) && scan.args.is_none() {
        if scan.val.is_string() {
            scan.args_string = true;
            scan.args = Some(decode_string(&scan.val_text).unwrap_or_else(|| scan.val_text.clone()));
        } else {
            scan.args = Some(scan.val_text.clone());
        }
    }
    true
}

mod harmony;
mod mistral;

#[cfg(test)]
mod tests;
