//! Reasoning and tool calls in a reply, shared by every chat-style route (chat completions, Responses, and any
//! other handler that renders a chat template): the request's thinking controls, the constraint that enforces a
//! thinking budget, and the splitter that turns the reply's text into reasoning, content and tool calls.
//!
//! # API
//!
//! * [`ReasoningSetting`]: `serve --reasoning-parser auto|qwen3|deepseek_r1|harmony|mistral|none`;
//!   [`ReasoningSetting::resolve`] gives the parser a chat template calls for.
//! * [`ThinkingRequest`]: what a request asks of thinking: `enable_thinking` for the chat template and a budget
//!   in tokens. [`read_thinking`] reads the OpenAI fields (`reasoning_effort` on chat, `reasoning.effort` on
//!   Responses, the extension `thinking_budget` on both); another API fills the fields itself (Anthropic's
//!   `thinking: {"type": "enabled", "budget_tokens": N}` is `enable: Some(true), budget: Some(N)`).
//!   [`ThinkingRequest::template_vars`] merges `enable_thinking` and `reasoning_effort` under the request's
//!   `chat_template_kwargs`.
//! * [`ReplySetup::new`]: after the prompt is rendered, decides the reasoning parser of the reply (whether it
//!   starts inside thinking, from the rendered prompt) and the engine constraint: with a budget, or with an
//!   answer grammar (structured output, a forced tool call) while thinking may happen, a
//!   [`ThinkingBudget`] whose `.then(...)` is the answer grammar, so the grammar starts after `</think>`.
//! * [`ReplySplitter`]: fed the released text pieces of one reply (after stop strings) with
//!   [`ReplySplitter::push`], it runs the reasoning stream first and the tool parser on the content only,
//!   yielding [`ReplyEvent`]s in reply order: `Reasoning` text, `Content` text, `CallStart` / `CallArgs` (as
//!   [`ToolParser`] emits them). [`ReplySplitter::finish`] gives the last events and a [`ReplyEnd`]: the
//!   finished calls, whether the reply ended inside a call, and the whole split (reasoning, content). The events
//!   concatenate to the same split however the text was cut into pieces, so streamed and non-streamed replies
//!   agree. A route maps the events to its own shapes: chat `delta.reasoning_content` / `delta.content` /
//!   `delta.tool_calls`, Responses `reasoning` / `message` / `function_call` items, Anthropic `thinking` / `text`
//!   / `tool_use` blocks.
//! * [`shown_markers`]: the thinking markers the detokenizer must show (when they are control tokens), for
//!   `gen::Job::shown`; [`reasoning_tokens`]: how many generated tokens were thinking (for `usage`).
//!
//! Parsing never changes what the engine draws (DESIGN.md §8): the parser setting only decides what the client
//! sees; the budget and the grammar composition follow the model's reasoning format (the parser's, else the
//! template's) whatever the parser setting.

use crate::error::ApiError;
use crate::params::{kind, Fields};
use crate::AppState;
use serde_json::{Map, Value};
use std::sync::Arc;
use tf_core::ConstraintSpec;
use tf_grammar::ThinkingBudget;
use tf_text::{ReasoningEvent, ReasoningParser, ReasoningStream, ToolCall, ToolEvent, ToolFormat, ToolParser};

/// Which reasoning parser a server uses (`serve --reasoning-parser`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReasoningSetting {
    /// From the chat template: templates that write `<think>` get Qwen3's or DeepSeek-R1's parser, harmony
    /// templates (gpt-oss) harmony's.
    #[default]
    Auto,
    /// Never split: thinking stays in the content.
    Off,
    /// This parser, whatever the template.
    Parser(ReasoningParser),
}

impl ReasoningSetting {
    /// `auto`, `none`, `qwen3`, `deepseek_r1`, `harmony`, `mistral`.
    pub fn parse(s: &str) -> Result<ReasoningSetting, String> {
        match s {
            "auto" => Ok(ReasoningSetting::Auto),
            _ => match ReasoningParser::by_name(s) {
                Ok(None) => Ok(ReasoningSetting::Off),
                Ok(Some(p)) => Ok(ReasoningSetting::Parser(p)),
                Err(_) => Err(format!(
                    "unknown reasoning parser `{s}` (expected auto, qwen3, deepseek_r1, harmony, mistral or none)"
                )),
            },
        }
    }

