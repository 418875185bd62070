//! OpenAI's harmony format (gpt-oss): a reply is a sequence of messages
//! `<|start|>{role}<|channel|>{channel}<|message|>{text}<|end|>`. The assistant writes its reasoning on the
//! `analysis` channel, tool calls on `commentary` with a recipient
//! (`<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{ARGS}<|call|>`, the `to=` part may also
//! come before `<|channel|>`), and the answer on `final` (ending with `<|return|>`). The chat template ends the
//! prompt with `<|start|>assistant`, so a reply starts inside the header of its first message.
//!
//! This module is the lexer both harmony parsers share ([`crate::ReasoningFormat::Harmony`] and
//! [`crate::ToolFormat::Harmony`]); it splits text into message headers, bodies and ends, whatever pieces the
//! text arrives in.
//!
//! * A header starts at `<|start|>` or `<|channel|>`, or at the start of the text with `to=` (after optional
//!   spaces); it runs to `<|message|>`. It may hold `<|start|>` (first), one `<|channel|>`, `<|constrain|>`
//!   (after the channel) and words of letters, digits and `_-.:/=`, separated by spaces, at most
//!   [`MAX_HEADER`] bytes. Text that breaks these rules is no header: it is text outside messages.
//! * A body runs to `<|end|>`, `<|call|>` or `<|return|>`, or to the next `<|start|>` / `<|channel|>` (a
//!   message the model did not end).
//! * Text outside messages is passed on as it is, except the end markers, which are dropped there.

/// Opens a message header.
pub const START: &str = "<|start|>";
/// Starts the channel part of a header.
pub const CHANNEL: &str = "<|channel|>";
/// Starts the content type of a header (`<|constrain|>json`).
pub const CONSTRAIN: &str = "<|constrain|>";
/// Ends a header; the body follows.
pub const MESSAGE: &str = "<|message|>";
/// Ends a message.
pub const END: &str = "<|end|>";
/// Ends a message that is a tool call, and the generation.
pub const CALL: &str = "<|call|>";
/// Ends the final message, and the generation.
pub const RETURN: &str = "<|return|>";

/// Every harmony marker (all of them control tokens of gpt-oss's vocabulary).
pub const MARKERS: [&str; 7] = [START, CHANNEL, CONSTRAIN, MESSAGE, END, CALL, RETURN];

/// The longest header accepted (bytes before `<|message|>`).
pub const MAX_HEADER: usize = 256;

const BODY_STOPS: [&str; 5] = [END, CALL, RETURN, START, CHANNEL];
const OUTSIDE_STOPS: [&str; 5] = [START, CHANNEL, END, CALL, RETURN];

/// A complete message header.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Header {
    /// The header text as received, `<|message|>` included.
    pub raw: String,
    pub role: String,
    pub channel: String,
    /// The `to=` target (`functions.get_weather`).
    pub recipient: Option<String>,
    /// The content type (`json`).
    pub content_type: Option<String>,
}

impl Header {
    /// Reads a header from its text before `<|message|>` (which `parse` does not check).
    fn parse(text: &str, raw: String) -> Header {
        let text = text.strip_prefix(START).unwrap_or(text);
        let (role_part, chan_part) = match text.find(CHANNEL) {
            Some(i) => (&text[..i], Some(&text[i + CHANNEL.len()..])),
            None => (text, None),
        };
        let mut h = Header { raw, ..Header::default() };
        for w in role_part.split_whitespace() {
            match w.strip_prefix("to=") {
                Some(r) => h.recipient = Some(r.to_string()),
                None if h.role.is_empty() => h.role = w.to_string(),
                None => {}
            }
        }
        if let Some(c) = chan_part {
            let c = c.replace(CONSTRAIN, " ");
            for w in c.split_whitespace() {
                match w.strip_prefix("to=") {
                    Some(r) => h.recipient = Some(r.to_string()),
                    None if h.channel.is_empty() => h.channel = w.to_string(),
                    None => h.content_type = Some(w.to_string()),
                }
            }
        }
        h
    }

    /// Reads the header of a cut text (no `<|message|>` yet).
    pub fn parse_partial(text: &str) -> Header {
        Header::parse(text, text.to_string())
    }
}

