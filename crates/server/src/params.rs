//! Reading request fields out of a JSON object with one clear error per bad field. `null` counts as absent;
//! unknown fields are ignored (clients send many we do not use).

use crate::error::ApiError;
use serde_json::{Map, Value};
use tf_engine::{Priority, SamplingParams};

/// A request body, already parsed as a JSON object.
pub struct Fields<'a> {
    pub obj: &'a Map<String, Value>,
}

/// Parses a body: invalid UTF-8 or JSON, or anything but an object, is a 400.
pub fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid(None, format!("the request body is not valid JSON: {e}")).with_code("invalid_json")
    })?;
    match v {
        Value::Object(m) => Ok(m),
        other => Err(ApiError::invalid(None, format!("the request body must be a JSON object, not {}", kind(&other)))),
    }
}

/// JSON type name for messages.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl<'a> Fields<'a> {
    pub fn new(obj: &'a Map<String, Value>) -> Fields<'a> {
        Fields { obj }
    }

    pub fn get(&self, name: &str) -> Option<&'a Value> {
        self.obj.get(name).filter(|v| !v.is_null())
    }

    pub fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(ApiError::field(name, format!("expected a boolean, got {}", kind(v)))),
        }
    }

    pub fn str(&self, name: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(ApiError::field(name, format!("expected a string, got {}", kind(v)))),
        }
    }

    /// A finite number in `[lo, hi]`.
    pub fn f64_in(&self, name: &str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
        let Some(v) = self.get(name) else { return Ok(None) };
        let x = v.as_f64().filter(|_| v.is_number()).ok_or_else(|| {
            ApiError::field(name, format!("expected a number, got {}", kind(v))).with_code("invalid_type")
        })?;
        if !x.is_finite() || x < lo || x > hi {
            return Err(
                ApiError::field(name, format!("must be between {lo} and {hi}, got {x}")).with_code("invalid_value")
            );
        }
        Ok(Some(x))
    }

    /// An integer in `[lo, hi]` (a number with a fractional part, or beyond u64, is refused).
    pub fn int_in(&self, name: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        let Some(v) = self.get(name) else { return Ok(None) };
        if !v.is_number() {
            return Err(
                ApiError::field(name, format!("expected an integer, got {}", kind(v))).with_code("invalid_type")
            );
        }
        let x = match (v.as_i64(), v.as_u64()) {
            (Some(x), _) => x,
            (None, Some(_)) => i64::MAX,
            (None, None) => {
                let f = v.as_f64().unwrap_or(f64::NAN);
                if f.fract() != 0.0 || !f.is_finite() {
                    return Err(
                        ApiError::field(name, format!("expected an integer, got {v}")).with_code("invalid_type")
                    );
                }
                if f <= i64::MIN as f64 {
                    i64::MIN
                } else if f >= i64::MAX as f64 {
                    i64::MAX
                } else {
                    f as i64
                }
            }
        };
        if x < lo || x > hi {
            return Err(
                ApiError::field(name, format!("must be between {lo} and {hi}, got {v}")).with_code("invalid_value")
            );
        }
        Ok(Some(x))
    }

    /// `stop`: a string or an array of up to 16 non-empty strings.
    pub fn stops(&self, name: &str) -> Result<Vec<String>, ApiError> {
        let list = match self.get(name) {
            None => return Ok(Vec::new()),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) => {
                let mut out = Vec::with_capacity(a.len());
                for (i, x) in a.iter().enumerate() {
                    match x {
                        Value::String(s) => out.push(s.clone()),
                        v => {
                            return Err(ApiError::field(name, format!("item {i}: expected a string, got {}", kind(v))))
                        }
                    }
                }
                out
            }
            Some(v) => return Err(ApiError::field(name, format!("expected a string or an array, got {}", kind(v)))),
        };
        if list.len() > 16 {
            return Err(ApiError::field(name, "at most 16 stop strings"));
        }
        if list.iter().any(String::is_empty) {
            return Err(ApiError::field(name, "an empty stop string would end every reply at once"));
        }
        Ok(list)
    }

    /// `priority`: `"interactive"` (default) or `"background"`.
    pub fn priority(&self) -> Result<Priority, ApiError> {
        match self.get("priority") {
            None => Ok(Priority::Interactive),
            Some(Value::String(s)) if s == "interactive" || s == "default" => Ok(Priority::Interactive),
            Some(Value::String(s)) if s == "background" || s == "low" => Ok(Priority::Background),
            Some(v) => Err(ApiError::field("priority", format!("expected \"interactive\" or \"background\", got {v}"))),
        }
    }

    /// `stream_options.include_usage` (false when absent).
    pub fn include_usage(&self) -> Result<bool, ApiError> {
        match self.get("stream_options") {
            None => Ok(false),
            Some(Value::Object(o)) => Ok(Fields::new(o).bool("include_usage")?.unwrap_or(false)),
            Some(v) => Err(ApiError::field("stream_options", format!("expected an object, got {}", kind(v)))),
        }
    }

    /// `n` must be 1 (one choice per request).
    pub fn check_n(&self) -> Result<(), ApiError> {
        match self.int_in("n", 1, i64::MAX)? {
            None | Some(1) => Ok(()),
            Some(n) => Err(ApiError::field("n", format!("only n = 1 is supported, got {n}; send {n} requests"))),
        }
    }
}

