//! Tool calls written as a Python list of calls, `[get_weather(city="Paris"), get_time()]`:
//! the format Llama 3.2's small models and Llama 4 are trained to answer in (vLLM's `pythonic`
//! parser; Llama 4's `<|python_start|>` and `<|python_end|>` are control tokens, left out of
//! the text). Arguments are keyword arguments whose values are Python literals: strings,
//! numbers, `True`, `False`, `None`, lists, tuples and dicts, turned into JSON.

use serde_json::{Map, Number, Value};

/// The calls of an answer that is exactly such a list (whitespace around it aside): each call's
/// function and its arguments as JSON text. `None` when the answer is anything else.
pub(crate) fn calls(text: &str) -> Option<Vec<(String, String)>> {
    let mut p = Parser {
        s: text.trim().as_bytes(),
        at: 0,
    };
    p.eat(b'[')?;
    let mut calls = Vec::new();
    p.separated(b']', |p| {
        calls.push(p.call()?);
        Some(())
    })?;
    (p.at == p.s.len() && !calls.is_empty()).then_some(calls)
}

/// A cursor over the answer's bytes.
struct Parser<'a> {
    s: &'a [u8],
    at: usize,
}

/// Nesting deeper than this is refused rather than followed (no model writes it; a recursive
/// parser must not be steered into a stack overflow).
const MAX_DEPTH: u32 = 64;

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    fn space(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_whitespace()) {
            self.at += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek() == Some(c)).then(|| self.at += 1)
    }

    /// Items separated by commas up to `close`, a trailing comma allowed: `item` reads each.
    fn separated(
        &mut self,
        close: u8,
        mut item: impl FnMut(&mut Self) -> Option<()>,
    ) -> Option<()> {
        loop {
            self.space();
            if self.peek() == Some(close) {
                break;
            }
            item(self)?;
            self.space();
            if self.peek() == Some(b',') {
                self.at += 1;
            } else {
                break;
            }
        }
        self.space();
        self.eat(close)
    }

    /// A Python identifier (ASCII).
    fn name(&mut self) -> Option<String> {
        let start = self.at;
        match self.peek() {
            Some(c) if c.is_ascii_alphabetic() || c == b'_' => self.at += 1,
            _ => return None,
        }
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_')
        {
            self.at += 1;
        }
        std::str::from_utf8(&self.s[start..self.at])
            .ok()
            .map(str::to_owned)
    }

    /// `name(key=value, ...)`.
    fn call(&mut self) -> Option<(String, String)> {
        let name = self.name()?;
        self.space();
        self.eat(b'(')?;
        let mut arguments = Map::new();
        self.separated(b')', |p| {
            let key = p.name()?;
            p.space();
            p.eat(b'=')?;
            p.space();
            arguments.insert(key, p.value(0)?);
            Some(())
        })?;
        Some((name, Value::Object(arguments).to_string()))
    }

    fn value(&mut self, depth: u32) -> Option<Value> {
        if depth > MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'"' | b'\'' => self.string().map(Value::String),
            b'[' => self.items(b']', depth).map(Value::Array),
            b'(' => self.items(b')', depth).map(Value::Array),
            b'{' => self.dict(depth),
            b'-' | b'+' | b'.' | b'0'..=b'9' => self.number(),
            _ => match self.name()?.as_str() {
                "True" => Some(Value::Bool(true)),
                "False" => Some(Value::Bool(false)),
                "None" => Some(Value::Null),
                _ => None,
            },
        }
    }

    /// A list's or a tuple's items up to `close`.
    fn items(&mut self, close: u8, depth: u32) -> Option<Vec<Value>> {
        self.at += 1;
        let mut items = Vec::new();
        self.separated(close, |p| {
            items.push(p.value(depth + 1)?);
            Some(())
        })?;
        Some(items)
    }

    /// `{key: value, ...}`: keys that are not strings become their JSON text, as JSON objects
    /// have string keys only.
    fn dict(&mut self, depth: u32) -> Option<Value> {
        self.at += 1;
        let mut map = Map::new();
        self.separated(b'}', |p| {
            let key = match p.value(depth + 1)? {
                Value::String(s) => s,
                other => other.to_string(),
            };
            p.space();
            p.eat(b':')?;
            p.space();
            map.insert(key, p.value(depth + 1)?);
            Some(())
        })?;
        Some(Value::Object(map))
    }

    /// An integer or a float, as Python writes them (`_` between digits allowed).
    fn number(&mut self) -> Option<Value> {
        let start = self.at;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'+' | b'.' | b'_'))
        {
            self.at += 1;
        }
        let text: String = std::str::from_utf8(&self.s[start..self.at])
            .ok()?
            .chars()
            .filter(|&c| c != '_')
            .collect();
        let text = text.strip_prefix('+').unwrap_or(&text);
        if let Ok(i) = text.parse::<i64>() {
            return Some(Value::Number(i.into()));
        }
        let f: f64 = text.parse().ok()?;
        Number::from_f64(f).map(Value::Number)
    }

    /// A quoted string with Python's escapes (`\n`, `\t`, `\r`, `\\`, quotes, `\xHH`,
    /// `\uXXXX`); an unknown escape keeps its backslash, as Python does.
    fn string(&mut self) -> Option<String> {
        let quote = self.peek()?;
        self.at += 1;
        let mut bytes = Vec::new();
        loop {
            let c = self.peek()?;
            self.at += 1;
            match c {
                c if c == quote => break,
                b'\\' => {
                    let e = self.peek()?;
                    self.at += 1;
                    let simple = match e {
                        b'n' => Some(b'\n'),
                        b't' => Some(b'\t'),
                        b'r' => Some(b'\r'),
                        b'0' => Some(0),
                        b'\\' | b'\'' | b'"' => Some(e),
                        _ => None,
                    };
                    match (simple, e) {
                        (Some(b), _) => bytes.push(b),
                        (None, b'x') => self.hex_char(2, &mut bytes)?,
                        (None, b'u') => self.hex_char(4, &mut bytes)?,
                        (None, b'U') => self.hex_char(8, &mut bytes)?,
                        (None, e) => bytes.extend_from_slice(&[b'\\', e]),
                    }
                }
                c => bytes.push(c),
            }
        }
        String::from_utf8(bytes).ok()
    }

    /// A character given as `digits` hexadecimal digits, appended as UTF-8.
    fn hex_char(&mut self, digits: usize, out: &mut Vec<u8>) -> Option<()> {
        let hex = self.s.get(self.at..self.at + digits)?;
        self.at += digits;
        let code = u32::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
        let c = char::from_u32(code)?;
        out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_calls_become_json_arguments() {
        let text = r#" [get_weather(city="San Francisco", unit='c', days=3, hourly=True),
            search(q="it's \"quoted\"\n", tags=['a', "b"], where={'lat': 1.5, "lon": -2e3}, page=None, pair=(1, 2),),
            get_time()] "#;
        let got = calls(text).expect("calls");
        let want = [
            (
                "get_weather",
                r#"{"city":"San Francisco","unit":"c","days":3,"hourly":true}"#,
            ),
            (
                "search",
                r#"{"q":"it's \"quoted\"\n","tags":["a","b"],"where":{"lat":1.5,"lon":-2000.0},"page":null,"pair":[1,2]}"#,
            ),
            ("get_time", "{}"),
        ];
        let got: Vec<(&str, &str)> = got.iter().map(|(n, a)| (n.as_str(), a.as_str())).collect();
        assert_eq!(got, want);
        assert_eq!(
            calls(r"[f(s='\u00e9\x41\q')]").expect("escapes"),
            [("f".to_owned(), r#"{"s":"éA\\q"}"#.to_owned())]
        );
    }

    #[test]
    fn anything_else_is_not_calls() {
        for text in [
            "",
            "[]",
            "[1, 2]",
            "[f(]",
            "[f(x)]",
            "[f(x=)]",
            "[f(x=1)] and more",
            "[f(x='open)]",
            "[f(x=os.system('ls'))]",
            "[f(x=1 + 2)]",
            "Sure: [f(x=1)]",
        ] {
            assert_eq!(calls(text), None, "{text:?}");
        }
        // Deep nesting is refused, not followed.
        let deep = format!("[f(x={}{})]", "[".repeat(200), "]".repeat(200));
        assert_eq!(calls(&deep), None);
    }

    proptest::proptest! {
        /// Any text, the format's own characters above all, is calls or not, never a panic.
        #[test]
        fn any_text_reads_without_panicking(
            text in proptest::prop_oneof!["\\PC{0,64}", "[\\[\\](){}'\"=,:a-zA-Z0-9_\\\\ .-]{0,64}"],
        ) {
            let _ = calls(&text);
            let _ = calls(&format!("[f(x={text})]"));
        }
    }
}