/// What the lexer releases, in text order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Lex {
    /// Text outside messages.
    Outside(String),
    /// A message header is complete.
    Header(Header),
    /// More body text of the current message (never empty).
    Body(String),
    /// The current message ended with this marker (`""`: ended by the next header). A text that ends inside a
    /// body gets no `End`.
    End(String),
    /// The text ended inside a header (its text so far).
    CutHeader(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing read yet: a header starts here with a marker or with `to=`.
    Start,
    Outside,
    Header,
    Body,
}

/// The incremental lexer.
#[derive(Clone, Debug)]
pub(crate) struct Lexer {
    state: State,
    buf: String,
}

/// The outcome of scanning a header buffer.
enum HeadScan {
    /// A complete header: the end of its text (where `<|message|>` starts) and the end of `<|message|>`.
    Complete(usize, usize),
    /// Still a possible header.
    Need,
    /// No header from this byte on.
    Invalid(usize),
}

fn header_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '/' | '=' | ' ')
}

fn scan_header(buf: &str) -> HeadScan {
    let mut i = 0;
    let mut channel = false;
    while i < buf.len() {
        if i > MAX_HEADER {
            return HeadScan::Invalid(i);
        }
        let rest = &buf[i..];
        if rest.starts_with("<|") {
            if rest.starts_with(MESSAGE) {
                return HeadScan::Complete(i, i + MESSAGE.len());
            }
            if rest.starts_with(START) && i == 0 {
                i += START.len();
                continue;
            }
            if rest.starts_with(CHANNEL) && !channel {
                channel = true;
                i += CHANNEL.len();
                continue;
            }
            if rest.starts_with(CONSTRAIN) && channel {
                i += CONSTRAIN.len();
                continue;
            }
            if MARKERS.iter().any(|m| m.len() > rest.len() && m.starts_with(rest)) {
                return HeadScan::Need;
            }
            return HeadScan::Invalid(i);
        }
        if rest == "<" {
            return HeadScan::Need;
        }
        let c = rest.chars().next().unwrap_or(' ');
        if !header_char(c) {
            return HeadScan::Invalid(i);
        }
        i += c.len_utf8();
    }
    HeadScan::Need
}

/// The first of `markers` in `text`: (byte, marker).
fn find_first(text: &str, markers: &[&'static str]) -> Option<(usize, &'static str)> {
    markers.iter().filter_map(|m| text.find(m).map(|p| (p, *m))).min_by_key(|&(p, m)| (p, std::cmp::Reverse(m.len())))
}

/// The length of the longest suffix of `text` that is a proper prefix of one of `markers`.
fn partial_any(text: &str, markers: &[&str]) -> usize {
    markers.iter().map(|m| crate::tools::partial_suffix(text, m)).max().unwrap_or(0)
}

/// How a text starting a reply may open a header without a marker: spaces, then `to=`.
fn to_prefix_state(buf: &str) -> Option<bool> {
    let t = buf.trim_start_matches(' ');
    if t.starts_with("to=") {
        Some(true)
    } else if "to=".starts_with(t) {
        None
    } else {
        Some(false)
    }
}

impl Lexer {
    pub fn new() -> Lexer {
        Lexer { state: State::Start, buf: String::new() }
    }

    /// Feeds text; returns what became certain.
    pub fn push(&mut self, text: &str) -> Vec<Lex> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        self.run(false, &mut out);
        out
    }

    /// Ends the text.
    pub fn finish(&mut self) -> Vec<Lex> {
        let mut out = Vec::new();
        self.run(true, &mut out);
        match self.state {
            State::Header if !self.buf.is_empty() => out.push(Lex::CutHeader(std::mem::take(&mut self.buf))),
            _ => {}
        }
        self.buf.clear();
        out
    }

    fn run(&mut self, eof: bool, out: &mut Vec<Lex>) {
        loop {
            let progressed = match self.state {
                State::Start => self.start_step(eof),
                State::Outside => self.outside_step(eof, out),
                State::Header => self.header_step(out),
                State::Body => self.body_step(eof, out),
            };
            if !progressed {
                return;
            }
        }
    }

    fn start_step(&mut self, eof: bool) -> bool {
        match to_prefix_state(&self.buf) {
            Some(true) => self.state = State::Header,
            None if !eof => return false,
            _ => self.state = State::Outside,
        }
        true
    }

    fn outside_step(&mut self, eof: bool, out: &mut Vec<Lex>) -> bool {
        if let Some((p, m)) = find_first(&self.buf, &OUTSIDE_STOPS) {
            let text: String = self.buf.drain(..p).collect();
            push_text(out, Lex::Outside(text));
            if m == START || m == CHANNEL {
                self.state = State::Header;
            } else {
                self.buf.drain(..m.len());
            }
            return true;
        }
        let hold = if eof { 0 } else { partial_any(&self.buf, &OUTSIDE_STOPS) };
        let text: String = self.buf.drain(..self.buf.len() - hold).collect();
        push_text(out, Lex::Outside(text));
        false
    }

    fn header_step(&mut self, out: &mut Vec<Lex>) -> bool {
        match scan_header(&self.buf) {
            HeadScan::Complete(text_end, end) => {
                let raw: String = self.buf.drain(..end).collect();
                let h = Header::parse(&raw[..text_end], raw.clone());
                out.push(Lex::Header(h));
                self.state = State::Body;
                true
            }
            HeadScan::Invalid(i) => {
                // Not a header: its text is outside any message; a marker that broke it is read again there.
                let i = i.max(self.buf.chars().next().map_or(0, char::len_utf8));
                let text: String = self.buf.drain(..i).collect();
                push_text(out, Lex::Outside(text));
                self.state = State::Outside;
                true
            }
            HeadScan::Need => false,
        }
    }

    fn body_step(&mut self, eof: bool, out: &mut Vec<Lex>) -> bool {
        if let Some((p, m)) = find_first(&self.buf, &BODY_STOPS) {
            let text: String = self.buf.drain(..p).collect();
            push_text(out, Lex::Body(text));
            if m == START || m == CHANNEL {
                out.push(Lex::End(String::new()));
                self.state = State::Header;
            } else {
                self.buf.drain(..m.len());
                out.push(Lex::End(m.to_string()));
                self.state = State::Outside;
            }
            return true;
        }
        let hold = if eof { 0 } else { partial_any(&self.buf, &BODY_STOPS) };
        let text: String = self.buf.drain(..self.buf.len() - hold).collect();
        push_text(out, Lex::Body(text));
        false
    }
}

