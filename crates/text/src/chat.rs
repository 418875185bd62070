//! Chat templates: HF-style Jinja templates rendered with `minijinja`, configured to behave like the
//! Jinja2 sandbox `transformers` renders them in (`trim_blocks`, `lstrip_blocks`, loop controls, Python
//! string/dict/list methods, `raise_exception`, `strftime_now`, a `json.dumps`-compatible `tojson`, and
//! Python's printing of `None`/`True`/dicts).

use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Output, State, Value};
use serde_json::Value as Json;

use crate::pyfmt::{self, DumpOptions};
use crate::{Result, TextError};

const TEMPLATE_NAME: &str = "chat_template";
/// Prefix that marks an error raised by the template itself through `raise_exception`.
const RAISE_MARK: &str = "\u{1}raise_exception\u{1}";

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("source_len", &self.source.len()).finish()
    }
}

/// Variables for one rendering besides `messages`.
#[derive(Debug, Clone, Default)]
pub struct ChatRenderOptions {
    /// `add_generation_prompt`: end with the header of an assistant turn.
    pub add_generation_prompt: bool,
    /// `tools`: a list of tool definitions; `None` renders as Python `None`.
    pub tools: Option<Json>,
    /// `documents` (RAG templates); `None` renders as Python `None`.
    pub documents: Option<Json>,
    /// `bos_token`, left undefined when `None` (as `transformers` does for tokenizers without one).
    pub bos_token: Option<String>,
    /// `eos_token`, left undefined when `None`.
    pub eos_token: Option<String>,
    /// `enable_thinking`, only defined when given.
    pub enable_thinking: Option<bool>,
    /// Any further template variables (`chat_template_kwargs`); they override `bos_token`/`eos_token`
    /// but not `messages`, `tools`, `documents` or `add_generation_prompt`.
    pub extra: serde_json::Map<String, Json>,
}

impl ChatTemplate {
    /// Compiles a template. Errors name the line of a syntax error.
    pub fn new(source: &str) -> Result<Self> {
        let source = strip_generation_tags(source);
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(python_formatter);
        env.add_filter("tojson", tojson_filter);
        env.add_filter("string", |v: Value| -> std::result::Result<Value, Error> { Ok(Value::from(python_str(&v)?)) });
        env.add_filter("trim", |v: Value, chars: Option<String>| -> std::result::Result<Value, Error> {
            let s = python_str(&v)?;
            Ok(Value::from(match chars {
                Some(c) => s.trim_matches(|x| c.contains(x)).to_string(),
                None => s.trim().to_string(),
            }))
        });
        env.add_function("raise_exception", |msg: Value| -> std::result::Result<Value, Error> {
            let text = msg.as_str().map(str::to_owned).unwrap_or_else(|| msg.to_string());
            Err(Error::new(ErrorKind::InvalidOperation, format!("{RAISE_MARK}{text}")))
        });
        env.add_function("strftime_now", |fmt: String| -> std::result::Result<Value, Error> {
            let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
            Ok(Value::from(strftime_utc(&fmt, secs)))
        });
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(|e| TextError::Template(format!("cannot compile chat template: {}", describe(&e))))?;
        Ok(Self { env, source })
    }

    /// The template source as compiled (after removing `{% generation %}` markers).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` (a JSON list of message objects) with the given options.
    pub fn render(&self, messages: &Json, opts: &ChatRenderOptions) -> Result<String> {
        let mut ctx = serde_json::Map::new();
        if let Some(b) = &opts.bos_token {
            ctx.insert("bos_token".into(), Json::String(b.clone()));
        }
        if let Some(e) = &opts.eos_token {
            ctx.insert("eos_token".into(), Json::String(e.clone()));
        }
        if let Some(t) = opts.enable_thinking {
            ctx.insert("enable_thinking".into(), Json::Bool(t));
        }
        for (k, v) in &opts.extra {
            ctx.insert(k.clone(), v.clone());
        }
        ctx.insert("messages".into(), self.harmony_thinking(messages));
        ctx.insert("tools".into(), opts.tools.clone().unwrap_or(Json::Null));
        ctx.insert("documents".into(), opts.documents.clone().unwrap_or(Json::Null));
        ctx.insert("add_generation_prompt".into(), Json::Bool(opts.add_generation_prompt));
        self.render_context(&Json::Object(ctx))
    }

