//! The output items of a response (`reasoning`, `message` and `function_call`), built from the reply's
//! [`ReplyEvent`]s, with the stream events each step sends. A whole reply goes through the same steps with
//! the events ignored, so the streamed and non-streamed outputs are the same items.

use crate::new_id;
use crate::reply::ReplyEvent;
use crate::responses::message;
use serde_json::{json, Value};
use tf_text::ToolCall;

/// Sends one stream event (type, payload).
pub type Emit<'a> = &'a mut dyn FnMut(&str, Value);

#[derive(Clone, Debug)]
enum Item {
    Reasoning { id: String, text: String, status: &'static str },
    Message { id: String, text: String },
    Call { id: String, call_id: String, name: String, arguments: String, complete: bool },
}

/// The items so far; the last one may still be open.
#[derive(Debug)]
pub struct Items {
    first_msg_id: Option<String>,
    items: Vec<Item>,
    open: bool,
}

fn part(t: &str) -> Value {
    json!({"type": "output_text", "text": t, "annotations": [], "logprobs": []})
}

fn reasoning_part(t: &str) -> Value {
    json!({"type": "reasoning_text", "text": t})
}

/// A reasoning output item (`text` None: no content yet).
pub fn reasoning_item(id: &str, status: &str, text: Option<&str>) -> Value {
    let content = match text {
        None => json!([]),
        Some(t) => json!([reasoning_part(t)]),
    };
    json!({"type": "reasoning", "id": id, "summary": [], "content": content, "encrypted_content": null,
           "status": status})
}

fn call_item(id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": arguments,
           "status": status})
}

impl Items {
    /// The first message item gets `msg_id`; later ones get fresh ids.
    pub fn new(msg_id: String) -> Items {
        Items { first_msg_id: Some(msg_id), items: Vec::new(), open: false }
    }

    /// Opens a message item (a reply without tool parsing has one from the start, even if empty).
    pub fn open_message(&mut self, emit: Emit<'_>) {
        self.close("completed", emit);
        let id = self.first_msg_id.take().unwrap_or_else(|| new_id("msg_"));
        let index = self.items.len();
        emit("response.output_item.added", json!({"output_index": index, "item": message(&id, "in_progress", None)}));
        emit(
            "response.content_part.added",
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": part("")}),
        );
        self.items.push(Item::Message { id, text: String::new() });
        self.open = true;
    }

    /// Reply text outside calls.
    pub fn content(&mut self, text: &str, emit: Emit<'_>) {
        if text.is_empty() {
            return;
        }
        if !(self.open && matches!(self.items.last(), Some(Item::Message { .. }))) {
            self.open_message(emit);
        }
        let index = self.items.len() - 1;
        if let Some(Item::Message { id, text: t }) = self.items.last_mut() {
            t.push_str(text);
            emit(
                "response.output_text.delta",
                json!({"item_id": id, "output_index": index, "content_index": 0, "delta": text, "logprobs": []}),
            );
        }
    }

