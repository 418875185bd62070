//! Reasoning in model output: the `<think>…</think>` convention of Qwen3 and the DeepSeek-R1 distills, Mistral's
//! `[THINK]…[/THINK]` (Magistral), and the `analysis` channel of harmony (gpt-oss), split into reasoning and
//! answer, streamed (text pieces in, deltas out) or whole, with the same result.
//!
//! Harmony's rules are given with [`ReasoningFormat::Harmony`]. Rules of `<think>` (the same for a stream and for
//! the whole text; Mistral's `[THINK]` and `[/THINK]` follow them with its own markers):
//!
//! * A reply opens a thinking block when, after optional leading whitespace, it starts with `<think>`. A reply
//!   that *starts inside* thinking (the rendered prompt already ended with `<think>`, as DeepSeek-R1's template
//!   writes it) is reasoning from its first byte; a `<think>` it repeats at its start is dropped all the same.
//! * The block runs to the first `</think>`; everything after it is content. Neither marker appears in either
//!   part. A reply that ends before `</think>` (cut by `max_tokens`) is all reasoning.
//! * Newlines touching a marker are dropped: leading and trailing `\n` of the reasoning and leading `\n` of the
//!   content after `</think>` (the spacing Qwen3's template writes around the block). Other text is byte for
//!   byte.
//! * A reply that neither opens a block nor starts inside one is content unchanged; a `<think>` later in the
//!   text, or a second block, is content too.
//!
//! Streaming holds back only what may still turn out to be a marker: at the start, text that is whitespace
//! plus a prefix of `<think>`; inside the block, a tail of newlines plus a prefix of `</think>`.

/// Opens a thinking block.
pub const THINK_START: &str = "<think>";
/// Ends a thinking block.
pub const THINK_END: &str = "</think>";
/// Opens a thinking block of Mistral's reasoning models (Magistral; a control token of their vocabularies).
pub const MISTRAL_THINK_START: &str = "[THINK]";
/// Ends a thinking block of Mistral's reasoning models.
pub const MISTRAL_THINK_END: &str = "[/THINK]";

/// The reasoning conventions this crate parses. Qwen3 and DeepSeek-R1 use `<think>`/`</think>`; they differ in
/// how they are detected and in where a reply starts when the prompt does not say. Harmony frames reasoning as
/// messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// Qwen3 (and QwQ-style templates): the reply opens `<think>` itself; with `enable_thinking=false` the
    /// template writes an empty block into the prompt and the reply is all content.
    Qwen3,
    /// DeepSeek-R1 and its distills: the template ends the prompt with `<think>\n`, so the reply starts inside
    /// thinking; a reply is taken to start inside unless the prompt ended the block.
    DeepSeekR1,
    /// OpenAI's harmony (gpt-oss): the bodies of `analysis` messages are reasoning; the bodies of `final` (and
    /// other) messages are content, their framing (`<|channel|>final<|message|>`, `<|end|>`, `<|return|>`)
    /// dropped; messages to a recipient (tool calls) stay in the content as they were generated, for the
    /// harmony tool-call parser. Several analysis messages are concatenated. Text outside messages (a reply
    /// that does not follow the format) is content.
    Harmony,
    /// Mistral's reasoning models (Magistral): the reply opens `[THINK]` itself and closes it with `[/THINK]`, by
    /// the rules of `<think>`.
    Mistral,
}

impl ReasoningFormat {
    /// Every format.
    pub const ALL: [ReasoningFormat; 4] =
        [ReasoningFormat::Qwen3, ReasoningFormat::DeepSeekR1, ReasoningFormat::Harmony, ReasoningFormat::Mistral];