    /// Messages as gpt-oss's template takes them (other templates get them unchanged). It tests keys with `in`
    /// (`"content" in message`, then a containment check on the value), so keys whose value is null are removed,
    /// as `transformers`' `apply_chat_template` does. It reads an assistant turn's reasoning from `thinking`,
    /// where OpenAI-style clients send `reasoning_content`: an assistant message with `reasoning_content` and no
    /// `thinking` gets it as `thinking` too, unless it has both calls and content (the template refuses content
    /// and thinking together on a call turn, and renders the content as that turn's reasoning).
    fn harmony_thinking(&self, messages: &Json) -> Json {
        let mut messages = messages.clone();
        if !crate::harmony::is_harmony_template(&self.source) {
            return messages;
        }
        for m in messages.as_array_mut().into_iter().flatten() {
            let Some(m) = m.as_object_mut() else { continue };
            m.retain(|_, v| !v.is_null());
            let has_content = m.get("content").is_some_and(|c| !c.is_null() && c.as_str() != Some(""));
            let calls = m.get("tool_calls").is_some_and(|c| !c.is_null());
            if m.get("role").and_then(Json::as_str) != Some("assistant")
                || m.contains_key("thinking")
                || (calls && has_content)
            {
                continue;
            }
            if let Some(r @ Json::String(_)) = m.get("reasoning_content") {
                let r = r.clone();
                m.insert("thinking".into(), r);
            }
        }
        messages
    }

    /// Renders with an explicit context object (every variable given by the caller).
    pub fn render_context(&self, ctx: &Json) -> Result<String> {
        let tmpl = self.env.get_template(TEMPLATE_NAME).map_err(|e| TextError::Template(describe(&e)))?;
        tmpl.render(Value::from_serialize(ctx)).map_err(|e| match raised_message(&e) {
            Some(msg) => TextError::TemplateRaised(msg),
            None => TextError::Template(describe(&e)),
        })
    }
}

/// The message of a `raise_exception` somewhere in the error chain.
fn raised_message(e: &Error) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(mj) = err.downcast_ref::<Error>() {
            if let Some(rest) = mj.detail().and_then(|d| d.strip_prefix(RAISE_MARK)) {
                return Some(rest.to_string());
            }
        }
        cur = err.source();
    }
    None
}

/// An error with its kind, detail and location, without the marker.
fn describe(e: &Error) -> String {
    let mut s = format!("{}", e.kind());
    if let Some(d) = e.detail() {
        s.push_str(": ");
        s.push_str(d.strip_prefix(RAISE_MARK).unwrap_or(d));
    }
    if let Some(line) = e.line() {
        s.push_str(&format!(" (line {line})"));
    }
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(&format!("; caused by: {inner}"));
        src = inner.source();
    }
    s
}

