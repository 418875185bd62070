//! The built-in prompt suite of `tensorfold check`: 30 prompts in five kinds, and 6 constrained prompts whose
//! replies follow a JSON schema. Code edits copy long stretches of the prompt (where context copies pay); the rest
//! cover generation, prose, JSON and other languages.

use serde_json::{json, Value};

/// One prompt of the suite.
pub struct Case {
    pub kind: &'static str,
    pub text: String,
    /// The JSON schema the reply must follow (the `constrained` kind).
    pub schema: Option<Value>,
}

/// A person: name, age, and tags from a fixed list.
pub fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "tags": {
                "type": "array",
                "items": {"type": "string", "enum": ["friend", "family", "work", "sports", "music", "travel"]},
                "minItems": 1,
                "maxItems": 3
            }
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": false
    })
}

/// A product: title, price, and whether it is in stock.
pub fn product_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "title": {"type": "string", "minLength": 1, "maxLength": 60},
            "price": {"type": "number", "minimum": 0},
            "in_stock": {"type": "boolean"}
        },
        "required": ["title", "price", "in_stock"],
        "additionalProperties": false
    })
}

/// Why `v` does not follow `schema`, for the keywords the suite's schemas use (type, enum, properties, required,
/// additionalProperties: false, items, minItems/maxItems, minLength/maxLength, minimum/maximum); `None` when it
/// does.
pub fn schema_violation(v: &Value, schema: &Value) -> Option<String> {
    let num = |k: &str| schema.get(k).and_then(Value::as_f64);
    if let Some(t) = schema.get("type").and_then(Value::as_str) {
        let ok = match t {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            "boolean" => v.is_boolean(),
            "null" => v.is_null(),
            _ => true,
        };
        if !ok {
            return Some(format!("{v} is not of type {t}"));
        }
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        if !options.contains(v) {
            return Some(format!("{v} is not one of {}", Value::Array(options.clone())));
        }
    }
    if let Some(s) = v.as_str() {
        let n = s.chars().count() as f64;
        if num("minLength").is_some_and(|m| n < m) || num("maxLength").is_some_and(|m| n > m) {
            return Some(format!("{v}: length {n} out of bounds"));
        }
    }
    if let Some(x) = v.as_f64() {
        if num("minimum").is_some_and(|m| x < m) || num("maximum").is_some_and(|m| x > m) {
            return Some(format!("{v} out of bounds"));
        }
    }
    if let Some(items) = v.as_array() {
        let n = items.len() as f64;
        if num("minItems").is_some_and(|m| n < m) || num("maxItems").is_some_and(|m| n > m) {
            return Some(format!("{} items out of bounds", items.len()));
        }
        if let Some(each) = schema.get("items") {
            if let Some(why) = items.iter().find_map(|x| schema_violation(x, each)) {
                return Some(why);
            }
        }
    }
    if let Some(obj) = v.as_object() {
        let props = schema.get("properties").and_then(Value::as_object);
        for key in schema.get("required").and_then(Value::as_array).into_iter().flatten() {
            let key = key.as_str().unwrap_or_default();
            if !obj.contains_key(key) {
                return Some(format!("the required field {key:?} is missing"));
            }
        }
        for (key, value) in obj {
            match props.and_then(|p| p.get(key)) {
                Some(sub) => {
                    if let Some(why) = schema_violation(value, sub) {
                        return Some(format!("{key}: {why}"));
                    }
                }
                None if schema.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    return Some(format!("the field {key:?} is not in the schema"));
                }
                None => {}
            }
        }
    }
    None
}

const PY_STATS: &str = "def summarize(values):
    total = 0
    count = 0
    for v in values:
        if v is None:
            continue
        total += v
        count += 1
    if count == 0:
        return {\"count\": 0, \"mean\": None}
    mean = total / count
    return {\"count\": count, \"mean\": mean}";

const RS_PARSE: &str = "fn parse_pairs(input: &str) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for line in input.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some((key, value)) = line.split_once('=') {
            if let Ok(n) = value.trim().parse::<i64>() {
                out.push((key.trim().to_string(), n));
            }
        }
    }
    out
}";

const JS_CART: &str = "function cartTotal(items, taxRate) {
  let subtotal = 0;
  for (const item of items) {
    if (item.quantity <= 0) {
      continue;
    }
    subtotal += item.price * item.quantity;
  }
  const tax = subtotal * taxRate;
  return { subtotal, tax, total: subtotal + tax };
}";

const PY_CLASS: &str = "class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError(\"pop from empty stack\")
        return self.items.pop()

    def peek(self):
        if not self.items:
            return None
        return self.items[-1]";

const GO_RETRY: &str = "func retry(attempts int, fn func() error) error {
\tvar err error
\tfor i := 0; i < attempts; i++ {
\t\terr = fn()
\t\tif err == nil {
\t\t\treturn nil
\t\t}
\t\ttime.Sleep(time.Duration(i*100) * time.Millisecond)
\t}
\treturn err
}";

const SQL_REPORT: &str = "SELECT customer_id,
       COUNT(*) AS orders,
       SUM(amount) AS revenue
FROM orders
WHERE status = 'paid'
  AND created_at >= '2024-01-01'
GROUP BY customer_id
HAVING SUM(amount) > 100
ORDER BY revenue DESC
LIMIT 20;";