    /// The parser replies are split with, for a model with this chat template.
    pub fn resolve(self, template: Option<&str>) -> Option<ReasoningParser> {
        match self {
            ReasoningSetting::Auto => template.and_then(ReasoningParser::from_template),
            ReasoningSetting::Off => None,
            ReasoningSetting::Parser(p) => Some(p),
        }
    }

    /// The reasoning format the model follows, for what the engine draws (budgets, grammars after thinking):
    /// the configured parser's, else the template's, whether or not replies are split.
    pub fn format_of(self, template: Option<&str>) -> Option<ReasoningParser> {
        match self {
            ReasoningSetting::Parser(p) => Some(p),
            ReasoningSetting::Auto | ReasoningSetting::Off => template.and_then(ReasoningParser::from_template),
        }
    }
}

/// Thinking budgets of the OpenAI efforts, in tokens.
pub const EFFORT_BUDGETS: [(&str, usize); 4] = [("minimal", 64), ("low", 256), ("medium", 1024), ("high", 4096)];

/// What a request asks of thinking.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ThinkingRequest {
    /// `enable_thinking` for the chat template (`None`: the template's default).
    pub enable: Option<bool>,
    /// The effort asked for (`minimal|low|medium|high`), passed to the template as `reasoning_effort` (gpt-oss's
    /// template writes it into its system message as `Reasoning: <effort>`).
    pub effort: Option<String>,
    /// Most thinking tokens (`None`: no budget).
    pub budget: Option<usize>,
    /// The request field the budget came from (named in errors).
    pub budget_param: Option<String>,
    /// Whether the budget was asked for explicitly (`thinking_budget`, Anthropic's `budget_tokens`), rather
    /// than implied by an effort: an explicit budget on a model without thinking tokens is a 400, an implied one
    /// is dropped.
    pub budget_explicit: bool,
}

/// Where the effort sits in a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EffortField {
    /// `reasoning_effort` (chat completions).
    ReasoningEffort,
    /// `reasoning: {"effort"}` (Responses).
    Reasoning,
}

/// Reads the effort (`minimal|low|medium|high` turn thinking on with [`EFFORT_BUDGETS`]; `none` or absent
/// leave the template's default) and `thinking_budget` (tokens, overriding the effort's budget).
pub fn read_thinking(f: &Fields<'_>, field: EffortField) -> Result<ThinkingRequest, ApiError> {
    let (effort, param) = match field {
        EffortField::ReasoningEffort => (f.str("reasoning_effort")?, "reasoning_effort"),
        EffortField::Reasoning => match f.get("reasoning") {
            None => (None, "reasoning.effort"),
            Some(Value::Object(o)) => match o.get("effort") {
                None | Some(Value::Null) => (None, "reasoning.effort"),
                Some(Value::String(s)) => (Some(s.as_str()), "reasoning.effort"),
                Some(v) => {
                    return Err(ApiError::field("reasoning.effort", format!("expected a string, got {}", kind(v))))
                }
            },
            Some(v) => return Err(ApiError::field("reasoning", format!("expected an object, got {}", kind(v)))),
        },
    };
    let mut t = ThinkingRequest::default();
    match effort {
        None | Some("none") => {}
        Some(e) => match EFFORT_BUDGETS.iter().find(|(n, _)| *n == e) {
            Some(&(_, budget)) => {
                t.enable = Some(true);
                t.effort = Some(e.to_string());
                t.budget = Some(budget);
                t.budget_param = Some(param.into());
            }
            None => {
                return Err(ApiError::field(
                    param,
                    format!("expected \"none\", \"minimal\", \"low\", \"medium\" or \"high\", got \"{e}\""),
                ))
            }
        },
    }
    if let Some(n) = f.int_in("thinking_budget", 0, u32::MAX as i64)? {
        t.budget = Some(n as usize);
        t.budget_param = Some("thinking_budget".into());
        t.budget_explicit = true;
    }
    Ok(t)
}

impl ThinkingRequest {
    /// The chat template's extra variables: `enable_thinking` and `reasoning_effort` when asked for, then the
    /// request's `chat_template_kwargs` (which win).
    pub fn template_vars(&self, kwargs: Map<String, Value>) -> Map<String, Value> {
        let mut vars = Map::new();
        if let Some(e) = self.enable {
            vars.insert("enable_thinking".into(), Value::Bool(e));
        }
        if let Some(e) = &self.effort {
            vars.insert("reasoning_effort".into(), Value::String(e.clone()));
        }
        vars.extend(kwargs);
        vars
    }
}