    /// The name used on the command line and in requests: `qwen3`, `deepseek_r1`, `harmony`, `mistral`.
    pub fn name(self) -> &'static str {
        match self {
            ReasoningFormat::Qwen3 => "qwen3",
            ReasoningFormat::DeepSeekR1 => "deepseek_r1",
            ReasoningFormat::Harmony => "harmony",
            ReasoningFormat::Mistral => "mistral",
        }
    }

    /// The texts that open and end a thinking block of the `<think>`-style formats (harmony's are messages).
    fn think_markers(self) -> (&'static str, &'static str) {
        match self {
            ReasoningFormat::Mistral => (MISTRAL_THINK_START, MISTRAL_THINK_END),
            _ => (THINK_START, THINK_END),
        }
    }

    /// The format of a name given by [`ReasoningFormat::name`].
    pub fn from_name(name: &str) -> Option<ReasoningFormat> {
        ReasoningFormat::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The format a chat template teaches, if any: a template that frames messages with `<|channel|>` and
    /// `<|message|>` is harmony; one that writes `[THINK]` is Mistral's; one that writes `<think>` or `</think>` is
    /// DeepSeek-R1's when it uses DeepSeek's `<｜Assistant｜>` turn marker, else Qwen3's.
    pub fn detect(template: &str) -> Option<ReasoningFormat> {
        if crate::harmony::is_harmony_template(template) {
            return Some(ReasoningFormat::Harmony);
        }
        if template.contains(MISTRAL_THINK_START) {
            return Some(ReasoningFormat::Mistral);
        }
        if !template.contains(THINK_START) && !template.contains(THINK_END) {
            return None;
        }
        if template.contains("<｜Assistant｜>") {
            Some(ReasoningFormat::DeepSeekR1)
        } else {
            Some(ReasoningFormat::Qwen3)
        }
    }

    /// Whether a reply starts inside thinking when the prompt does not show it.
    fn default_starts_inside(self) -> bool {
        matches!(self, ReasoningFormat::DeepSeekR1)
    }
}

/// The result of [`ReasoningParser::parse`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedReasoning {
    /// The text of the thinking block, markers and the newlines touching them removed.
    pub reasoning: String,
    /// The answer: the text after the block (or the whole reply when there is no block).
    pub content: String,
    /// Whether the reply had a thinking block (opened by `<think>` or by starting inside one).
    pub opened: bool,
    /// Whether the block ended with `</think>` (false for a reply cut inside thinking).
    pub closed: bool,
}

/// One delta of a streamed reply, in reply order: every [`ReasoningEvent::Reasoning`] comes before the first
/// [`ReasoningEvent::Content`] of a reply that has a thinking block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReasoningEvent {
    /// More reasoning text (never empty).
    Reasoning(String),
    /// More answer text (never empty).
    Content(String),
}

/// Splits replies into reasoning and content for one [`ReasoningFormat`], given whether the reply starts inside
/// thinking. Cheap to copy; [`ReasoningParser::stream`] makes the incremental parser of one reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReasoningParser {
    format: ReasoningFormat,
    starts_inside: bool,
}

impl ReasoningParser {
    /// A parser for `format`, starting inside thinking as the format does by default (DeepSeek-R1 yes, Qwen3
    /// no); [`ReasoningParser::for_prompt`] decides it from the rendered prompt instead.
    pub fn new(format: ReasoningFormat) -> ReasoningParser {
        ReasoningParser { format, starts_inside: format.default_starts_inside() }
    }

    /// The parser a chat template calls for ([`ReasoningFormat::detect`]); `None` for templates without
    /// thinking markers.
    pub fn from_template(source: &str) -> Option<ReasoningParser> {
        ReasoningFormat::detect(source).map(ReasoningParser::new)
    }

    /// The parser of a name: `qwen3`, `deepseek_r1`, `harmony`, `mistral`, or `none` (no parsing: `Ok(None)`).
    pub fn by_name(name: &str) -> Result<Option<ReasoningParser>, String> {
        if name == "none" {
            return Ok(None);
        }
        match ReasoningFormat::from_name(name) {
            Some(f) => Ok(Some(ReasoningParser::new(f))),
            None => {
                let names: Vec<&str> = ReasoningFormat::ALL.iter().map(|f| f.name()).chain(["none"]).collect();
                Err(format!("unknown reasoning parser '{name}' (known: {})", names.join(", ")))
            }
        }
    }

    /// The parser to use: the one `name` gives when set (an override, `none` included), else the template's.
    pub fn select(name: Option<&str>, template: Option<&str>) -> Result<Option<ReasoningParser>, String> {
        match name {
            Some(n) => ReasoningParser::by_name(n),
            None => Ok(template.and_then(ReasoningParser::from_template)),
        }
    }