    /// Thinking text: opens a reasoning item (the first item of a reply that thinks) or extends it.
    pub fn reasoning(&mut self, text: &str, emit: Emit<'_>) {
        if text.is_empty() {
            return;
        }
        if !(self.open && matches!(self.items.last(), Some(Item::Reasoning { .. }))) {
            self.close("completed", emit);
            let id = new_id("rs_");
            let index = self.items.len();
            emit(
                "response.output_item.added",
                json!({"output_index": index, "item": reasoning_item(&id, "in_progress", None)}),
            );
            emit(
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0, "part": reasoning_part("")}),
            );
            self.items.push(Item::Reasoning { id, text: String::new(), status: "completed" });
            self.open = true;
        }
        let index = self.items.len() - 1;
        if let Some(Item::Reasoning { id, text: t, .. }) = self.items.last_mut() {
            t.push_str(text);
            emit(
                "response.reasoning_text.delta",
                json!({"item_id": id, "output_index": index, "content_index": 0, "delta": text}),
            );
        }
    }

    /// One event of the reply splitter.
    pub fn event(&mut self, ev: ReplyEvent, emit: Emit<'_>) {
        match ev {
            ReplyEvent::Reasoning(s) => self.reasoning(&s, emit),
            ReplyEvent::Content(s) => self.content(&s, emit),
            ReplyEvent::CallStart { id: call_id, name, .. } => {
                self.close("completed", emit);
                let id = new_id("fc_");
                let index = self.items.len();
                emit(
                    "response.output_item.added",
                    json!({"output_index": index, "item": call_item(&id, &call_id, &name, "", "in_progress")}),
                );
                self.items.push(Item::Call { id, call_id, name, arguments: String::new(), complete: false });
                self.open = true;
            }
            ReplyEvent::CallArgs { delta, .. } => {
                let index = self.items.len().saturating_sub(1);
                if let Some(Item::Call { id, arguments, .. }) = self.items.last_mut() {
                    arguments.push_str(&delta);
                    emit(
                        "response.function_call_arguments.delta",
                        json!({"item_id": id, "output_index": index, "delta": delta}),
                    );
                }
            }
        }
    }

    /// Closes the open item: a message with `status`; a call `completed`, or `incomplete` when it is not among
    /// the finished calls.
    fn close(&mut self, status: &str, emit: Emit<'_>) {
        if !self.open {
            return;
        }
        self.open = false;
        let index = self.items.len() - 1;
        match &mut self.items[index] {
            Item::Reasoning { id, text, status: st } => {
                *st = if status == "incomplete" { "incomplete" } else { "completed" };
                emit(
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
                );
                emit(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "part": reasoning_part(text)}),
                );
                emit(
                    "response.output_item.done",
                    json!({"output_index": index, "item": reasoning_item(id, st, Some(text))}),
                );
            }
            Item::Message { id, text } => {
                emit(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
                );
                emit(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "part": part(text)}),
                );
                emit(
                    "response.output_item.done",
                    json!({"output_index": index, "item": message(id, status, Some(text))}),
                );
            }
            Item::Call { id, call_id, name, arguments, complete } => {
                let status = if *complete { "completed" } else { "incomplete" };
                emit(
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": index, "arguments": arguments}),
                );
                emit(
                    "response.output_item.done",
                    json!({"output_index": index, "item": call_item(id, call_id, name, arguments, status)}),
                );
            }
        }
    }

    /// The end of the reply: `calls` are the finished calls (a call cut by the token limit is not among them);
    /// `status` is the last message's. A reply with no finished item gets an empty message.
    pub fn finish(&mut self, calls: &[ToolCall], status: &str, emit: Emit<'_>) {
        for it in &mut self.items {
            if let Item::Call { call_id, complete, .. } = it {
                *complete = calls.iter().any(|c| &c.id == call_id);
            }
        }
        self.close(status, emit);
        if !self.items.iter().any(|it| matches!(it, Item::Message { .. } | Item::Call { complete: true, .. })) {
            self.open_message(emit);
            self.close(status, emit);
        }
    }

    /// The finished items (calls cut short left out); `status` as in [`Items::finish`].
    pub fn output(&self, status: &str) -> Vec<Value> {
        self.items
            .iter()
            .filter_map(|it| match it {
                Item::Reasoning { id, text, status } => Some(reasoning_item(id, status, Some(text))),
                Item::Message { id, text } => Some(message(id, status, Some(text))),
                Item::Call { id, call_id, name, arguments, complete: true } => {
                    Some(call_item(id, call_id, name, arguments, "completed"))
                }
                Item::Call { .. } => None,
            })
            .collect()
    }

    /// The reply as a chat message for the stored conversation (content null when it is only calls; its
    /// thinking as `reasoning_content`).
    pub fn assistant_message(&self) -> Value {
        let reasoning = self.items.iter().find_map(|it| match it {
            Item::Reasoning { text, .. } => Some(text.clone()),
            _ => None,
        });
        let text: String = self
            .items
            .iter()
            .filter_map(|it| match it {
                Item::Message { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        let calls: Vec<Value> = self
            .items
            .iter()
            .filter_map(|it| match it {
                Item::Call { call_id, name, arguments, complete: true, .. } => {
                    Some(json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}))
                }
                _ => None,
            })
            .collect();
        let mut m = if calls.is_empty() {
            json!({"role": "assistant", "content": text})
        } else {
            let content = if text.is_empty() { Value::Null } else { Value::String(text) };
            json!({"role": "assistant", "content": content, "tool_calls": calls})
        };
        if let Some(r) = reasoning {
            m["reasoning_content"] = Value::String(r);
        }
        m
    }

    /// Whether any call finished.
    pub fn has_calls(&self) -> bool {
        self.items.iter().any(|it| matches!(it, Item::Call { complete: true, .. }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reply::ReplySplitter;
    use tf_text::{ReasoningFormat, ReasoningParser, ToolFormat};

    /// Runs `text` through a splitter in `pieces`, returning (event types, final output).
    fn run(pieces: &[&str]) -> (Vec<String>, Vec<Value>, Value) {
        run_with(None, pieces)
    }

    fn run_with(reasoning: Option<ReasoningParser>, pieces: &[&str]) -> (Vec<String>, Vec<Value>, Value) {
        let mut events = Vec::new();
        let mut emit = |ty: &str, _v: Value| events.push(ty.to_string());
        let mut items = Items::new("msg_1".into());
        let mut p = ReplySplitter::new(reasoning, Some(tf_text::ToolParser::new(ToolFormat::Hermes, "call_")));
        for piece in pieces {
            for ev in p.push(piece) {
                items.event(ev, &mut emit);
            }
        }
        let end = p.finish();
        for ev in end.events {
            items.event(ev, &mut emit);
        }
        items.finish(&end.calls, "completed", &mut emit);
        let out = items.output("completed");
        let msg = items.assistant_message();
        (events, out, msg)
    }

    #[test]
    fn items_follow_the_reply() {
        let text = "Checking.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
        let (events, out, msg) = run(&[text]);
        assert_eq!(
            events,
            [
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
            ]
        );
        assert_eq!(out.len(), 2);
        assert_eq!(out[0]["content"][0]["text"], "Checking.");
        assert_eq!((out[1]["type"].as_str(), out[1]["name"].as_str()), (Some("function_call"), Some("f")));
        assert_eq!((out[1]["arguments"].as_str(), out[1]["call_id"].as_str()), (Some("{\"a\": 1}"), Some("call_0")));
        assert_eq!(msg["tool_calls"][0]["function"]["arguments"], "{\"a\": 1}");
        let split: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = split.iter().map(String::as_str).collect();
        let (_, out2, _) = run(&refs);
        let strip = |v: &[Value]| -> Vec<Value> {
            v.iter().map(|x| json!([x["type"], x["name"], x["arguments"], x["content"]])).collect()
        };
        assert_eq!(strip(&out), strip(&out2));
    }

    #[test]
    fn a_cut_call_is_left_out_and_an_empty_reply_has_a_message() {
        let (events, out, _) = run(&["<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\""]);
        assert_eq!(events.last().map(String::as_str), Some("response.output_item.done"));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0]["type"], "message");
        let (_, out, msg) = run(&[""]);
        assert_eq!((out.len(), msg["content"].as_str()), (1, Some("")));
    }

    #[test]
    fn a_reasoning_item_comes_first() {
        let text =
            "<think>\nhm\n</think>\n\nChecking.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
        let (events, out, msg) = run_with(Some(ReasoningParser::new(ReasoningFormat::Qwen3)), &[text]);
        assert_eq!(
            events[..6],
            [
                "response.output_item.added",
                "response.content_part.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.content_part.done",
                "response.output_item.done",
            ]
        );
        let types: Vec<&str> = out.iter().map(|x| x["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["reasoning", "message", "function_call"]);
        assert_eq!(out[0]["content"], json!([{"type": "reasoning_text", "text": "hm"}]));
        assert_eq!((out[0]["summary"].clone(), out[0]["status"].as_str()), (json!([]), Some("completed")));
        assert_eq!(out[1]["content"][0]["text"], "Checking.");
        assert_eq!((msg["reasoning_content"].as_str(), msg["content"].as_str()), (Some("hm"), Some("Checking.")));
        // Cut inside thinking: the reasoning item is incomplete, and an empty message follows.
        let mut events = Vec::new();
        let mut emit = |ty: &str, v: Value| events.push((ty.to_string(), v));
        let mut items = Items::new("msg_1".into());
        let mut p = ReplySplitter::new(Some(ReasoningParser::new(ReasoningFormat::Qwen3)), None);
        for ev in p.push("<think>still") {
            items.event(ev, &mut emit);
        }
        let end = p.finish();
        for ev in end.events {
            items.event(ev, &mut emit);
        }
        items.finish(&end.calls, "incomplete", &mut emit);
        let out = items.output("incomplete");
        assert_eq!(out.len(), 2);
        assert_eq!(
            (out[0]["status"].as_str(), out[0]["content"][0]["text"].as_str()),
            (Some("incomplete"), Some("still"))
        );
        assert_eq!(out[1]["type"], "message");
    }
}