/// `chat_template_kwargs`: an object, or absent.
pub fn template_kwargs(f: &Fields<'_>) -> Result<Map<String, Value>, ApiError> {
    match f.get("chat_template_kwargs") {
        None => Ok(Map::new()),
        Some(Value::Object(m)) => Ok(m.clone()),
        Some(v) => Err(ApiError::field("chat_template_kwargs", format!("expected an object, got {}", kind(v)))),
    }
}

/// How one reply is parsed and constrained.
#[derive(Clone)]
pub struct ReplySetup {
    /// The reasoning parser of this reply (its start decided by the rendered prompt); `None`: no split.
    pub parser: Option<ReasoningParser>,
    /// The engine constraint: the answer grammar, wrapped in a thinking budget when one applies.
    pub constraint: Option<Arc<dyn ConstraintSpec>>,
    /// The `</think>` token (harmony: `<|end|>`), when it is one token (counts [`reasoning_tokens`]).
    pub think_end: Option<u32>,
    /// The reply ends with its first complete call (`parallel_tool_calls: false`): its tool parser keeps that
    /// call only ([`ToolParser::end_at_first_call`]) and generation stops there ([`ReplySetup::call_end`]).
    /// Set by the route after [`ReplySetup::new`].
    pub first_call_only: bool,
}

impl ReplySetup {
    /// Decides the parser and the constraint of a reply to the rendered prompt `rendered`, given the answer
    /// grammar `answer` (structured output or a forced tool call). When thinking may happen — the model has a
    /// reasoning format and the prompt does not end its thinking block (`enable_thinking=false`) — the
    /// constraint is a [`ThinkingBudget`] (of `thinking.budget` tokens, unlimited without one) followed by
    /// `answer`; otherwise `answer` as it is and no budget.
    pub fn new(
        st: &AppState,
        rendered: &str,
        thinking: &ThinkingRequest,
        answer: Option<Arc<dyn ConstraintSpec>>,
    ) -> Result<ReplySetup, ApiError> {
        let template = st.model.template.as_ref().map(|t| t.source());
        let setting = st.cfg.reasoning_parser;
        let parser = setting.resolve(template).map(|p| p.for_prompt(rendered));
        let tok = &st.model.tokenizer;
        let format = setting.format_of(template).map(|p| p.for_prompt(rendered));
        let think_end = tok.id_of(format.map_or(tf_text::THINK_END, |p| p.end_marker()));
        // Thinking may happen unless the prompt closed the block (Qwen3 with enable_thinking=false).
        let may_think = format.is_some_and(|p| p.starts_inside() || !closes_thinking(rendered, p.end_marker()));
        let param = thinking.budget_param.clone().unwrap_or_else(|| "thinking_budget".into());
        let unavailable = |why: String| {
            ApiError::field(&param, format!("a thinking budget is not available for this model: {why}"))
                .with_code("unsupported_thinking_budget")
        };
        let budget = match (may_think, thinking.budget) {
            (true, Some(n)) => Some(n),
            (true, None) if answer.is_some() => Some(usize::MAX),
            (false, Some(_)) if thinking.budget_explicit && format.is_none() => {
                return Err(unavailable("its chat template shows no thinking block".into()))
            }
            _ => None,
        };
        let plain = |answer| ReplySetup { parser, constraint: answer, think_end, first_call_only: false };
        let Some(n) = budget else { return Ok(plain(answer)) };
        let env = match st.grammar.as_ref() {
            Ok(env) => env,
            Err(why) if thinking.budget_explicit => return Err(unavailable(why.clone())),
            Err(_) => return Ok(plain(answer)),
        };
        let b = match ThinkingBudget::for_env(env, n) {
            Ok(b) => b,
            Err(e) if thinking.budget_explicit => return Err(unavailable(e.message)),
            Err(_) => return Ok(plain(answer)),
        };
        let starts_inside = format.is_some_and(|p| p.starts_inside());
        let mut b = b.starting_inside(starts_inside);
        if let Some(inner) = answer {
            b = b.then(inner);
        }
        Ok(plain(Some(Arc::new(b))))
    }

    /// `parser` as this reply takes calls: ending at the first one when [`ReplySetup::first_call_only`].
    pub fn tool_parser(&self, parser: ToolParser) -> ToolParser {
        if self.first_call_only {
            parser.end_at_first_call()
        } else {
            parser
        }
    }