/// Server-wide sampling defaults (flags over generation_config.json over OpenAI's neutral values).
#[derive(Clone, Debug)]
pub struct SamplingDefaults {
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: usize,
    pub min_p: f64,
    pub repetition_penalty: f64,
}

impl Default for SamplingDefaults {
    fn default() -> Self {
        SamplingDefaults { temperature: 1.0, top_p: 1.0, top_k: 0, min_p: 0.0, repetition_penalty: 1.0 }
    }
}

/// The sampling fields shared by every generation route; `vocab` bounds `logit_bias`'s token ids.
pub fn sampling(f: &Fields<'_>, d: &SamplingDefaults, vocab: usize) -> Result<SamplingParams, ApiError> {
    let p = SamplingParams {
        temperature: f.f64_in("temperature", 0.0, 2.0)?.unwrap_or(d.temperature),
        top_p: match f.f64_in("top_p", 0.0, 1.0)? {
            Some(x) if x <= 0.0 => return Err(ApiError::field("top_p", "must be greater than 0")),
            Some(x) => x,
            None => d.top_p,
        },
        // -1 is vLLM's "off".
        top_k: match f.int_in("top_k", -1, 1 << 20)? {
            Some(-1) | Some(0) => 0,
            Some(k) => k as usize,
            None => d.top_k,
        },
        min_p: f.f64_in("min_p", 0.0, 1.0)?.unwrap_or(d.min_p),
        repetition_penalty: match f.f64_in("repetition_penalty", 0.0, 10.0)? {
            Some(x) if x <= 0.0 => return Err(ApiError::field("repetition_penalty", "must be greater than 0")),
            Some(x) => x,
            None => d.repetition_penalty,
        },
        presence_penalty: f.f64_in("presence_penalty", -2.0, 2.0)?.unwrap_or(0.0),
        frequency_penalty: f.f64_in("frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0),
        seed: match f.get("seed") {
            None => None,
            Some(v) => Some(seed(v)?),
        },
        logit_bias: logit_bias(f, vocab)?,
    };
    p.validate().map_err(|e| ApiError::field(e.field, e.message))?;
    Ok(p)
}

/// OpenAI's `logit_bias`: an object of token id (a decimal string) → bias in [−100, 100], ids below `vocab`;
/// returned ascending by id.
fn logit_bias(f: &Fields<'_>, vocab: usize) -> Result<Vec<(u32, f64)>, ApiError> {
    let Some(v) = f.get("logit_bias") else { return Ok(Vec::new()) };
    let Value::Object(m) = v else {
        return Err(ApiError::field("logit_bias", format!("expected an object of token id → bias, got {}", kind(v))));
    };
    let mut out = Vec::with_capacity(m.len());
    for (k, b) in m {
        let id = k
            .parse::<u32>()
            .ok()
            .filter(|&id| (id as usize) < vocab)
            .ok_or_else(|| ApiError::field("logit_bias", format!("key {k:?} is not a token id below {vocab}")))?;
        let b = b.as_f64().filter(|b| (-100.0..=100.0).contains(b)).ok_or_else(|| {
            ApiError::field("logit_bias", format!("token {id}: expected a number in [-100, 100], got {b}"))
        })?;
        out.push((id, b));
    }
    out.sort_by_key(|&(id, _)| id);
    if let Some(w) = out.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(ApiError::field("logit_bias", format!("token {} appears twice", w[0].0)));
    }
    Ok(out)
}

