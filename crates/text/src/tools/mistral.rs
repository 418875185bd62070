//! Mistral's call syntax of tokenizer v11 and later (Mistral Small 3.2, Magistral, Devstral): each call is
//! `[TOOL_CALLS]NAME[ARGS]{...}`, where templates that render earlier calls with their ids write
//! `[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}`; several calls follow one another, each behind its own
//! `[TOOL_CALLS]`. The older syntax, `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`, is the JSON-object
//! scanner's; what follows a `[TOOL_CALLS]` (after whitespace) decides: `[` or `{` is the older syntax, anything
//! else a name.
//!
//! * The name runs to `[ARGS]` or `[CALL_ID]` (or straight to the `{` of the arguments, as a reply decoded
//!   without its control tokens reads); it is non-empty and holds no whitespace, quotes, brackets or commas.
//! * The call is announced when its arguments start: the first `{` after `[ARGS]` (whitespace between is
//!   dropped). The arguments are that JSON object, streamed as it is generated; its closing brace completes the
//!   call.
//! * Text that breaks this before the arguments start (a name with a space in it, `[ARGS]` followed by
//!   anything but an object) is content, `[TOOL_CALLS]` included.

use super::{is_ws, Fed, ToolCall, ToolEvent, ValueScan};

/// The marker between a call's name (or id) and its arguments.
pub(super) const ARGS: &str = "[ARGS]";
/// The marker between a call's name and its id.
pub(super) const CALL_ID: &str = "[CALL_ID]";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    Name,
    Id,
    /// After `[ARGS]`, before the arguments' `{`.
    BeforeArgs,
    Args,
}

/// One call in the named syntax being read.
#[derive(Debug)]
pub(super) struct NamedScan {
    /// Everything consumed for this call (marker included), released as content if it breaks before its
    /// arguments start.
    pub raw: String,
    part: Part,
    pub name: String,
    /// The part of `[ARGS]` or `[CALL_ID]` read so far.
    marker: String,
    val: ValueScan,
    pub args: String,
    pub index: Option<usize>,
    /// Bytes of the arguments already sent.
    pub sent: usize,
}

/// What one character did.
pub(super) enum NamedStep {
    Took,
    /// The arguments started: the call is announced.
    Started,
    /// The arguments' object closed: the call is complete.
    Done,
    /// Not a call.
    Bad,
}

fn name_char(c: char) -> bool {
    !(is_ws(c) || c.is_control() || matches!(c, '[' | ']' | '{' | '}' | '"' | '\'' | ','))
}

impl NamedScan {
    pub fn new(raw: String) -> NamedScan {
        NamedScan {
            raw,
            part: Part::Name,
            name: String::new(),
            marker: String::new(),
            val: ValueScan::default(),
            args: String::new(),
            index: None,
            sent: 0,
        }
    }

    pub fn feed(&mut self, c: char) -> NamedStep {
        if self.index.is_none() {
            self.raw.push(c);
        }
        if !self.marker.is_empty() || (c == '[' && matches!(self.part, Part::Name | Part::Id)) {
            return self.marker_char(c);
        }
        match self.part {
            Part::Name if c == '{' && !self.name.is_empty() => self.start_args(),
            Part::Name if name_char(c) => {
                self.name.push(c);
                NamedStep::Took
            }
            Part::Id if c.is_ascii_alphanumeric() => NamedStep::Took,
            Part::BeforeArgs if is_ws(c) => NamedStep::Took,
            Part::BeforeArgs if c == '{' => self.start_args(),
            Part::Args => match self.val.feed(c) {
                Fed::Part => {
                    self.args.push(c);
                    NamedStep::Took
                }
                Fed::Last => {
                    self.args.push(c);
                    NamedStep::Done
                }
                Fed::Before | Fed::Bad => NamedStep::Bad,
            },
            _ => NamedStep::Bad,
        }
    }

    fn marker_char(&mut self, c: char) -> NamedStep {
        self.marker.push(c);
        let m = self.marker.as_str();
        let named = !self.name.is_empty();
        match self.part {
            Part::Name if named && m == ARGS => self.part = Part::BeforeArgs,
            Part::Name if named && m == CALL_ID => self.part = Part::Id,
            Part::Id if m == ARGS => self.part = Part::BeforeArgs,
            Part::Name if named && (ARGS.starts_with(m) || CALL_ID.starts_with(m)) => return NamedStep::Took,
            Part::Id if ARGS.starts_with(m) => return NamedStep::Took,
            _ => return NamedStep::Bad,
        }
        self.marker.clear();
        NamedStep::Took
    }

    fn start_args(&mut self) -> NamedStep {
        self.val = ValueScan::default();
        self.val.feed('{');
        self.args.push('{');
        self.part = Part::Args;
        NamedStep::Started
    }
}

impl super::ToolParser {
    /// Feeds the named-syntax scanner from the buffer until it needs more text or the call ends.
    pub(super) fn named_step(&mut self) -> bool {
        let super::Mode::Named(scan) = &mut self.mode else { return false };
        let mut taken = 0;
        let mut outcome = None;
        let mut start = None;
        for c in self.buf.chars() {
            taken += c.len_utf8();
            match scan.feed(c) {
                NamedStep::Took => {}
                NamedStep::Started => {
                    scan.index = Some(self.started);
                    start = Some((self.started, scan.name.clone()));
                }
                NamedStep::Done => {
                    outcome = Some(true);
                    break;
                }
                NamedStep::Bad => {
                    outcome = Some(false);
                    break;
                }
            }
        }
        self.buf.drain(..taken);
        if let Some((index, name)) = start {
            self.started += 1;
            let id = format!("{}{index}", self.id_prefix);
            self.events.push(ToolEvent::CallStart { index, id, name });
        }
        let Some(ok) = outcome else { return false };
        self.flush_named_args();
        let super::Mode::Named(scan) = std::mem::replace(&mut self.mode, super::Mode::Text) else { return false };
        match (ok, scan.index) {
            (true, Some(index)) => {
                let id = format!("{}{index}", self.id_prefix);
                self.calls.push(ToolCall { id, name: scan.name, arguments: scan.args });
                self.after_call = true;
                self.at_start = false;
                self.mode = super::Mode::After { in_array: false };
            }
            // Broken before the arguments started (an object cannot break once it has): content.
            _ => self.content(&scan.raw),
        }
        true
    }

    /// Sends argument text not yet sent for the named-syntax call being read.
    pub(super) fn flush_named_args(&mut self) {
        let super::Mode::Named(scan) = &mut self.mode else { return };
        let Some(index) = scan.index else { return };
        if scan.args.len() > scan.sent {
            let delta = scan.args[scan.sent..].to_string();
            scan.sent = scan.args.len();
            self.events.push(ToolEvent::CallArgs { index, delta });
        }
    }
}