    /// A splitter for this reply, with calls parsed in `tools` (when given).
    pub fn splitter(&self, tools: Option<ToolFormat>) -> ReplySplitter {
        ReplySplitter::new(self.parser, tools.map(|f| self.tool_parser(crate::tools::parser(f))))
    }

    /// Splits a whole reply ([`ReplySetup::splitter`] fed the text at once).
    pub fn split(&self, tools: Option<ToolFormat>, text: &str) -> ReplyEnd {
        split(self.parser, tools.map(|f| self.tool_parser(crate::tools::parser(f))), text)
    }

    /// What ends the reply at its first complete call on the engine thread, when it ends there (calls parsed
    /// in `tools` and [`ReplySetup::first_call_only`]).
    pub fn call_end(&self, tools: Option<ToolFormat>) -> Option<CallEnd> {
        tools.filter(|_| self.first_call_only).map(|format| CallEnd { reasoning: self.parser, format })
    }
}

/// Ends a reply at its first complete call (`parallel_tool_calls: false`). The generation's sink runs a
/// [`CallEnd::watcher`] on the engine thread over the same released text the route splits, and stops the
/// request once it has the call, so where the reply ends does not depend on timing, and the route's own
/// splitter (which keeps only that call) agrees with it streamed or not.
#[derive(Clone, Copy, Debug)]
pub struct CallEnd {
    reasoning: Option<ReasoningParser>,
    format: ToolFormat,
}

impl CallEnd {
    /// A splitter that reports [`ReplySplitter::ended`] once the reply's first call is complete.
    pub fn watcher(self) -> ReplySplitter {
        ReplySplitter::new(self.reasoning, Some(ToolParser::new(self.format, "").end_at_first_call()))
    }
}

/// Whether the rendered prompt ends (trailing whitespace aside) with the block's end marker (`</think>`).
fn closes_thinking(rendered: &str, end: &str) -> bool {
    rendered.trim_end().ends_with(end)
}

/// Thinking markers of the model's reasoning format that decoding would hide (control tokens in this vocabulary),
/// with their text: the splitter must see them, and with `--reasoning-parser none` they stay in the content as
/// text (harmony's framing would otherwise vanish from it).
pub fn shown_markers(st: &AppState) -> Vec<(u32, String)> {
    let template = st.model.template.as_ref().map(|t| t.source());
    let Some(p) = st.cfg.reasoning_parser.format_of(template) else { return Vec::new() };
    let tok = &st.model.tokenizer;
    p.markers()
        .iter()
        .filter_map(|m| {
            let id = tok.id_of(m)?;
            tok.token_kind(id).is_some_and(|k| k.is_special()).then(|| (id, m.to_string()))
        })
        .collect()
}

/// How many of a reply's generated `tokens` were thinking: up to and including the first `think_end` when the
/// block closed; every token but a final end-of-sequence one when the reply ended inside it; 0 without a block.
pub fn reasoning_tokens(tokens: &[u32], think_end: Option<u32>, end: &ReplyEnd, stop_ids: &[u32]) -> usize {
    if end.reasoning.is_none() {
        return 0;
    }
    if end.reasoning_closed {
        return think_end.and_then(|t| tokens.iter().position(|&x| x == t)).map_or(0, |i| i + 1);
    }
    match tokens.last() {
        Some(t) if stop_ids.contains(t) => tokens.len() - 1,
        _ => tokens.len(),
    }
}

/// One step of a split reply, in reply order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplyEvent {
    /// More thinking text (never empty).
    Reasoning(String),
    /// More answer text outside calls (never empty).
    Content(String),
    /// Call number `index` (from 0) begins; its name is known.
    CallStart { index: usize, id: String, name: String },
    /// More argument text of call `index`.
    CallArgs { index: usize, delta: String },
}

impl From<ToolEvent> for ReplyEvent {
    fn from(e: ToolEvent) -> ReplyEvent {
        match e {
            ToolEvent::Content(s) => ReplyEvent::Content(s),
            ToolEvent::CallStart { index, id, name } => ReplyEvent::CallStart { index, id, name },
            ToolEvent::CallArgs { index, delta } => ReplyEvent::CallArgs { index, delta },
        }
    }
}

/// The end of a split reply.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplyEnd {
    /// The last events (text held back until the end).
    pub events: Vec<ReplyEvent>,
    /// Every finished call, in order (a call cut by the token limit is left out).
    pub calls: Vec<ToolCall>,
    /// The reply ended inside a call.
    pub cut: bool,
    /// The whole thinking text; `None` when the reply had no thinking block (or is not split).
    pub reasoning: Option<String>,
    /// Whether the thinking block ended with `</think>`.
    pub reasoning_closed: bool,
    /// The whole answer text outside calls.
    pub content: String,
}