/// Whether a chat template writes harmony (gpt-oss's): it frames messages with `<|channel|>` and `<|message|>`.
pub fn is_harmony_template(template: &str) -> bool {
    template.contains(CHANNEL) && template.contains(MESSAGE)
}

/// What the reasoning split does with the message being read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    /// Outside messages, or in a message whose framing is dropped and body is content (`final`, a
    /// `commentary` preamble, any other channel).
    Answer,
    /// In an `analysis` message: the body is reasoning.
    Analysis,
    /// In a message with a recipient (a tool call): passed on as received, for the tool-call parser.
    Raw,
}

/// The reasoning split of harmony replies ([`crate::ReasoningFormat::Harmony`]):
///
/// * The bodies of `analysis` messages (without a recipient) are reasoning, concatenated.
/// * The bodies of other messages without a recipient are content; their headers and end markers are dropped.
/// * Messages with a recipient (tool calls) are content as received, header and end marker included, so that
///   the tool-call parser after this one finds them; so is text outside messages (end markers aside).
/// * A text cut inside a header drops it, unless it already names a recipient (then it is content as received).
#[derive(Clone, Debug)]
pub(crate) struct HarmonyReasoning {
    lexer: Lexer,
    part: Part,
    /// An analysis message was opened.
    pub opened: bool,
    /// The last analysis message ended (with a marker or the next header).
    pub closed: bool,
}

/// One piece of the reasoning split: `true` for reasoning.
pub(crate) type Split = (bool, String);

impl HarmonyReasoning {
    pub fn new() -> HarmonyReasoning {
        HarmonyReasoning { lexer: Lexer::new(), part: Part::Answer, opened: false, closed: false }
    }

    pub fn in_reasoning(&self) -> bool {
        self.part == Part::Analysis
    }

    pub fn push(&mut self, text: &str) -> Vec<Split> {
        let lexed = self.lexer.push(text);
        self.route(lexed)
    }

    pub fn finish(&mut self) -> Vec<Split> {
        let lexed = self.lexer.finish();
        let out = self.route(lexed);
        self.part = Part::Answer;
        out
    }

