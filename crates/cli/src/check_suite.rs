//! The built-in prompt suite of `tensorfold check`: 30 prompts in five kinds. Code edits copy long stretches of
//! the prompt (where context copies pay); the rest cover generation, prose, JSON and other languages.

/// One prompt of the suite.
pub struct Case {
    pub kind: &'static str,
    pub text: String,
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
        texts.iter().map(|t| Case { kind, text: t.to_string() }).collect()
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
    v
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_suite_has_thirty_prompts_in_five_kinds() {
        let cases = super::cases();
        assert!(cases.len() >= 30);
        for kind in ["code-edit", "code-gen", "prose", "json", "multilingual"] {
            assert!(cases.iter().filter(|c| c.kind == kind).count() >= 6, "{kind}");
        }
    }
}