/// Splits one reply into reasoning, content and tool calls; see the module documentation.
pub struct ReplySplitter {
    reasoning: Option<ReasoningStream>,
    tools: Option<ToolParser>,
    reasoning_text: String,
    content_text: String,
}

impl ReplySplitter {
    /// A splitter with an optional reasoning parser and an optional tool-call parser (with neither, every piece
    /// is content).
    pub fn new(reasoning: Option<ReasoningParser>, tools: Option<ToolParser>) -> ReplySplitter {
        ReplySplitter {
            reasoning: reasoning.map(|p| p.stream()),
            tools,
            reasoning_text: String::new(),
            content_text: String::new(),
        }
    }

    /// Whether calls are parsed.
    pub fn parses_tools(&self) -> bool {
        self.tools.is_some()
    }

    /// Whether thinking is split out.
    pub fn parses_reasoning(&self) -> bool {
        self.reasoning.is_some()
    }

    /// Whether the reply is over: its tool parser keeps only the first call, and that call is complete. Text
    /// after it is dropped.
    pub fn ended(&self) -> bool {
        self.tools.as_ref().is_some_and(ToolParser::ended)
    }

    /// Takes the next released piece of the reply; returns the events it completes.
    pub fn push(&mut self, piece: &str) -> Vec<ReplyEvent> {
        let mut out = Vec::new();
        if self.ended() {
            return out;
        }
        match self.reasoning.as_mut() {
            Some(r) => {
                let evs = r.push(piece);
                self.route(evs, &mut out);
            }
            None => self.content(piece, &mut out),
        }
        out
    }

    /// Ends the reply.
    pub fn finish(&mut self) -> ReplyEnd {
        let mut events = Vec::new();
        let (opened, closed) = match self.reasoning.as_mut() {
            Some(r) => {
                let evs = r.finish();
                let oc = (r.opened(), r.closed());
                self.route(evs, &mut events);
                oc
            }
            None => (false, false),
        };
        let (calls, cut) = match self.tools.as_mut() {
            Some(p) => {
                let end = p.finish();
                for e in end.events {
                    let e = ReplyEvent::from(e);
                    if let ReplyEvent::Content(s) = &e {
                        self.content_text.push_str(s);
                    }
                    events.push(e);
                }
                (end.calls, end.cut)
            }
            None => (Vec::new(), false),
        };
        ReplyEnd {
            events,
            calls,
            cut,
            reasoning: opened.then(|| std::mem::take(&mut self.reasoning_text)),
            reasoning_closed: closed,
            content: std::mem::take(&mut self.content_text),
        }
    }

    fn route(&mut self, evs: Vec<ReasoningEvent>, out: &mut Vec<ReplyEvent>) {
        for e in evs {
            if self.ended() {
                return;
            }
            match e {
                ReasoningEvent::Reasoning(s) => {
                    self.reasoning_text.push_str(&s);
                    out.push(ReplyEvent::Reasoning(s));
                }
                ReasoningEvent::Content(s) => self.content(&s, out),
            }
        }
    }

    fn content(&mut self, text: &str, out: &mut Vec<ReplyEvent>) {
        match self.tools.as_mut() {
            Some(p) => {
                for e in p.push(text) {
                    let e = ReplyEvent::from(e);
                    if let ReplyEvent::Content(s) = &e {
                        self.content_text.push_str(s);
                    }
                    out.push(e);
                }
            }
            None if text.is_empty() => {}
            None => {
                self.content_text.push_str(text);
                out.push(ReplyEvent::Content(text.to_string()));
            }
        }
    }
}

/// Splits a whole reply at once (the same result as any pieces through a [`ReplySplitter`]).
pub fn split(reasoning: Option<ReasoningParser>, tools: Option<ToolParser>, text: &str) -> ReplyEnd {
    let mut s = ReplySplitter::new(reasoning, tools);
    let mut events = s.push(text);
    let mut end = s.finish();
    events.append(&mut end.events);
    end.events = events;
    end
}

#[cfg(test)]
mod tests {
    use super::*;
    use tf_text::ReasoningFormat;

    fn qwen3() -> Option<ReasoningParser> {
        Some(ReasoningParser::new(ReasoningFormat::Qwen3))
    }