    /// The same parser with the start decided by the rendered prompt: a prompt that ends (trailing whitespace
    /// aside) with the format's opening marker (`<think>`) makes the reply start inside thinking; one that ends
    /// with its closing one (`</think>`: thinking turned off, as Qwen3's `enable_thinking=false` renders) makes it
    /// start outside; otherwise the format's default holds.
    pub fn for_prompt(self, prompt: &str) -> ReasoningParser {
        if self.format == ReasoningFormat::Harmony {
            return self;
        }
        let (open, close) = self.format.think_markers();
        let end = prompt.trim_end();
        let starts_inside = if end.ends_with(open) {
            true
        } else if end.ends_with(close) {
            false
        } else {
            self.format.default_starts_inside()
        };
        ReasoningParser { starts_inside, ..self }
    }

    /// The same parser, starting inside thinking or not.
    pub fn with_starts_inside(self, starts_inside: bool) -> ReasoningParser {
        ReasoningParser { starts_inside, ..self }
    }

    pub fn format(&self) -> ReasoningFormat {
        self.format
    }

    /// Whether the reply is taken to start inside a thinking block.
    pub fn starts_inside(&self) -> bool {
        self.starts_inside
    }

    /// The marker texts of this format that must reach the parser where the vocabulary has them as control
    /// tokens (hidden when special tokens are skipped): `<think>` and `</think>` (`[THINK]`, `[/THINK]`), or
    /// harmony's seven.
    pub fn markers(&self) -> &'static [&'static str] {
        match self.format {
            ReasoningFormat::Harmony => &crate::harmony::MARKERS,
            ReasoningFormat::Mistral => &[MISTRAL_THINK_START, MISTRAL_THINK_END],
            _ => &[THINK_START, THINK_END],
        }
    }

    /// The text that opens a thinking block (`<think>`, `[THINK]`; harmony: `<|channel|>analysis<|message|>`).
    pub fn start_marker(&self) -> &'static str {
        match self.format {
            ReasoningFormat::Harmony => "<|channel|>analysis<|message|>",
            f => f.think_markers().0,
        }
    }

    /// The text that ends a thinking block (`</think>`, `[/THINK]`; harmony: `<|end|>`, which ends any message).
    pub fn end_marker(&self) -> &'static str {
        match self.format {
            ReasoningFormat::Harmony => crate::harmony::END,
            f => f.think_markers().1,
        }
    }

    /// Splits a whole reply.
    pub fn parse(&self, text: &str) -> ParsedReasoning {
        if self.format == ReasoningFormat::Harmony {
            let mut s = self.stream();
            let mut events = s.push(text);
            events.extend(s.finish());
            let mut p = ParsedReasoning { opened: s.opened(), closed: s.closed(), ..Default::default() };
            for e in events {
                match e {
                    ReasoningEvent::Reasoning(r) => p.reasoning.push_str(&r),
                    ReasoningEvent::Content(c) => p.content.push_str(&c),
                }
            }
            return p;
        }
        let (open, close) = self.format.think_markers();
        let t = text.trim_start();
        let rest = if let Some(r) = t.strip_prefix(open) {
            r
        } else if self.starts_inside {
            text
        } else {
            return ParsedReasoning { content: text.to_string(), ..Default::default() };
        };
        match rest.find(close) {
            Some(i) => ParsedReasoning {
                reasoning: rest[..i].trim_matches('\n').to_string(),
                content: rest[i + close.len()..].trim_start_matches('\n').to_string(),
                opened: true,
                closed: true,
            },
            None => ParsedReasoning {
                reasoning: rest.trim_matches('\n').to_string(),
                content: String::new(),
                opened: true,
                closed: false,
            },
        }
    }

    /// The incremental parser of one reply.
    pub fn stream(&self) -> ReasoningStream {
        let (open, close) = self.format.think_markers();
        ReasoningStream {
            open,
            close,
            starts_inside: self.starts_inside,
            phase: Phase::Start,
            buf: String::new(),
            reasoning_started: false,
            trim_content: false,
            opened: false,
            closed: false,
            harmony: (self.format == ReasoningFormat::Harmony).then(crate::harmony::HarmonyReasoning::new),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Nothing decided yet: the text so far is whitespace plus a prefix of `<think>`.
    Start,
    /// Inside the thinking block.
    Inside,
    /// Content.
    Content,
}

/// The incremental parser of one reply: [`ReasoningStream::push`] each piece of text as it is generated, then
/// [`ReasoningStream::finish`]. The deltas concatenate to what [`ReasoningParser::parse`] gives for the whole
/// text, however the text was cut into pieces.
#[derive(Clone, Debug)]
pub struct ReasoningStream {
    /// The markers that open and end the block (`<think>`, `</think>`).
    open: &'static str,
    close: &'static str,
    starts_inside: bool,
    phase: Phase,
    /// Text received and not yet emitted.
    buf: String,
    /// Whether any reasoning was emitted (leading newlines of the block are dropped until then).
    reasoning_started: bool,
    /// Whether leading newlines of the content are still to be dropped (right after `</think>`).
    trim_content: bool,
    opened: bool,
    closed: bool,
    /// The split of [`ReasoningFormat::Harmony`], which replaces the rest.
    harmony: Option<crate::harmony::HarmonyReasoning>,
}

fn harmony_events(split: Vec<crate::harmony::Split>) -> Vec<ReasoningEvent> {
    split.into_iter().map(|(r, s)| if r { ReasoningEvent::Reasoning(s) } else { ReasoningEvent::Content(s) }).collect()
}

impl ReasoningStream {
    /// Takes the next piece of the reply; returns the deltas it completes.
    pub fn push(&mut self, piece: &str) -> Vec<ReasoningEvent> {
        if let Some(h) = self.harmony.as_mut() {
            return harmony_events(h.push(piece));
        }
        self.buf.push_str(piece);
        let mut out = Vec::new();
        self.drain(false, &mut out);
        out
    }

    /// Ends the reply: emits what was held back.
    pub fn finish(&mut self) -> Vec<ReasoningEvent> {
        if let Some(h) = self.harmony.as_mut() {
            return harmony_events(h.finish());
        }
        let mut out = Vec::new();
        self.drain(true, &mut out);
        out
    }

    /// Whether the text so far is inside the thinking block (or undecided at the start of a reply that starts
    /// inside).
    pub fn in_reasoning(&self) -> bool {
        if let Some(h) = &self.harmony {
            return h.in_reasoning();
        }
        match self.phase {
            Phase::Start => self.starts_inside,
            Phase::Inside => true,
            Phase::Content => false,
        }
    }

    /// Whether a thinking block has been opened.
    pub fn opened(&self) -> bool {
        if let Some(h) = &self.harmony {
            return h.opened;
        }
        self.opened
    }

    /// Whether the thinking block has ended with `</think>`.
    pub fn closed(&self) -> bool {
        if let Some(h) = &self.harmony {
            return h.closed;
        }
        self.closed
    }

    fn drain(&mut self, last: bool, out: &mut Vec<ReasoningEvent>) {
        loop {
            match self.phase {
                Phase::Start => {
                    let t = self.buf.trim_start();
                    if t.starts_with(self.open) {
                        let cut = self.buf.len() - t.len() + self.open.len();
                        self.buf.drain(..cut);
                        self.phase = Phase::Inside;
                        self.opened = true;
                        continue;
                    }
                    if !last && self.open.starts_with(t) {
                        return;
                    }
                    if self.starts_inside {
                        self.phase = Phase::Inside;
                        self.opened = true;
                    } else {
                        self.phase = Phase::Content;
                    }
                }
                Phase::Inside => {
                    if !self.reasoning_started {
                        let n = self.buf.len() - self.buf.trim_start_matches('\n').len();
                        self.buf.drain(..n);
                    }
                    if let Some(i) = self.buf.find(self.close) {
                        let r = self.buf[..i].trim_end_matches('\n');
                        if !r.is_empty() {
                            out.push(ReasoningEvent::Reasoning(r.to_string()));
                            self.reasoning_started = true;
                        }
                        self.buf.drain(..i + self.close.len());
                        self.phase = Phase::Content;
                        self.trim_content = true;
                        self.closed = true;
                        continue;
                    }
                    let keep = if last {
                        self.buf.len() - self.buf.trim_end_matches('\n').len()
                    } else {
                        held_back(&self.buf, self.close)
                    };
                    let emit = self.buf.len() - keep;
                    if emit > 0 {
                        out.push(ReasoningEvent::Reasoning(self.buf[..emit].to_string()));
                        self.reasoning_started = true;
                        self.buf.drain(..emit);
                    }
                    if last {
                        self.buf.clear();
                    }
                    return;
                }
                Phase::Content => {
                    if self.trim_content {
                        let n = self.buf.len() - self.buf.trim_start_matches('\n').len();
                        self.buf.drain(..n);
                        if !self.buf.is_empty() {
                            self.trim_content = false;
                        }
                    }
                    if !self.buf.is_empty() {
                        out.push(ReasoningEvent::Content(std::mem::take(&mut self.buf)));
                    }
                    return;
                }
            }
        }
    }
}

/// Length of the tail of `buf` that may still belong to the end of the block: newlines followed by the longest
/// proper prefix of `close` (`</think>`, possibly empty) that ends `buf`.
fn held_back(buf: &str, close: &str) -> usize {
    let bytes = buf.as_bytes();
    let k = (1..close.len()).rev().find(|&k| buf.ends_with(&close[..k])).unwrap_or(0);
    let newlines = bytes[..bytes.len() - k].iter().rev().take_while(|&&b| b == b'\n').count();
    k + newlines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streamed(p: &ReasoningParser, pieces: &[&str]) -> (String, String) {
        let mut s = p.stream();
        let mut events = Vec::new();
        for piece in pieces {
            events.extend(s.push(piece));
        }
        events.extend(s.finish());
        let (mut r, mut c) = (String::new(), String::new());
        for e in events {
            match e {
                ReasoningEvent::Reasoning(x) => r.push_str(&x),
                ReasoningEvent::Content(x) => c.push_str(&x),
            }
        }
        (r, c)
    }

    #[test]
    fn held_back_tails() {
        assert_eq!(held_back("abc", THINK_END), 0);
        assert_eq!(held_back("abc<", THINK_END), 1);
        assert_eq!(held_back("abc\n\n</thin", THINK_END), 8);
        assert_eq!(held_back("abc\n", THINK_END), 1);
        assert_eq!(held_back("<t", THINK_END), 0);
        assert_eq!(held_back("", THINK_END), 0);
        assert_eq!(held_back("abc\n[/TH", MISTRAL_THINK_END), 5);
        assert_eq!(held_back("abc[", MISTRAL_THINK_END), 1);
    }

    #[test]
    fn qwen3_block() {
        let p = ReasoningParser::new(ReasoningFormat::Qwen3);
        let r = p.parse("<think>\nLet me see.\n</think>\n\nThe answer.");
        assert_eq!(r.reasoning, "Let me see.");
        assert_eq!(r.content, "The answer.");
        assert!(r.opened && r.closed);
        assert_eq!(
            streamed(&p, &["<thi", "nk>\nLet me", " see.\n</", "think>\n", "\nThe answer."]),
            (r.reasoning, r.content)
        );
    }

    #[test]
    fn mistral_block() {
        let p = ReasoningParser::new(ReasoningFormat::Mistral);
        let r = p.parse("[THINK]Let me see.\n[/THINK]\nThe answer.");
        assert_eq!(r.reasoning, "Let me see.");
        assert_eq!(r.content, "The answer.");
        assert!(r.opened && r.closed);
        assert_eq!(
            streamed(&p, &["[TH", "INK]Let me", " see.\n[/", "THINK]\n", "The answer."]),
            (r.reasoning, r.content)
        );
        // `<think>` is text to this format.
        let q = p.parse("<think>x</think>y");
        assert_eq!((q.reasoning.as_str(), q.content.as_str(), q.opened), ("", "<think>x</think>y", false));
        assert_eq!(p.markers(), [MISTRAL_THINK_START, MISTRAL_THINK_END]);
        assert_eq!((p.start_marker(), p.end_marker()), ("[THINK]", "[/THINK]"));
        assert!(p.for_prompt("[INST]hi[/INST][THINK]").starts_inside());
        let tmpl = "{{ '[SYSTEM_PROMPT]First draft your thinking inside [THINK]...[/THINK][/SYSTEM_PROMPT]' }}";
        assert_eq!(ReasoningFormat::detect(tmpl), Some(ReasoningFormat::Mistral));
        assert_eq!(ReasoningParser::by_name("mistral").unwrap().map(|p| p.format()), Some(ReasoningFormat::Mistral));
    }
}
