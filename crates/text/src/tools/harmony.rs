//! Tool calls in harmony replies (gpt-oss): a message with a recipient (`to=functions.NAME`) is a call of `NAME`
//! whose body is the JSON arguments. Every other message, and text outside messages, is content as it was
//! received (framing included: taking reasoning and the answer's framing out is the harmony reasoning parser's
//! part, which runs first when it is on).
//!
//! * A call is announced ([`ToolEvent::CallStart`]) when its body starts (after whitespace) with `{`; the
//!   arguments stream as [`ToolEvent::CallArgs`] to the end of that JSON object, which completes the call. Body
//!   text after the object is dropped with the call's end marker (`<|call|>`, `<|end|>`).
//! * A recipient message whose body does not start with `{` is no call: the message is content, header and end
//!   marker included.
//! * A message that ends (end marker or next header) before its object closes ends the call with the arguments
//!   already sent; a text that ends there (cut by `max_tokens`) leaves the call out of [`ToolsEnd::calls`] and
//!   sets [`ToolsEnd::cut`], as does a text cut inside the header of a call.
//! * A reply usually ends right after a call's object: `<|call|>` is a stop token of gpt-oss and is not part of
//!   the text; such a call is complete.
//! * The recipient names the function: `functions.` is removed from it.

use super::{Fed, ToolCall, ToolEvent, ToolsEnd, ValueScan};
use crate::harmony::{Header, Lex, Lexer};

#[derive(Debug)]
enum Msg {
    /// Outside messages, or in a message that is content.
    Content,
    /// A recipient message before its body starts: its raw text so far.
    Pending { raw: String, name: String },
    /// In a call's arguments: its index and name, the scanner, the arguments so far and the bytes sent.
    Args { index: usize, name: String, scan: ValueScan, args: String, sent: usize },
    /// After a call's object, to the end of its message.
    Done,
}

/// The harmony part of a [`super::ToolParser`].
#[derive(Debug)]
pub(super) struct HarmonyCalls {
    lexer: Lexer,
    id_prefix: String,
    msg: Msg,
    events: Vec<ToolEvent>,
    calls: Vec<ToolCall>,
    started: usize,
    cut: bool,
    /// Most calls kept; the text after the last of them is dropped.
    pub max_calls: usize,
}

impl HarmonyCalls {
    pub fn new(id_prefix: &str) -> HarmonyCalls {
        HarmonyCalls {
            lexer: Lexer::new(),
            id_prefix: id_prefix.to_string(),
            msg: Msg::Content,
            events: Vec::new(),
            calls: Vec::new(),
            started: 0,
            cut: false,
            max_calls: usize::MAX,
        }
    }

    /// Whether the calls kept are all there.
    pub fn ended(&self) -> bool {
        self.calls.len() >= self.max_calls
    }

    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        if self.ended() {
            return Vec::new();
        }
        for l in self.lexer.push(text) {
            if self.ended() {
                break;
            }
            self.take(l);
        }
        self.flush_args();
        std::mem::take(&mut self.events)
    }

    pub fn finish(&mut self) -> ToolsEnd {
        if !self.ended() {
            for l in self.lexer.finish() {
                if self.ended() {
                    break;
                }
                self.take(l);
            }
        }
        self.flush_args();
        match std::mem::replace(&mut self.msg, Msg::Content) {
            Msg::Pending { .. } | Msg::Args { .. } => self.cut = true,
            Msg::Done | Msg::Content => {}
        }
        ToolsEnd { events: std::mem::take(&mut self.events), calls: std::mem::take(&mut self.calls), cut: self.cut }
    }

    fn content(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        if let Some(ToolEvent::Content(last)) = self.events.last_mut() {
            last.push_str(text);
        } else {
            self.events.push(ToolEvent::Content(text.to_string()));
        }
    }

    fn take(&mut self, l: Lex) {
        match l {
            Lex::Outside(s) => self.content(&s),
            Lex::Header(h) => self.header(h),
            Lex::Body(s) => self.body(&s),
            Lex::End(marker) => self.end(&marker),
            Lex::CutHeader(raw) => {
                if Header::parse_partial(&raw).recipient.is_some() {
                    self.cut = true;
                } else {
                    self.content(&raw);
                }
            }
        }
    }

    fn header(&mut self, h: Header) {
        match h.recipient {
            Some(r) => {
                let name = r.strip_prefix("functions.").unwrap_or(&r).to_string();
                self.msg = Msg::Pending { raw: h.raw, name };
            }
            None => {
                self.msg = Msg::Content;
                self.content(&h.raw);
            }
        }
    }

    fn body(&mut self, text: &str) {
        let mut rest = text;
        while !rest.is_empty() {
            match &mut self.msg {
                Msg::Content => {
                    self.content(rest);
                    return;
                }
                Msg::Done => return,
                Msg::Pending { raw, name } => {
                    let ws = rest.len() - super::trim_ws_start(rest).len();
                    raw.push_str(&rest[..ws]);
                    rest = &rest[ws..];
                    if rest.is_empty() {
                        return;
                    }
                    if !rest.starts_with('{') {
                        let raw = std::mem::take(raw);
                        self.msg = Msg::Content;
                        self.content(&raw);
                        continue;
                    }
                    let index = self.started;
                    self.started += 1;
                    let id = format!("{}{index}", self.id_prefix);
                    let name = std::mem::take(name);
                    self.events.push(ToolEvent::CallStart { index, id, name: name.clone() });
                    self.msg = Msg::Args { index, name, scan: ValueScan::default(), args: String::new(), sent: 0 };
                }
                Msg::Args { scan, args, .. } => {
                    let mut done = None;
                    for (i, c) in rest.char_indices() {
                        args.push(c);
                        if let Fed::Last = scan.feed(c) {
                            done = Some(i + c.len_utf8());
                            break;
                        }
                    }
                    match done {
                        Some(n) => {
                            self.complete_call();
                            rest = &rest[n..];
                        }
                        None => return,
                    }
                }
            }
        }
    }

    fn end(&mut self, marker: &str) {
        match std::mem::replace(&mut self.msg, Msg::Content) {
            Msg::Content => self.content(marker),
            Msg::Pending { raw, .. } => {
                self.content(&raw);
                self.content(marker);
            }
            args @ Msg::Args { .. } => {
                self.msg = args;
                self.complete_call();
                self.msg = Msg::Content;
            }
            Msg::Done => {}
        }
    }

    /// Sends the argument text not yet sent.
    fn flush_args(&mut self) {
        if let Msg::Args { index, args, sent, .. } = &mut self.msg {
            if args.len() > *sent {
                self.events.push(ToolEvent::CallArgs { index: *index, delta: args[*sent..].to_string() });
                *sent = args.len();
            }
        }
    }

    /// The call being read is complete (its arguments as received so far).
    fn complete_call(&mut self) {
        self.flush_args();
        let Msg::Args { index, name, args, .. } = std::mem::replace(&mut self.msg, Msg::Done) else { return };
        self.calls.push(ToolCall { id: format!("{}{index}", self.id_prefix), name, arguments: args });
    }
}