/// Seeds: any integer that fits 64 bits; negative ones wrap (two's complement), as NumPy-style clients send.
fn seed(v: &Value) -> Result<u64, ApiError> {
    if let Some(u) = v.as_u64() {
        return Ok(u);
    }
    if let Some(i) = v.as_i64() {
        return Ok(i as u64);
    }
    Err(ApiError::field("seed", format!("expected a 64-bit integer, got {v}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn bad_fields_name_themselves() {
        let d = SamplingDefaults::default();
        for (body, param) in [
            (json!({"temperature": "hot"}), "temperature"),
            (json!({"temperature": -1}), "temperature"),
            (json!({"temperature": 1e300}), "temperature"),
            (json!({"top_p": 0}), "top_p"),
            (json!({"top_p": 1.5}), "top_p"),
            (json!({"top_k": 2.5}), "top_k"),
            (json!({"top_k": -2}), "top_k"),
            (json!({"min_p": [1]}), "min_p"),
            (json!({"presence_penalty": 3}), "presence_penalty"),
            (json!({"seed": "x"}), "seed"),
            (json!({"seed": 1.5}), "seed"),
            (json!({"logit_bias": [1]}), "logit_bias"),
            (json!({"logit_bias": {"x": 1}}), "logit_bias"),
            (json!({"logit_bias": {"100": 1}}), "logit_bias"),
            (json!({"logit_bias": {"-1": 1}}), "logit_bias"),
            (json!({"logit_bias": {"5": 101}}), "logit_bias"),
            (json!({"logit_bias": {"5": "1"}}), "logit_bias"),
            (json!({"logit_bias": {"5": 1, "05": 2}}), "logit_bias"),
        ] {
            let m = obj(body.clone());
            let e = sampling(&Fields::new(&m), &d, 100).expect_err(&body.to_string());
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
        }
    }

    #[test]
    fn nulls_are_absent_and_defaults_apply() {
        let d = SamplingDefaults { temperature: 0.7, top_p: 0.9, top_k: 20, min_p: 0.0, repetition_penalty: 1.05 };
        let m = obj(json!({"temperature": null, "top_k": -1, "seed": -1}));
        let p = sampling(&Fields::new(&m), &d, 100).unwrap();
        assert_eq!((p.temperature, p.top_p, p.top_k, p.repetition_penalty), (0.7, 0.9, 0, 1.05));
        assert_eq!(p.seed, Some(u64::MAX));
        assert!(p.logit_bias.is_empty());
        let m = obj(json!({"logit_bias": {"99": -100, "3": 2.5, "0": 100}}));
        let p = sampling(&Fields::new(&m), &d, 100).unwrap();
        assert_eq!(p.logit_bias, vec![(0, 100.0), (3, 2.5), (99, -100.0)]);
    }

    #[test]
    fn integers_out_of_range_and_huge() {
        let m = obj(json!({"max_tokens": 18446744073709551615u64, "a": -5, "b": 1e30, "c": 3.0}));
        let f = Fields::new(&m);
        assert!(f.int_in("max_tokens", 0, 1 << 40).is_err());
        assert!(f.int_in("a", 0, 10).is_err());
        assert!(f.int_in("b", 0, 10).is_err());
        assert_eq!(f.int_in("c", 0, 10).unwrap(), Some(3));
        assert_eq!(f.int_in("missing", 0, 10).unwrap(), None);
    }

    #[test]
    fn stops_and_n() {
        let m = obj(json!({"stop": ["a", ""], "n": 2}));
        let f = Fields::new(&m);
        assert!(f.stops("stop").is_err());
        assert_eq!(f.check_n().unwrap_err().param.as_deref(), Some("n"));
        let m = obj(json!({"stop": "\n", "n": 1}));
        let f = Fields::new(&m);
        assert_eq!(f.stops("stop").unwrap(), vec!["\n".to_string()]);
        f.check_n().unwrap();
        assert!(parse_object(b"[1]").is_err());
        assert!(parse_object(b"{\"a\": NaN}").is_err());
        assert!(parse_object(b"\xff\xfe").is_err());
    }
}