/// Removes `{% generation %}` / `{% endgeneration %}` (a `transformers` extension marking assistant
/// spans for masks; it renders nothing).
fn strip_generation_tags(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(pos) = rest.find("{%") {
        let after = &rest[pos + 2..];
        let Some(end) = after.find("%}") else { break };
        let inner = after[..end].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        if inner == "generation" || inner == "endgeneration" {
            out.push_str(&rest[..pos]);
        } else {
            out.push_str(&rest[..pos + 2 + end + 2]);
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

/// Converts a template value to JSON data, refusing undefined (Python's `json.dumps` would raise).
fn to_json(v: &Value) -> std::result::Result<Json, Error> {
    if v.is_undefined() {
        return Err(Error::new(ErrorKind::InvalidOperation, "Object of type Undefined is not JSON serializable"));
    }
    serde_json::to_value(v).map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("not JSON serializable: {e}")))
}

/// `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)` as `transformers`
/// defines it: plain `json.dumps`, no HTML escaping.
fn tojson_filter(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> std::result::Result<Value, Error> {
    let mut opts = DumpOptions::default();
    let names = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > names.len() {
        return Err(Error::new(ErrorKind::TooManyArguments, "tojson takes at most 4 arguments"));
    }
    let mut given: Vec<(&str, Value)> = names.iter().copied().zip(args.iter().cloned()).collect();
    for name in names {
        if let Some(v) = kwargs.get::<Option<Value>>(name)? {
            given.push((name, v));
        }
    }
    kwargs.assert_all_used()?;
    for (name, v) in given {
        match name {
            "ensure_ascii" => opts.ensure_ascii = v.is_true(),
            "sort_keys" => opts.sort_keys = v.is_true(),
            "indent" => {
                opts.indent = match v.kind() {
                    ValueKind::None | ValueKind::Undefined => None,
                    ValueKind::String => Some(v.as_str().unwrap_or_default().to_string()),
                    ValueKind::Number => {
                        let n = i64::try_from(v.clone())?;
                        Some(" ".repeat(n.max(0) as usize))
                    }
                    _ => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: indent must be an int or str")),
                }
            }
            "separators" => {
                opts.separators = match v.kind() {
                    ValueKind::None | ValueKind::Undefined => None,
                    _ => {
                        let parts: Vec<String> = v
                            .try_iter()?
                            .map(|p| p.as_str().map(str::to_owned))
                            .collect::<Option<Vec<_>>>()
                            .filter(|p| p.len() == 2)
                            .ok_or_else(|| {
                                Error::new(ErrorKind::InvalidOperation, "tojson: separators must be two strings")
                            })?;
                        Some((parts[0].clone(), parts[1].clone()))
                    }
                }
            }
            _ => unreachable!(),
        }
    }
    Ok(Value::from(pyfmt::json_dumps(&to_json(value)?, &opts)))
}

/// Python's `str(v)` for a template value.
fn python_str(v: &Value) -> std::result::Result<String, Error> {
    Ok(match v.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::None | ValueKind::Bool | ValueKind::Number | ValueKind::Seq | ValueKind::Map => {
            match serde_json::to_value(v) {
                Ok(j) => pyfmt::py_str(&j),
                Err(_) => v.to_string(),
            }
        }
        _ => v.to_string(),
    })
}

/// Prints values the way Jinja2 does under Python: `None`, `True`, `1.0`, `{'a': 1}`.
fn python_formatter(out: &mut Output, state: &State, value: &Value) -> std::result::Result<(), Error> {
    match value.kind() {
        ValueKind::None | ValueKind::Bool | ValueKind::Number | ValueKind::Seq | ValueKind::Map => {
            let text = python_str(value)?;
            out.write_str(&text).map_err(Error::from)
        }
        _ => minijinja::escape_formatter(out, state, value),
    }
}

/// `strftime` over UTC for the common conversions (`%Y %m %d %e %H %I %M %S %p %y %B %b %h %A %a %j
/// %F %T %D %Z %z %%`, and glibc's `%-d`-style unpadded forms).
pub fn strftime_utc(fmt: &str, unix_secs: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
    let days = unix_secs.div_euclid(86_400);
    let sod = unix_secs.rem_euclid(86_400);
    let (hour, minute, second) = (sod / 3600, (sod / 60) % 60, sod % 60);
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_mar + 2) / 153;
    let day = doy_mar - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = (days + 4).rem_euclid(7) as usize;
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(month - 1) as usize] + day + i64::from(leap && month > 2);
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };

    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = chars.next();
        let unpadded = spec == Some('-');
        if unpadded {
            spec = chars.next();
        }
        let num = |v: i64, w: usize| if unpadded { v.to_string() } else { format!("{:0w$}", v, w = w) };
        match spec {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&num(year.rem_euclid(100), 2)),
            Some('m') => out.push_str(&num(month, 2)),
            Some('d') => out.push_str(&num(day, 2)),
            Some('e') => out.push_str(&if unpadded { day.to_string() } else { format!("{:2}", day) }),
            Some('H') => out.push_str(&num(hour, 2)),
            Some('I') => out.push_str(&num(hour12, 2)),
            Some('M') => out.push_str(&num(minute, 2)),
            Some('S') => out.push_str(&num(second, 2)),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('B') => out.push_str(MONTHS[(month - 1) as usize]),
            Some('b') | Some('h') => out.push_str(&MONTHS[(month - 1) as usize][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('j') => out.push_str(&num(yday, 3)),
            Some('F') => out.push_str(&format!("{year}-{month:02}-{day:02}")),
            Some('T') => out.push_str(&format!("{hour:02}:{minute:02}:{second:02}")),
            Some('D') => out.push_str(&format!("{month:02}/{day:02}/{:02}", year.rem_euclid(100))),
            Some('Z') => out.push_str("UTC"),
            Some('z') => out.push_str("+0000"),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(src: &str, messages: Json, opts: &ChatRenderOptions) -> Result<String> {
        ChatTemplate::new(src)?.render(&messages, opts)
    }

    #[test]
    fn chatml_with_generation_prompt() {
        let src = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
                   {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let opts = ChatRenderOptions { add_generation_prompt: true, ..Default::default() };
        let out = render(src, json!([{"role": "user", "content": "hi"}]), &opts).unwrap();
        assert_eq!(out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn trim_and_lstrip_blocks() {
        let src = "A\n  {% if true %}\nB\n  {% endif %}\nC\n";
        assert_eq!(render(src, json!([]), &Default::default()).unwrap(), "A\nB\nC");
    }

    #[test]
    fn python_methods_and_printing() {
        let src = "{{ messages[0].content.strip().upper() }}|{{ 'a,b'.split(',') }}|\
                   {% for k, v in messages[0].items() %}{{ k }}={{ v | trim }};{% endfor %}|\
                   {{ messages[0].get('missing', 'dflt') }}|{{ none }}|{{ true }}|{{ messages[0].x }}|\
                   {{ messages[0].content.startswith(' he') }}";
        let out =
            render(src, json!([{"content": " hello ", "x": {"k": [1, 2.5, null]}}]), &Default::default()).unwrap();
        assert_eq!(
            out,
            "HELLO|['a', 'b']|content=hello;x={'k': [1, 2.5, None]};|dflt|None|True|{'k': [1, 2.5, None]}|True"
        );
    }

    #[test]
    fn tojson_is_python_json_dumps() {
        let src = "{{ tools | tojson }}|{{ tools[0] | tojson(indent=2) }}|{{ 'é<>' | tojson }}";
        let tools = json!([{"name": "f", "parameters": {"type": "object", "z": 1, "a": [true]}}]);
        let opts = ChatRenderOptions { tools: Some(tools), ..Default::default() };
        let out = render(src, json!([]), &opts).unwrap();
        assert_eq!(
            out,
            "[{\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"z\": 1, \"a\": [true]}}]|\
             {\n  \"name\": \"f\",\n  \"parameters\": {\n    \"type\": \"object\",\n    \"z\": 1,\n    \"a\": [\n      true\n    ]\n  }\n}|\
             \"é<>\""
        );
    }

    #[test]
    fn tools_none_and_variables() {
        let src = "{{ tools is none }}|{{ bos_token }}|{{ enable_thinking is defined }}|{{ custom }}";
        let mut opts = ChatRenderOptions { bos_token: Some("<s>".into()), ..Default::default() };
        opts.extra.insert("custom".into(), json!("x"));
        assert_eq!(render(src, json!([]), &opts).unwrap(), "True|<s>|False|x");
        opts.enable_thinking = Some(false);
        assert_eq!(render(src, json!([]), &opts).unwrap(), "True|<s>|True|x");
    }

    #[test]
    fn raise_exception_is_surfaced() {
        let src = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}ok";
        let err = render(src, json!([{"role": "system", "content": ""}]), &Default::default()).unwrap_err();
        match err {
            TextError::TemplateRaised(msg) => assert_eq!(msg, "Conversation must start with user"),
            other => panic!("unexpected error {other:?}"),
        }
        assert_eq!(render(src, json!([{"role": "user"}]), &Default::default()).unwrap(), "ok");
    }

    #[test]
    fn syntax_error_is_clear() {
        let err = ChatTemplate::new("{% if %}").unwrap_err();
        assert!(err.to_string().contains("chat template"), "{err}");
    }

    #[test]
    fn loop_controls_and_namespace() {
        let src = "{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}\
                   {% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}{{ messages[::-1][0] }}";
        assert_eq!(render(src, json!([1, 2, 3]), &Default::default()).unwrap(), "23");
    }

    #[test]
    fn generation_tags_are_dropped() {
        let src = "{% generation %}x{%- endgeneration %}";
        assert_eq!(render(src, json!([]), &Default::default()).unwrap(), "x");
    }

    #[test]
    fn strftime_formats() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime_utc("%Y-%m-%d %H:%M:%S", t), "2024-02-29 13:05:09");
        assert_eq!(strftime_utc("%d %b %Y|%A|%-d %B|%j|%I%p", t), "29 Feb 2024|Thursday|29 February|060|01PM");
        assert_eq!(strftime_utc("%F %T", 0), "1970-01-01 00:00:00");
    }
}