    fn hermes() -> Option<ToolParser> {
        Some(ToolParser::new(ToolFormat::Hermes, "call_"))
    }

    /// (reasoning, content, calls as (name, streamed arguments), end) of `pieces`, with events merged by kind.
    fn run(
        reasoning: Option<ReasoningParser>,
        tools: Option<ToolParser>,
        pieces: &[&str],
    ) -> (String, String, Vec<(String, String)>, ReplyEnd) {
        let mut s = ReplySplitter::new(reasoning, tools);
        let mut events = Vec::new();
        for p in pieces {
            events.extend(s.push(p));
        }
        let end = s.finish();
        events.extend(end.events.clone());
        let (mut r, mut c, mut calls) = (String::new(), String::new(), Vec::<(String, String)>::new());
        let mut seen_content = false;
        for e in events {
            match e {
                ReplyEvent::Reasoning(x) => {
                    assert!(!seen_content && calls.is_empty(), "reasoning after the answer began");
                    assert!(!x.is_empty());
                    r.push_str(&x);
                }
                ReplyEvent::Content(x) => {
                    assert!(!x.is_empty());
                    seen_content = true;
                    c.push_str(&x);
                }
                ReplyEvent::CallStart { index, name, .. } => {
                    assert_eq!(index, calls.len());
                    calls.push((name, String::new()));
                }
                ReplyEvent::CallArgs { index, delta } => calls[index].1.push_str(&delta),
            }
        }
        (r, c, calls, end)
    }

    const REPLY: &str = "<think>\nThe user wants the weather. <tool_call> is how I call.\n</think>\n\nChecking.\n\
                         <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";

    #[test]
    fn reasoning_then_a_tool_call() {
        let (r, c, calls, end) = run(qwen3(), hermes(), &[REPLY]);
        assert_eq!(r, "The user wants the weather. <tool_call> is how I call.");
        assert_eq!(c, "Checking.");
        assert_eq!(calls, vec![("get_weather".to_string(), "{\"city\": \"Oslo\"}".to_string())]);
        assert_eq!(end.calls.len(), 1);
        assert_eq!(end.calls[0].arguments, "{\"city\": \"Oslo\"}");
        assert_eq!(end.reasoning.as_deref(), Some(r.as_str()));
        assert!(end.reasoning_closed && !end.cut);
        assert_eq!(end.content, c);
        let whole = split(qwen3(), hermes(), REPLY);
        assert_eq!((whole.reasoning, whole.content, whole.calls), (end.reasoning, end.content, end.calls));
    }

