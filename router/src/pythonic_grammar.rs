//! The grammar strict tools draw a pythonic answer under (`[get_weather(city="Paris")]`, the
//! format [`crate::pythonic`] reads): free text that does not start with `[`, or a list of
//! calls, each a tool's name and keyword arguments whose values are Python literals of the
//! types the tool's schema gives. llguidance's Lark syntax.

use dolphin_grammar::LARK_WHITESPACE;
use serde_json::Value;

use crate::tools::CallTokens;

/// Nesting of array schemas followed into their items; deeper values are any literal.
const MAX_DEPTH: u32 = 4;

/// The rules every grammar shares besides whitespace (`WS`, see [`grammar`]): Python literals
/// of each kind, any literal, and any keyword arguments (a tool that is not strict).
const COMMON: &str = r#"PYSTR: /"([^"\\\n]|\\.)*"|'([^'\\\n]|\\.)*'/
PYINT: /-?[0-9]+/
PYNUM: /-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?/
KEY: /[A-Za-z_][A-Za-z0-9_]*/
pyval: PYSTR | PYNUM | "True" | "False" | "None" | pylist | pytuple | pydict
pylist: "[" WS (pyval (WS "," WS pyval)* (WS ",")?)? WS "]"
pytuple: "(" WS (pyval (WS "," WS pyval)* (WS ",")?)? WS ")"
pydict: "{" WS (pyval WS ":" WS pyval (WS "," WS pyval WS ":" WS pyval)* (WS ",")?)? WS "}"
anyargs: (KEY WS "=" WS pyval (WS "," WS KEY WS "=" WS pyval)* (WS ",")?)?
TEXT: /(.|\n)*/ & ~/[ \t\n]*\[(.|\n)*/
"#;

/// The grammar of an answer under strict tools in the pythonic format: text that does not
/// start with `[`, or the list of calls (between Llama 4's `<|python_start|>` and
/// `<|python_end|>` where the vocabulary has them, as `tokens` says). A strict tool's call
/// (`arguments(function)` its parameters' schema) passes its parameters by keyword in the
/// schema's order, the required ones always and the others where written; another tool's any
/// keywords. At most one call without `parallel`. Tools whose names are not Python
/// identifiers cannot be called in this format and are left out.
pub(crate) fn grammar(
    tools: &[Value],
    arguments: &dyn Fn(&Value) -> Value,
    parallel: bool,
    tokens: CallTokens,
) -> String {
    // Whitespace bounded as every format's JSON is, so a small model cannot spend its budget
    // on blank lines.
    let mut rules = format!("WS: {LARK_WHITESPACE}\n{COMMON}");
    let mut calls = Vec::new();
    for (i, f) in tools.iter().map(|t| &t["function"]).enumerate() {
        let Some(name) = f["name"].as_str().filter(|n| is_identifier(n)) else {
            continue;
        };
        let args = keyword_rules(i, &arguments(f), &mut rules).unwrap_or("anyargs".into());
        rules.push_str(&format!(
            "call_{i}: \"{name}\" WS \"(\" WS {args} WS \")\"\n"
        ));
        calls.push(format!("call_{i}"));
    }
    let token = |id: Option<u32>| id.map(|id| format!("(<[{id}]>)? ")).unwrap_or_default();
    let more = if parallel {
        r#"(WS "," WS call)* (WS ",")?"#
    } else {
        r#"(WS ",")?"#
    };
    rules.push_str(&format!(
        "start: TEXT | calls\n\
         calls: {}WS \"[\" WS call {more} WS \"]\" WS {}\n\
         call: {}\n",
        token(tokens.python_start),
        token(tokens.python_end),
        calls.join(" | "),
    ));
    rules
}

/// A Python identifier, as the reader takes a function's or a keyword's name.
fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The rules for tool `i`'s keyword arguments under `schema` (an object's: its properties in
/// order, each optional one skippable), appended to `rules`; the name of the first, or
/// `None` where the schema is not such an object (any keywords then).
fn keyword_rules(i: usize, schema: &Value, rules: &mut String) -> Option<String> {
    let properties = schema["properties"].as_object()?;
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if properties.keys().any(|k| !is_identifier(k)) {
        return None;
    }
    let params: Vec<(&String, &Value)> = properties.iter().collect();
    // `first_k`: parameters k.. with none written before; `rest_k`: the same after one, each
    // behind a comma. Past the last parameter both are empty (no rule).
    let (mut first, mut rest): (Option<String>, Option<String>) = (None, None);
    for (k, (key, value)) in params.iter().enumerate().rev() {
        let keyword = format!("\"{key}\" WS \"=\" WS {}", value_expr(value, 0));
        let then = |r: &Option<String>| r.as_ref().map(|r| format!(" {r}")).unwrap_or_default();
        let optional = !required.contains(&key.as_str());
        let alternatives = |written: String, skipped: &Option<String>| match (optional, skipped) {
            (false, _) => written,
            (true, Some(s)) => format!("{written} | {s}"),
            (true, None) => format!("({written})?"),
        };
        let rest_k = format!("args_{i}_rest_{k}");
        rules.push_str(&format!(
            "{rest_k}: {}\n",
            alternatives(format!("WS \",\" WS {keyword}{}", then(&rest)), &rest)
        ));
        let first_k = format!("args_{i}_{k}");
        rules.push_str(&format!(
            "{first_k}: {}\n",
            alternatives(format!("{keyword}{}", then(&rest)), &first)
        ));
        rest = Some(rest_k);
        first = Some(first_k);
    }
    // A trailing comma, as Python allows.
    Some(match first {
        Some(f) => format!("{f} (WS \",\")?"),
        None => String::new(),
    })
}

/// A Python literal of `schema`'s type: its enum's values, a typed scalar, a list of its
/// items' type, or any literal.
fn value_expr(schema: &Value, depth: u32) -> String {
    if let Some(values) = schema["enum"].as_array() {
        let literals: Vec<String> = values.iter().filter_map(literal).collect();
        if !literals.is_empty() {
            return format!("({})", literals.join(" | "));
        }
    }
    if let Some(options) = schema["anyOf"].as_array().or(schema["oneOf"].as_array()) {
        let each: Vec<String> = options.iter().map(|o| value_expr(o, depth + 1)).collect();
        if !each.is_empty() && depth < MAX_DEPTH {
            return format!("({})", each.join(" | "));
        }
    }
    let typed = |t: &str| match t {
        "string" => "PYSTR".to_owned(),
        "integer" => "PYINT".to_owned(),
        "number" => "PYNUM".to_owned(),
        "boolean" => r#"("True" | "False")"#.to_owned(),
        "null" => r#""None""#.to_owned(),
        "array" if depth < MAX_DEPTH && schema["items"].is_object() => {
            let item = value_expr(&schema["items"], depth + 1);
            format!(r#"("[" WS ({item} (WS "," WS {item})* (WS ",")?)? WS "]")"#)
        }
        _ => "pyval".to_owned(),
    };
    match &schema["type"] {
        Value::String(t) => typed(t),
        Value::Array(ts) if !ts.is_empty() => {
            let each: Vec<String> = ts.iter().filter_map(Value::as_str).map(typed).collect();
            format!("({})", each.join(" | "))
        }
        _ => "pyval".to_owned(),
    }
}

/// An enum value as Lark literals of its Python text (a string in either quotes).
fn literal(v: &Value) -> Option<String> {
    let lark = |python: String| Value::String(python).to_string();
    Some(match v {
        Value::String(s) => {
            let single = format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"));
            format!("{} | {}", lark(v.to_string()), lark(single))
        }
        Value::Number(n) => lark(n.to_string()),
        Value::Bool(b) => lark(if *b { "True" } else { "False" }.into()),
        Value::Null => lark("None".into()),
        _ => return None,
    })
}
