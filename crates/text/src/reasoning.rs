//! Reasoning in model output: the `<think>…</think>` convention of Qwen3 and the DeepSeek-R1 distills, and the
//! `analysis` channel of harmony (gpt-oss), split into reasoning and answer, streamed (text pieces in, deltas out)
//! or whole, with the same result.
//!
//! Harmony's rules are given with [`ReasoningFormat::Harmony`]. Rules of `<think>` (the same for a stream and for
//! the whole text):
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
}

impl ReasoningFormat {
    /// Every format.
    pub const ALL: [ReasoningFormat; 3] =
        [ReasoningFormat::Qwen3, ReasoningFormat::DeepSeekR1, ReasoningFormat::Harmony];

    /// The name used on the command line and in requests: `qwen3`, `deepseek_r1`, `harmony`.
    pub fn name(self) -> &'static str {
        match self {
            ReasoningFormat::Qwen3 => "qwen3",
            ReasoningFormat::DeepSeekR1 => "deepseek_r1",
            ReasoningFormat::Harmony => "harmony",
        }
    }

    /// The format of a name given by [`ReasoningFormat::name`].
    pub fn from_name(name: &str) -> Option<ReasoningFormat> {
        ReasoningFormat::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The format a chat template teaches, if any: a template that frames messages with `<|channel|>` and
    /// `<|message|>` is harmony; one that writes `<think>` or `</think>` is DeepSeek-R1's when it uses DeepSeek's
    /// `<｜Assistant｜>` turn marker, else Qwen3's.
    pub fn detect(template: &str) -> Option<ReasoningFormat> {
        if crate::harmony::is_harmony_template(template) {
            return Some(ReasoningFormat::Harmony);
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

    /// The parser of a name: `qwen3`, `deepseek_r1`, `harmony`, or `none` (no parsing: `Ok(None)`).
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
    /// aside) with `<think>` makes the reply start inside thinking; one that ends with `</think>` (thinking
    /// turned off, as Qwen3's `enable_thinking=false` renders) makes it start outside; otherwise the format's
    /// default holds.
    pub fn for_prompt(self, prompt: &str) -> ReasoningParser {
        if self.format == ReasoningFormat::Harmony {
            return self;
        }
        let end = prompt.trim_end();
        let starts_inside = if end.ends_with(THINK_START) {
            true
        } else if end.ends_with(THINK_END) {
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
    /// tokens (hidden when special tokens are skipped): `<think>` and `</think>`, or harmony's seven.
    pub fn markers(&self) -> &'static [&'static str] {
        match self.format {
            ReasoningFormat::Harmony => &crate::harmony::MARKERS,
            _ => &[THINK_START, THINK_END],
        }
    }

    /// The text that opens a thinking block (`<think>`; harmony: `<|channel|>analysis<|message|>`).
    pub fn start_marker(&self) -> &'static str {
        match self.format {
            ReasoningFormat::Harmony => "<|channel|>analysis<|message|>",
            _ => THINK_START,
        }
    }

    /// The text that ends a thinking block (`</think>`; harmony: `<|end|>`, which ends any message).
    pub fn end_marker(&self) -> &'static str {
        match self.format {
            ReasoningFormat::Harmony => crate::harmony::END,
            _ => THINK_END,
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
        let t = text.trim_start();
        let rest = if let Some(r) = t.strip_prefix(THINK_START) {
            r
        } else if self.starts_inside {
            text
        } else {
            return ParsedReasoning { content: text.to_string(), ..Default::default() };
        };
        match rest.find(THINK_END) {
            Some(i) => ParsedReasoning {
                reasoning: rest[..i].trim_matches('\n').to_string(),
                content: rest[i + THINK_END.len()..].trim_start_matches('\n').to_string(),
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
        ReasoningStream {
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
                    if t.starts_with(THINK_START) {
                        let cut = self.buf.len() - t.len() + THINK_START.len();
                        self.buf.drain(..cut);
                        self.phase = Phase::Inside;
                        self.opened = true;
                        continue;
                    }
                    if !last && THINK_START.starts_with(t) {
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
                    if let Some(i) = self.buf.find(THINK_END) {
                        let r = self.buf[..i].trim_end_matches('\n');
                        if !r.is_empty() {
                            out.push(ReasoningEvent::Reasoning(r.to_string()));
                            self.reasoning_started = true;
                        }
                        self.buf.drain(..i + THINK_END.len());
                        self.phase = Phase::Content;
                        self.trim_content = true;
                        self.closed = true;
                        continue;
                    }
                    let keep = if last {
                        self.buf.len() - self.buf.trim_end_matches('\n').len()
                    } else {
                        held_back(&self.buf)
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

/// Length of the tail of `buf` that may still belong to the end of the block: newlines followed by a proper
/// prefix of `</think>` (possibly empty). The prefixes of `</think>` end in distinct characters, so at most one
/// of them is a suffix of `buf`.
fn held_back(buf: &str) -> usize {
    let bytes = buf.as_bytes();
    let k = (1..THINK_END.len()).rev().find(|&k| buf.ends_with(&THINK_END[..k])).unwrap_or(0);
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
        assert_eq!(held_back("abc"), 0);
        assert_eq!(held_back("abc<"), 1);
        assert_eq!(held_back("abc\n\n</thin"), 8);
        assert_eq!(held_back("abc\n"), 1);
        assert_eq!(held_back("<t"), 0);
        assert_eq!(held_back(""), 0);
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
}