    #[test]
    fn split_at_every_byte_offset_equals_whole() {
        let texts = [
            REPLY,
            "<think>\n\n</think>\n\nplain answer",
            "  <think>cut inside thinking\n</thi",
            "no thinking <think> here",
            "<think>a</think><tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \
             \"arguments\": {\"x\": [1, 2]}}\n</tool_call>",
            "<think>é ü 漢字\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\"",
        ];
        for text in texts {
            for (r, t) in [(qwen3(), true), (qwen3(), false), (None, true), (None, false)] {
                let tools = || if t { hermes() } else { None };
                let whole = run(r, tools(), &[text]);
                for i in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
                    let two = run(r, tools(), &[&text[..i], &text[i..]]);
                    assert_eq!((&two.0, &two.1, &two.2), (&whole.0, &whole.1, &whole.2), "{text:?} split at {i}");
                    assert_eq!(
                        (&two.3.reasoning, &two.3.content, &two.3.calls, two.3.cut),
                        (&whole.3.reasoning, &whole.3.content, &whole.3.calls, whole.3.cut),
                        "{text:?} split at {i}"
                    );
                }
                let chars: Vec<String> = text.chars().map(String::from).collect();
                let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
                let each = run(r, tools(), &refs);
                assert_eq!((&each.0, &each.1, &each.2), (&whole.0, &whole.1, &whole.2), "{text:?} char by char");
                // The whole-text split and the event sums agree.
                assert_eq!(whole.3.reasoning.clone().unwrap_or_default(), whole.0);
                assert_eq!(whole.3.content, whole.1);
            }
        }
    }

    #[test]
    fn no_reasoning_parser_leaves_thinking_in_content() {
        let (r, c, _, end) = run(None, None, &["<think>\nhm\n</think>\n\nok"]);
        assert_eq!((r.as_str(), c.as_str(), end.reasoning), ("", "<think>\nhm\n</think>\n\nok", None));
        let cut = split(qwen3(), hermes(), "<think>\nstill thinking");
        assert_eq!((cut.reasoning.as_deref(), cut.reasoning_closed), (Some("still thinking"), false));
        let inside = split(Some(ReasoningParser::new(ReasoningFormat::DeepSeekR1)), None, "hm\n</think>\n\nok");
        assert_eq!((inside.reasoning.as_deref(), inside.content.as_str()), (Some("hm"), "ok"));
    }

    #[test]
    fn harmony_reasoning_then_a_call() {
        let reasoning = Some(ReasoningParser::new(ReasoningFormat::Harmony));
        let tools = || Some(ToolParser::new(ToolFormat::Harmony, "call_"));
        let text = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary \
                    to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}";
        let whole = run(reasoning, tools(), &[text]);
        assert_eq!((whole.0.as_str(), whole.1.as_str()), ("Need the weather.", ""));
        assert_eq!(whole.2, vec![("get_weather".to_string(), "{\"city\": \"Oslo\"}".to_string())]);
        assert!(whole.3.reasoning_closed && !whole.3.cut);
        for i in 0..=text.len() {
            let two = run(reasoning, tools(), &[&text[..i], &text[i..]]);
            assert_eq!((&two.0, &two.1, &two.2), (&whole.0, &whole.1, &whole.2), "split at {i}");
        }
        let answer = split(
            reasoning,
            tools(),
            "<|channel|>analysis<|message|>Sum.<|end|><|start|>assistant<|channel|>final<|message|>4",
        );
        assert_eq!((answer.reasoning.as_deref(), answer.content.as_str()), (Some("Sum."), "4"));
    }

    fn first_call_setup(first_call_only: bool) -> ReplySetup {
        ReplySetup { parser: qwen3(), constraint: None, think_end: None, first_call_only }
    }

    const TWO_CALLS: &str = "<think>\nTwo <tool_call> calls.\n</think>\n\nBoth.\n<tool_call>\n{\"name\": \"a\", \"arguments\": \
                             {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>\nAfter.";

    #[test]
    fn first_call_only_keeps_the_first_call_streamed_or_not() {
        let hermes_first = || Some(ToolParser::new(ToolFormat::Hermes, "call_").end_at_first_call());
        let whole = run(qwen3(), hermes_first(), &[TWO_CALLS]);
        assert_eq!((whole.0.as_str(), whole.1.as_str()), ("Two <tool_call> calls.", "Both."));
        assert_eq!(whole.2, vec![("a".to_string(), "{\"x\": 1}".to_string())]);
        assert_eq!((whole.3.calls.len(), whole.3.cut), (1, false));
        // Without the limit the reply has both calls and the text after them.
        let all = run(qwen3(), hermes(), &[TWO_CALLS]);
        assert_eq!((all.2.len(), all.1.as_str()), (2, "Both.After."));
        for i in (0..=TWO_CALLS.len()).filter(|&i| TWO_CALLS.is_char_boundary(i)) {
            let two = run(qwen3(), hermes_first(), &[&TWO_CALLS[..i], &TWO_CALLS[i..]]);
            assert_eq!((&two.0, &two.1, &two.2), (&whole.0, &whole.1, &whole.2), "split at {i}");
            assert_eq!((&two.3.calls, two.3.cut), (&whole.3.calls, whole.3.cut), "split at {i}");
        }
        // The route's splitter and whole-text split follow the setup.
        let setup = first_call_setup(true);
        let end = setup.split(Some(ToolFormat::Hermes), TWO_CALLS);
        assert_eq!((end.calls.len(), end.content.as_str()), (1, "Both."));
        let mut s = setup.splitter(Some(ToolFormat::Hermes));
        s.push(TWO_CALLS);
        assert!(s.ended());
        assert_eq!(first_call_setup(false).split(Some(ToolFormat::Hermes), TWO_CALLS).calls.len(), 2);
    }

    #[test]
    fn call_end_watcher_ends_at_the_first_complete_call() {
        assert!(first_call_setup(false).call_end(Some(ToolFormat::Hermes)).is_none());
        assert!(first_call_setup(true).call_end(None).is_none());
        let end = first_call_setup(true).call_end(Some(ToolFormat::Hermes)).unwrap();
        // Fed the reply piece by piece (as the sink feeds released text), it ends with the piece that closes the
        // first call's object, and not before: a `<tool_call>` inside the thinking is no call.
        let close = TWO_CALLS.find("{\"x\": 1}}").unwrap() + "{\"x\": 1}}".len();
        let mut w = end.watcher();
        let mut ended_at = None;
        for (i, c) in TWO_CALLS.char_indices() {
            w.push(&c.to_string());
            if w.ended() {
                ended_at = Some(i + c.len_utf8());
                break;
            }
        }
        assert_eq!(ended_at, Some(close));
        // Once ended, the rest of the text gives no events.
        assert!(w.push("<tool_call>\n{\"name\": \"c\", \"arguments\": {}}\n</tool_call>").is_empty());
        assert_eq!(w.finish().calls.len(), 1);
        // Mistral's named syntax and harmony end the same way.
        for (format, reasoning, text, after) in [
            (ToolFormat::Mistral, None, "[TOOL_CALLS]a[ARGS]{\"x\": {}}", "[TOOL_CALLS]b[ARGS]{}"),
            (
                ToolFormat::Harmony,
                Some(ReasoningParser::new(ReasoningFormat::Harmony)),
                "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>commentary to=functions.a \
                 <|constrain|>json<|message|>{\"x\": {}}",
                "<|call|>",
            ),
        ] {
            let setup = ReplySetup { parser: reasoning, constraint: None, think_end: None, first_call_only: true };
            let mut w = setup.call_end(Some(format)).unwrap().watcher();
            w.push(&text[..text.len() - 1]);
            assert!(!w.ended(), "{format:?}");
            w.push(&text[text.len() - 1..]);
            assert!(w.ended(), "{format:?}");
            assert!(w.push(after).is_empty());
        }
    }

    #[test]
    fn reasoning_token_counts() {
        let end = split(qwen3(), None, "<think>a b</think>c");
        assert_eq!(reasoning_tokens(&[5, 1, 2, 6, 3, 9], Some(6), &end, &[9]), 4);
        let open = split(qwen3(), None, "<think>a b");
        assert_eq!(reasoning_tokens(&[5, 1, 2, 9], Some(6), &open, &[9]), 3);
        let none = split(qwen3(), None, "c");
        assert_eq!(reasoning_tokens(&[3, 9], Some(6), &none, &[9]), 0);
    }

    #[test]
    fn settings_and_effort() {
        assert_eq!(ReasoningSetting::parse("none"), Ok(ReasoningSetting::Off));
        assert_eq!(ReasoningSetting::parse("auto"), Ok(ReasoningSetting::Auto));
        assert!(matches!(ReasoningSetting::parse("qwen3"), Ok(ReasoningSetting::Parser(_))));
        assert!(ReasoningSetting::parse("o1").is_err());
        let read = |body: Value, field| {
            let m = body.as_object().unwrap().clone();
            read_thinking(&Fields::new(&m), field)
        };
        use serde_json::json;
        let t = read(json!({"reasoning_effort": "low"}), EffortField::ReasoningEffort).unwrap();
        assert_eq!((t.enable, t.budget, t.budget_explicit), (Some(true), Some(256), false));
        assert_eq!(t.effort.as_deref(), Some("low"));
        let vars = t.template_vars(Map::new());
        assert_eq!(Value::Object(vars), json!({"enable_thinking": true, "reasoning_effort": "low"}));
        let t = read(json!({"reasoning": {"effort": "high"}, "thinking_budget": 7}), EffortField::Reasoning).unwrap();
        assert_eq!((t.enable, t.budget, t.budget_explicit), (Some(true), Some(7), true));
        let t = read(json!({"reasoning_effort": "none"}), EffortField::ReasoningEffort).unwrap();
        assert_eq!(t, ThinkingRequest::default());
        for (body, field, param) in [
            (json!({"reasoning_effort": "max"}), EffortField::ReasoningEffort, "reasoning_effort"),
            (json!({"reasoning": "high"}), EffortField::Reasoning, "reasoning"),
            (json!({"reasoning": {"effort": 3}}), EffortField::Reasoning, "reasoning.effort"),
            (json!({"thinking_budget": -1}), EffortField::Reasoning, "thinking_budget"),
        ] {
            assert_eq!(read(body, field).unwrap_err().param.as_deref(), Some(param));
        }
        let vars = ThinkingRequest { enable: Some(true), ..Default::default() }
            .template_vars(json!({"enable_thinking": false, "x": 1}).as_object().unwrap().clone());
        assert_eq!(Value::Object(vars), json!({"enable_thinking": false, "x": 1}));
    }
}