/// The suite, in a fixed order.
pub fn cases() -> Vec<Case> {
    let edit = |code: &str, ask: &str| Case {
        kind: "code-edit",
        text: format!("{ask} Reply with the whole code and nothing else.\n\n```\n{code}\n```"),
        schema: None,
    };
    let mut v = vec![
        edit(PY_STATS, "Rename the variable `total` to `running_sum` in this function."),
        edit(RS_PARSE, "Add a doc comment above this Rust function explaining what it returns."),
        edit(JS_CART, "Change the condition so items with quantity below 1 are skipped, keep the rest."),
        edit(PY_CLASS, "Add a `__len__` method to this class that returns the number of items."),
        edit(GO_RETRY, "Rename the parameter `fn` to `op` everywhere in this Go function."),
        edit(SQL_REPORT, "Change the LIMIT of this query to 50 and keep everything else as it is."),
    ];
    let simple = |kind: &'static str, texts: &[&str]| -> Vec<Case> {
        texts.iter().map(|t| Case { kind, text: t.to_string(), schema: None }).collect()
    };
    v.extend(simple(
        "code-gen",
        &[
            "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces.",
            "Write a Rust function that returns the n-th Fibonacci number iteratively.",
            "Write a JavaScript function that debounces another function by a given number of milliseconds.",
            "Write a SQL query that finds the ten most recent orders of each customer.",
            "Write a bash script that counts the lines of every .txt file in a directory.",
            "Write a Python class for a bank account with deposit, withdraw and balance methods.",
        ],
    ));
    v.extend(simple(
        "prose",
        &[
            "Explain in a short paragraph why the sky is blue.",
            "Write a short story about a lighthouse keeper who finds a message in a bottle.",
            "What are the main differences between a virus and a bacterium?",
            "Give three tips for writing clear technical documentation.",
            "Describe the water cycle to a ten-year-old.",
            "Summarize the plot of Romeo and Juliet in four sentences.",
        ],
    ));
    v.extend(simple(
        "json",
        &[
            "Return a JSON object describing a book with the fields title, author, year and genres (a list).",
            "Convert this to JSON with keys name, age and city: Alice is 31 and lives in Lyon.",
            "Produce a JSON array of three fictional users, each with id, email and active (a boolean).",
            "Give the planets of the solar system as a JSON list of objects with name and order from the sun.",
            "Return a JSON object with the keys status and items, where items lists two products with a price.",
            "Write a JSON configuration for a web server with host, port, tls (an object) and routes (a list).",
        ],
    ));
    v.extend(simple(
        "multilingual",
        &[
            "Explique en deux phrases ce qu'est la photosynthèse.",
            "Erkläre kurz, wie ein Kühlschrank funktioniert.",
            "¿Cuáles son los beneficios de aprender un segundo idioma?",
            "用三句话介绍一下长城。",
            "日本の四季について短く説明してください。",
            "Scrivi una breve poesia sul mare.",
        ],
    ));
    let constrained =
        |text: &str, schema: Value| Case { kind: "constrained", text: text.to_string(), schema: Some(schema) };
    v.extend([
        constrained(
            "Describe a fictional person as a JSON object with a name, an age and a list of tags (friend, family, \
             work, sports, music or travel).",
            person_schema(),
        ),
        constrained(
            "My colleague Marta is 42 and we play tennis together. Give her as JSON with name, age and tags.",
            person_schema(),
        ),
        constrained(
            "Return a JSON record for a grandfather who loves jazz and trains: his name, his age and his tags.",
            person_schema(),
        ),
        constrained(
            "Describe a pair of running shoes as a JSON object with a title, a price and whether it is in stock.",
            product_schema(),
        ),
        constrained(
            "Give a JSON object for a sold-out concert ticket: its title, its price in euros and in_stock.",
            product_schema(),
        ),
        constrained("Crée un objet JSON pour une personne : nom, âge et étiquettes.", person_schema()),
    ]);
    v
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_suite_has_thirty_prompts_in_five_kinds_and_constrained_ones() {
        let cases = super::cases();
        assert!(cases.len() >= 36);
        for kind in ["code-edit", "code-gen", "prose", "json", "multilingual", "constrained"] {
            assert!(cases.iter().filter(|c| c.kind == kind).count() >= 6, "{kind}");
        }
        assert!(cases.iter().all(|c| c.schema.is_some() == (c.kind == "constrained")));
    }

    #[test]
    fn schema_violations_name_the_field() {
        use super::{person_schema, schema_violation};
        use serde_json::json;
        let s = person_schema();
        assert_eq!(schema_violation(&json!({"name": "Ann", "age": 30, "tags": ["work"]}), &s), None);
        let bad = [
            json!({"name": "Ann", "age": 30}),
            json!({"name": "Ann", "age": 30.5, "tags": ["work"]}),
            json!({"name": "Ann", "age": 30, "tags": ["chess"]}),
            json!({"name": "Ann", "age": 30, "tags": []}),
            json!({"name": "", "age": 30, "tags": ["work"]}),
            json!({"name": "Ann", "age": -1, "tags": ["work"]}),
            json!({"name": "Ann", "age": 30, "tags": ["work"], "city": "Lyon"}),
            json!(["Ann"]),
        ];
        for v in bad {
            assert!(schema_violation(&v, &s).is_some(), "{v}");
        }
    }
}