    fn route(&mut self, lexed: Vec<Lex>) -> Vec<Split> {
        let mut out: Vec<Split> = Vec::new();
        let mut emit = |reasoning: bool, text: String| {
            if text.is_empty() {
                return;
            }
            match out.last_mut() {
                Some((r, last)) if *r == reasoning => last.push_str(&text),
                _ => out.push((reasoning, text)),
            }
        };
        for l in lexed {
            match l {
                Lex::Outside(s) => emit(false, s),
                Lex::Header(h) => {
                    self.part = if h.recipient.is_some() {
                        emit(false, h.raw);
                        Part::Raw
                    } else if h.channel == "analysis" {
                        self.opened = true;
                        self.closed = false;
                        Part::Analysis
                    } else {
                        Part::Answer
                    };
                }
                Lex::Body(s) => emit(self.part == Part::Analysis, s),
                Lex::End(m) => {
                    match self.part {
                        Part::Raw => emit(false, m),
                        Part::Analysis => self.closed = true,
                        Part::Answer => {}
                    }
                    self.part = Part::Answer;
                }
                Lex::CutHeader(raw) => {
                    if Header::parse_partial(&raw).recipient.is_some() {
                        emit(false, raw);
                    }
                }
            }
        }
        out
    }
}

/// Adds text to the output, merged with the previous piece of the same kind; empty text is not released.
fn push_text(out: &mut Vec<Lex>, piece: Lex) {
    match (&piece, out.last_mut()) {
        (Lex::Outside(s), _) | (Lex::Body(s), _) if s.is_empty() => {}
        (Lex::Outside(s), Some(Lex::Outside(last))) | (Lex::Body(s), Some(Lex::Body(last))) => last.push_str(s),
        _ => out.push(piece),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lex_all(pieces: &[&str]) -> Vec<Lex> {
        let mut l = Lexer::new();
        let mut out = Vec::new();
        for p in pieces {
            for e in l.push(p) {
                match (e, out.last_mut()) {
                    (Lex::Outside(s), Some(Lex::Outside(last))) | (Lex::Body(s), Some(Lex::Body(last))) => {
                        last.push_str(&s)
                    }
                    (e, _) => out.push(e),
                }
            }
        }
        for e in l.finish() {
            match (e, out.last_mut()) {
                (Lex::Outside(s), Some(Lex::Outside(last))) | (Lex::Body(s), Some(Lex::Body(last))) => {
                    last.push_str(&s)
                }
                (e, _) => out.push(e),
            }
        }
        out
    }

    #[test]
    fn headers_of_both_orders() {
        let h =
            Header::parse_partial("<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json");
        assert_eq!(
            (h.role.as_str(), h.channel.as_str(), h.recipient.as_deref(), h.content_type.as_deref()),
            ("assistant", "commentary", Some("functions.get_weather"), Some("json"))
        );
        let h = Header::parse_partial(" to=functions.f<|channel|>commentary json");
        assert_eq!(
            (h.role.as_str(), h.channel.as_str(), h.recipient.as_deref(), h.content_type.as_deref()),
            ("", "commentary", Some("functions.f"), Some("json"))
        );
    }

    #[test]
    fn lexes_a_reply_at_every_split() {
        let text =
            "<|channel|>analysis<|message|>Think <b>.<|end|><|start|>assistant<|channel|>final<|message|>Hi<|return|>";
        let whole = lex_all(&[text]);
        assert_eq!(whole.len(), 6, "{whole:?}");
        assert_eq!(whole[1], Lex::Body("Think <b>.".into()));
        assert_eq!(whole[2], Lex::End(END.into()));
        assert_eq!(whole[4], Lex::Body("Hi".into()));
        for i in 0..=text.len() {
            assert_eq!(lex_all(&[&text[..i], &text[i..]]), whole, "split at {i}");
        }
    }

    #[test]
    fn plain_text_is_outside() {
        assert_eq!(lex_all(&["Hello, world"]), vec![Lex::Outside("Hello, world".into())]);
        assert_eq!(lex_all(&["<|chan"]), vec![Lex::Outside("<|chan".into())]);
        assert_eq!(
            lex_all(&["<|channel|>final and more\nlines"]),
            vec![Lex::Outside("<|channel|>final and more\nlines".into())]
        );
    }
}
