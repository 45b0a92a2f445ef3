use serde_json::json;

use super::*;

fn fields(v: Value) -> OtherFields {
    serde_json::from_value(v).expect("fields")
}

fn weather() -> Value {
    json!([
        {"type": "function", "function": {"name": "weather", "description": "Today's weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                "required": ["city"]}}},
        {"type": "function", "function": {"name": "time"}},
    ])
}

fn mode_of(v: Value, parser: Option<ToolCallParser>) -> Result<Mode, FieldError> {
    take(&mut fields(v), parser).map(|t| t.mode)
}

#[test]
fn choices_read_as_openai_defines_them() {
    let hermes = Some(ToolCallParser::Hermes);
    let auto = Mode::Auto {
        parser: ToolCallParser::Hermes,
        parallel: true,
    };
    assert_eq!(mode_of(json!({}), None), Ok(Mode::Text));
    assert_eq!(mode_of(json!({"tools": []}), None), Ok(Mode::Text));
    assert_eq!(
        mode_of(json!({"tool_choice": "auto"}), None),
        Ok(Mode::Text)
    );
    assert_eq!(
        mode_of(json!({"tools": weather()}), hermes),
        Ok(auto.clone())
    );
    assert_eq!(
        mode_of(json!({"tools": weather(), "tool_choice": "auto"}), hermes),
        Ok(auto)
    );
    assert_eq!(
        mode_of(
            json!({"tools": weather(), "parallel_tool_calls": false}),
            hermes
        ),
        Ok(Mode::Auto {
            parser: ToolCallParser::Hermes,
            parallel: false
        })
    );
    assert_eq!(
        mode_of(json!({"tools": weather(), "tool_choice": "none"}), None),
        Ok(Mode::Text)
    );
    assert_eq!(
        mode_of(json!({"tools": weather(), "tool_choice": "required"}), None),
        Ok(Mode::Required { parallel: true })
    );
    let named = json!({"type": "function", "function": {"name": "time"}});
    assert_eq!(
        mode_of(json!({"tools": weather(), "tool_choice": named}), None),
        Ok(Mode::Named("time".into()))
    );
    // The tools reach the template with "none" too: the model knows them, and calls none.
    let t = take(
        &mut fields(json!({"tools": weather(), "tool_choice": "none"})),
        None,
    )
    .expect("takes");
    assert_eq!(t.tools, Some(weather()));
}

#[test]
fn bad_tools_and_choices_are_refused_by_field() {
    let refused = |v: Value, parser: Option<ToolCallParser>, field: &str, says: &str| {
        let (f, message) = mode_of(v.clone(), parser).expect_err(&v.to_string());
        assert_eq!(f, field, "{v}: {message}");
        assert!(message.contains(says), "{v}: {message}");
    };
    let hermes = Some(ToolCallParser::Hermes);
    refused(
        json!({"tools": weather()}),
        None,
        "tool_choice",
        "--tool-call-parser",
    );
    refused(
        json!({"tools": {"a": 1}}),
        hermes,
        "tools",
        "must be a list",
    );
    refused(
        json!({"tools": [{"type": "retrieval"}]}),
        hermes,
        "tools",
        "tools[0].type",
    );
    refused(
        json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}),
        hermes,
        "tools",
        "tools[0].function.name",
    );
    refused(
        json!({"tools": [{"type": "function", "function": {}}]}),
        hermes,
        "tools",
        "tools[0].function.name",
    );
    refused(
        json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}),
        hermes,
        "tools",
        "parameters",
    );
    let twice = json!([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]);
    refused(json!({"tools": twice}), hermes, "tools", "twice");
    refused(
        json!({"tool_choice": "required"}),
        hermes,
        "tool_choice",
        "needs tools",
    );
    refused(
        json!({"tools": weather(), "tool_choice": "any"}),
        hermes,
        "tool_choice",
        "must be",
    );
    refused(
        json!({"tools": weather(), "tool_choice": {"type": "function", "function": {"name": "x"}}}),
        hermes,
        "tool_choice",
        "not one of the tools",
    );
    refused(
        json!({"tools": weather(), "parallel_tool_calls": "yes"}),
        hermes,
        "parallel_tool_calls",
        "boolean",
    );
    let mut completions = fields(json!({"tools": weather()}));
    assert_eq!(
        refuse_outside_chat(&mut completions).map_err(|e| e.0),
        Err("tools")
    );
    let mut inert =
        fields(json!({"tools": [], "tool_choice": "none", "parallel_tool_calls": true}));
    assert_eq!(refuse_outside_chat(&mut inert), Ok(()));
}

#[test]
fn forced_calls_are_drawn_under_formats_that_compile() {
    let take_with = |choice: Value, parallel: bool| {
        take(
            &mut fields(
                json!({"tools": weather(), "tool_choice": choice, "parallel_tool_calls": parallel}),
            ),
            None,
        )
        .expect("takes")
    };
    let named = take_with(
        json!({"type": "function", "function": {"name": "weather"}}),
        true,
    );
    let Some(Format::JsonSchema(schema)) = named.format() else {
        panic!("a schema")
    };
    assert_eq!(
        serde_json::from_str::<Value>(&schema).expect("json"),
        weather()[0]["function"]["parameters"]
    );
    Format::JsonSchema(schema).check().expect("compiles");
    // A function without parameters takes an object.
    let time = take_with(
        json!({"type": "function", "function": {"name": "time"}}),
        true,
    );
    assert_eq!(
        time.format(),
        Some(Format::JsonSchema(r#"{"type":"object"}"#.into()))
    );
    for parallel in [true, false] {
        let required = take_with(json!("required"), parallel);
        let Some(Format::JsonSchema(schema)) = required.format() else {
            panic!("a schema")
        };
        let v: Value = serde_json::from_str(&schema).expect("json");
        assert_eq!(v["minItems"], 1);
        assert_eq!(v["maxItems"], if parallel { json!(null) } else { json!(1) });
        assert_eq!(
            v["items"]["anyOf"][0]["properties"]["name"]["enum"][0],
            "weather"
        );
        assert_eq!(
            v["items"]["anyOf"][1]["properties"]["parameters"]["type"],
            "object"
        );
        Format::JsonSchema(schema).check().expect("compiles");
    }
    let auto = take(
        &mut fields(json!({"tools": weather()})),
        Some(ToolCallParser::Hermes),
    );
    assert_eq!(auto.expect("takes").format(), None);
}

/// The pieces with the calls' ids replaced by their index (ids are random).
fn without_ids(pieces: Vec<Piece>) -> Vec<Piece> {
    pieces
        .into_iter()
        .map(|p| match p {
            Piece::Call { index, id, name } => {
                let mistral = id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric());
                assert!(
                    (id.starts_with("call_") && id.len() == 29) || mistral,
                    "{id}"
                );
                Piece::Call {
                    index,
                    id: String::new(),
                    name,
                }
            }
            other => other,
        })
        .collect()
}

/// Reads `text` as `mode` in chunks cut at `cuts` (byte offsets); the pieces with texts and
/// arguments joined where they follow each other.
fn read(mode: &Mode, text: &str, cuts: &[usize]) -> (Vec<Piece>, &'static str) {
    let parser = match mode {
        Mode::Auto { parser, .. } => Some(*parser),
        _ => None,
    };
    let mut reader = CallReader::new(mode.clone(), CallIds::for_parser(parser));
    let mut pieces = Vec::new();
    let mut at = 0;
    for &cut in cuts.iter().chain([&text.len()]) {
        reader.push(&text[at..cut], &mut pieces);
        at = cut;
    }
    reader.finish(&mut pieces);
    let mut joined: Vec<Piece> = Vec::new();
    for p in without_ids(pieces) {
        match (joined.last_mut(), p) {
            (Some(Piece::Text(a)), Piece::Text(b)) => a.push_str(&b),
            (
                Some(Piece::Arguments { index: i, text: a }),
                Piece::Arguments { index: j, text: b },
            ) if *i == j => a.push_str(&b),
            (_, p) => joined.push(p),
        }
    }
    (joined, reader.finish_reason("stop"))
}

fn call(index: u32, name: &str) -> Piece {
    Piece::Call {
        index,
        id: String::new(),
        name: name.into(),
    }
}

fn args(index: u32, text: &str) -> Piece {
    Piece::Arguments {
        index,
        text: text.into(),
    }
}

const HERMES: Mode = Mode::Auto {
    parser: ToolCallParser::Hermes,
    parallel: true,
};

#[test]
fn hermes_calls_read_the_same_however_the_text_is_cut() {
    let text = "Let me check.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"time\"}</tool_call>\n";
    let want = vec![
        Piece::Text("Let me check.".into()),
        call(0, "weather"),
        args(0, r#"{"city":"Paris"}"#),
        call(1, "time"),
        args(1, "{}"),
    ];
    for a in 0..=text.len() {
        for b in a..=text.len() {
            assert_eq!(
                read(&HERMES, text, &[a, b]),
                (want.clone(), "tool_calls"),
                "cut at {a}, {b}"
            );
        }
    }
    // Without parallel calls, the first only.
    let one = Mode::Auto {
        parser: ToolCallParser::Hermes,
        parallel: false,
    };
    assert_eq!(read(&one, text, &[]).0, want[..3].to_vec());
}

#[test]
fn hermes_keeps_every_text_that_is_not_a_call() {
    // Plain text, whitespace and all, and a tag's beginning that never became one.
    for text in ["  Hello,\n world. \n", "a < b <tool", "x <tool_cal"] {
        for cut in 0..=text.len() {
            assert_eq!(
                read(&HERMES, text, &[cut]),
                (vec![Piece::Text(text.into())], "stop"),
                "{text:?} cut at {cut}"
            );
        }
    }
    // A block that is not a call stays text; text after a call is text.
    let text = "<tool_call>not json</tool_call> then <tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>\n\nDone.";
    assert_eq!(
        read(&HERMES, text, &[7, 40]),
        (
            vec![
                Piece::Text("<tool_call>not json</tool_call> then".into()),
                call(0, "f"),
                args(0, r#"{"a": 1}"#),
                Piece::Text("Done.".into()),
            ],
            "tool_calls"
        )
    );
    // An unclosed last call is read when it parses (cut off after the object), kept as text when not.
    assert_eq!(
        read(&HERMES, "<tool_call>{\"name\": \"time\"}", &[]),
        (vec![call(0, "time"), args(0, "{}")], "tool_calls")
    );
    assert_eq!(
        read(&HERMES, "<tool_call>{\"name\": \"ti", &[3]),
        (
            vec![Piece::Text("<tool_call>{\"name\": \"ti".into())],
            "stop"
        )
    );
}

#[test]
fn llama3_json_answers_are_calls_or_text() {
    let llama = Mode::Auto {
        parser: ToolCallParser::Llama3Json,
        parallel: true,
    };
    let text = "  {\"name\": \"weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": \"time\", \"arguments\": \"{}\"}\n";
    for cut in 0..=text.len() {
        assert_eq!(
            read(&llama, text, &[cut]),
            (
                vec![
                    call(0, "weather"),
                    args(0, r#"{"city":"Paris"}"#),
                    call(1, "time"),
                    args(1, "{}"),
                ],
                "tool_calls"
            ),
            "cut at {cut}"
        );
    }
    // Text streams as it comes; JSON that is not a call, or is cut off, is text.
    let mut reader = CallReader::new(llama.clone(), CallIds::OpenAi);
    let mut pieces = Vec::new();
    reader.push("Sure: {x}", &mut pieces);
    assert_eq!(pieces, vec![Piece::Text("Sure: {x}".into())]);
    for text in ["{\"answer\": 42}", "{\"name\": \"weather\", \"param", " \n"] {
        assert_eq!(
            read(&llama, text, &[1]),
            (vec![Piece::Text(text.into())], "stop"),
            "{text:?}"
        );
    }
    assert_eq!(read(&llama, "", &[]), (vec![], "stop"));
    // Without parallel calls, the first only.
    let one = Mode::Auto {
        parser: ToolCallParser::Llama3Json,
        parallel: false,
    };
    assert_eq!(read(&one, text, &[]).0.len(), 2);
}

#[test]
fn mistral_answers_are_calls_or_text() {
    let mistral = Mode::Auto {
        parser: ToolCallParser::Mistral,
        parallel: true,
    };
    let want = vec![
        call(0, "weather"),
        args(0, r#"{"city":"Paris"}"#),
        call(1, "time"),
        args(1, "{}"),
    ];
    // The array of v0.3 to Small 3.1, and v11's name and arguments per call, however cut.
    for text in [
        " [{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"time\", \"arguments\": {}}]",
        "weather{\"city\": \"Paris\"}time{}",
    ] {
        for cut in 0..=text.len() {
            assert_eq!(
                read(&mistral, text, &[cut]),
                (want.clone(), "tool_calls"),
                "{text:?} cut at {cut}"
            );
        }
    }
    // Text streams once its first word shows it is not a call; what is not calls is text.
    let mut reader = CallReader::new(mistral.clone(), CallIds::Mistral);
    let mut pieces = Vec::new();
    reader.push("Hell", &mut pieces);
    assert_eq!(pieces, vec![]);
    reader.push("o, Paris", &mut pieces);
    assert_eq!(pieces, vec![Piece::Text("Hello, Paris".into())]);
    for text in [
        "[1] A citation.",
        "[{\"name\": \"weather\", \"argu",
        "json{not json}",
        "f{\"a\": 1} and text",
        "Sure.",
        "42{}",
    ] {
        assert_eq!(
            read(&mistral, text, &[2]),
            (vec![Piece::Text(text.into())], "stop"),
            "{text:?}"
        );
    }
    // Nine-character ids, which Mistral's templates require, for chosen and forced calls.
    for mode in [mistral, Mode::Named("weather".into())] {
        let mut reader = CallReader::new(mode, CallIds::Mistral);
        let mut pieces = Vec::new();
        reader.push("weather{\"city\": \"Paris\"}", &mut pieces);
        reader.finish(&mut pieces);
        let Some(Piece::Call { id, .. }) = pieces.first() else {
            panic!("{pieces:?}");
        };
        assert!(
            id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()),
            "{id}"
        );
    }
}

#[test]
fn calls_after_text_are_found_by_their_control_token() {
    let mistral = Mode::Auto {
        parser: ToolCallParser::Mistral,
        parallel: true,
    };
    let llama = Mode::Auto {
        parser: ToolCallParser::Llama3Json,
        parallel: true,
    };
    let want = vec![
        Piece::Text("Let me check.".into()),
        call(0, "weather"),
        args(0, r#"{"city":"Paris"}"#),
        call(1, "time"),
        args(1, "{}"),
    ];
    for (mode, text) in [
        (
            &mistral,
            "Let me check. [TOOL_CALLS][{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"time\", \"arguments\": {}}]",
        ),
        (
            &mistral,
            "Let me check.[TOOL_CALLS]weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]time[CALL_ID]a1b2c3d4e[ARGS]{}",
        ),
        (
            &llama,
            "Let me check.\n<|python_tag|>{\"name\": \"weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": \"time\", \"parameters\": {}}",
        ),
    ] {
        for cut in (0..=text.len()).filter(|&c| text.is_char_boundary(c)) {
            assert_eq!(
                read(mode, text, &[cut]),
                (want.clone(), "tool_calls"),
                "{text:?} cut at {cut}"
            );
        }
    }
    // Text streams up to what may begin the marker; a marker's beginning that never
    // completes, or calls that do not parse, are text as written.
    let mut reader = CallReader::new(mistral.clone(), CallIds::Mistral);
    let mut pieces = Vec::new();
    reader.push("Sure [TOOL", &mut pieces);
    // (The space waits for what follows it: it is not the answer's before a call.)
    assert_eq!(pieces, vec![Piece::Text("Sure".into())]);
    for text in ["Sure [TOOL", "Sure.[TOOL_CALLS]not calls"] {
        assert_eq!(
            read(&mistral, text, &[]),
            (vec![Piece::Text(text.into())], "stop"),
            "{text:?}"
        );
    }
    let (pieces, _) = read(&mistral, "Sure.[TOOL_CALLS]not calls", &[]);
    assert_eq!(
        pieces,
        vec![Piece::Text("Sure.[TOOL_CALLS]not calls".into())]
    );
}

#[test]
fn pythonic_answers_are_calls_or_text() {
    let pythonic = Mode::Auto {
        parser: ToolCallParser::Pythonic,
        parallel: true,
    };
    let text = "[weather(city='Paris'), time()]";
    for cut in 0..=text.len() {
        assert_eq!(
            read(&pythonic, text, &[cut]),
            (
                vec![
                    call(0, "weather"),
                    args(0, r#"{"city":"Paris"}"#),
                    call(1, "time"),
                    args(1, "{}"),
                ],
                "tool_calls"
            ),
            "cut at {cut}"
        );
    }
    let mut reader = CallReader::new(pythonic.clone(), CallIds::OpenAi);
    let mut pieces = Vec::new();
    reader.push(" Paris", &mut pieces);
    assert_eq!(pieces, vec![Piece::Text(" Paris".into())]);
    for text in ["[1] A citation.", "[weather(city='Par"] {
        assert_eq!(
            read(&pythonic, text, &[3]),
            (vec![Piece::Text(text.into())], "stop"),
            "{text:?}"
        );
    }
}

#[test]
fn required_and_named_answers_become_calls() {
    let required = Mode::Required { parallel: true };
    let text = r#"[{"name": "weather", "parameters": {"city": "Paris"}}, {"name": "time", "parameters": {}}]"#;
    // Streamed: each call as soon as its name is complete, its arguments as they come.
    for cut in 0..=text.len() {
        assert_eq!(
            read(&required, text, &[cut]),
            (
                vec![
                    call(0, "weather"),
                    args(0, r#"{"city": "Paris"}"#),
                    call(1, "time"),
                    args(1, "{}"),
                ],
                "tool_calls"
            ),
            "cut at {cut}"
        );
    }
    let whole = |text: &str| {
        let mut reader = CallReader::new(required.clone(), CallIds::OpenAi);
        let mut pieces = Vec::new();
        reader.read_whole(text, &mut pieces);
        (without_ids(pieces), reader.finish_reason("length"))
    };
    // Whole: read at once.
    assert_eq!(
        whole(text),
        (
            vec![
                call(0, "weather"),
                args(0, r#"{"city":"Paris"}"#),
                call(1, "time"),
                args(1, "{}"),
            ],
            "tool_calls"
        )
    );
    // Cut off by the length limit: whole, the text, not a broken call; streamed, the call
    // stands as it went out.
    assert_eq!(
        whole(&text[..30]),
        (vec![Piece::Text(text[..30].into())], "length")
    );
    assert_eq!(
        read(&required, &text[..30], &[]),
        (vec![call(0, "weather")], "tool_calls")
    );
    assert_eq!(
        read(&required, &text[..5], &[]),
        (vec![Piece::Text(text[..5].into())], "stop")
    );
    // A named call streams its arguments as they come, and ends as the text would.
    let named = Mode::Named("weather".into());
    let mut reader = CallReader::new(named.clone(), CallIds::OpenAi);
    let mut pieces = Vec::new();
    reader.push("{\"city\": ", &mut pieces);
    reader.push("\"Paris\"}", &mut pieces);
    reader.finish(&mut pieces);
    assert_eq!(
        without_ids(pieces),
        vec![
            call(0, "weather"),
            args(0, "{\"city\": "),
            args(0, "\"Paris\"}")
        ]
    );
    assert_eq!(reader.finish_reason("stop"), "stop");
    assert_eq!(reader.calls(), 1);
    // Even an empty answer is the call the client forced.
    assert_eq!(read(&named, "", &[]), (vec![call(0, "weather")], "stop"));
}

/// Whether `format` lets a model whose tokens are single bytes write `text` and end there.
fn drawable(format: &Format, text: &str) -> bool {
    drawable_tokens(format, &text.bytes().map(u32::from).collect::<Vec<_>>())
}

/// The test token space's Mistral control tokens (after the bytes and `<end>`).
const MISTRAL: CallTokens = CallTokens {
    tool_calls: Some(257),
    args: Some(258),
    call_id: Some(259),
    python_start: None,
    python_end: None,
};

/// `text` in the test token space: bytes, with Mistral's control tokens written out as theirs.
fn mistral_ids(text: &str) -> Vec<u32> {
    let mut ids = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let special = [("[TOOL_CALLS]", 257), ("[ARGS]", 258), ("[CALL_ID]", 259)]
            .into_iter()
            .find(|(t, _)| rest.starts_with(t));
        match special {
            Some((t, id)) => {
                ids.push(id);
                rest = &rest[t.len()..];
            }
            None => {
                ids.push(u32::from(rest.as_bytes()[0]));
                rest = &rest[1..];
            }
        }
    }
    ids
}

/// Whether `ids` (bytes 0-255, 256 the end, 257-259 Mistral's control tokens) may be drawn
/// whole under `format`, and the end after them.
fn drawable_tokens(format: &Format, ids: &[u32]) -> bool {
    use dolphin_grammar::{TokenSpace, TokenText};
    let mut tokens: Vec<TokenText> = (0u8..=255).map(|b| TokenText::Bytes(vec![b])).collect();
    for special in ["<end>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"] {
        tokens.push(TokenText::Special(special.into()));
    }
    let n = tokens.len();
    let space = TokenSpace::new(tokens, n as u32, &[256]).expect("space");
    let mut c = space.constrain(format).expect("compiles");
    for &id in ids {
        let mut logits = vec![0.0f32; n];
        c.mask(&mut logits).expect("mask");
        if logits[id as usize] != 0.0 || c.consume(id).is_err() {
            return false;
        }
    }
    let mut logits = vec![0.0f32; n];
    c.mask(&mut logits).expect("mask");
    logits[256] == 0.0
}

/// The grammar `tools` (with `strict` ones) are drawn under by `parser`'s call format in a
/// vocabulary with `tokens`; checked to compile.
fn strict_grammar(
    tools: &Value,
    parser: ToolCallParser,
    tokens: CallTokens,
    parallel: bool,
) -> Format {
    let r = take(
        &mut fields(json!({"tools": tools, "parallel_tool_calls": parallel})),
        Some(parser),
    )
    .expect("take");
    let g = r.strict_format(tokens).expect("a grammar");
    assert!(Format::check(&g).is_ok(), "{g:?}");
    g
}

/// Strict tools in the pythonic format: free text, or a list of calls whose keyword arguments
/// follow a strict tool's schema (its order, required ones present, literals of their types,
/// an enum's values), any keywords for the others; Llama 4's control tokens around the list
/// where the vocabulary has them. What the grammar lets through, the reader reads as calls.
#[test]
fn strict_tools_in_the_pythonic_format() {
    let tools = json!([
        {"type": "function", "function": {"name": "weather", "strict": true,
            "parameters": {"type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": ["integer", "null"]},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "exact": {"type": "boolean"}},
                "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "time"}},
        {"type": "function", "function": {"name": "not-python"}},
    ]);
    let grammar = |tokens: CallTokens, parallel: bool| {
        strict_grammar(&tools, ToolCallParser::Pythonic, tokens, parallel)
    };
    let g = grammar(CallTokens::default(), true);
    for (text, want) in [
        ("It is sunny.", true),
        ("", true),
        ("[1] a footnote", false),
        (r#"[weather(city="Rome", unit="celsius")]"#, true),
        (
            r#"[weather(city='Rome', unit='fahrenheit', days=3, tags=["a", 'b'], exact=True,)]"#,
            true,
        ),
        (
            r#"[weather(city="Rome", unit="celsius", days=None), time(zone="UTC", n=[1, {"a": (2,)}])]"#,
            true,
        ),
        (
            r#"[weather(city="Rome", unit="celsius", exact=False)]"#,
            true,
        ),
        (r#"[weather(city="Rome")]"#, false),
        (r#"[weather(city="Rome", unit="kelvin")]"#, false),
        (r#"[weather(unit="celsius", city="Rome")]"#, false),
        (r#"[weather(city="Rome", unit="celsius", days="3")]"#, false),
        (r#"[weather(city="Rome", unit="celsius", town="x")]"#, false),
        (r#"[clock()]"#, false),
    ] {
        assert_eq!(drawable(&g, text), want, "pythonic: {text}");
        if want && text.starts_with('[') {
            assert!(
                crate::pythonic::calls(text).is_some(),
                "read as calls: {text}"
            );
        }
    }
    let single = grammar(CallTokens::default(), false);
    assert!(drawable(&single, "[time()]"));
    assert!(
        !drawable(&single, "[time(), time()]"),
        "one call without parallel_tool_calls"
    );
    // Llama 4: the list between its control tokens, which text cannot write.
    let llama4 = grammar(
        CallTokens {
            python_start: Some(257),
            python_end: Some(258),
            ..CallTokens::default()
        },
        true,
    );
    let mut ids = vec![257];
    ids.extend(r#"[weather(city="Rome", unit="celsius")]"#.bytes().map(u32::from));
    ids.push(258);
    assert!(drawable_tokens(&llama4, &ids));
    assert!(drawable(&llama4, "[time()]"), "the tokens are optional");
}

/// Strict tools in Mistral's formats: each vocabulary's (v11 with `[ARGS]`, the earlier JSON
/// array after `[TOOL_CALLS]`, a bare array without control tokens) draws free text or calls
/// whose arguments follow the strict tool's schema; text cannot start as calls.
#[test]
fn strict_tools_in_mistrals_formats() {
    let tools = json!([
        {"type": "function", "function": {"name": "weather", "strict": true,
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                "required": ["city"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "time"}},
    ]);
    let grammar = |vocab: CallTokens, parallel: bool| {
        strict_grammar(&tools, ToolCallParser::Mistral, vocab, parallel)
    };
    let ok = |g: &Format, text: &str| drawable_tokens(g, &mistral_ids(text));
    let text_cases = [
        ("Sunny, I think.", true),
        ("", true),
        ("[1] is a footnote", false),
        ("weather{\"city\": \"Rome\"}", false),
        ("weather report: sunny", true),
    ];
    // v11: `[TOOL_CALLS]name[ARGS]{...}`, after text too, an id optional.
    let v11 = grammar(MISTRAL, true);
    for (text, want) in text_cases.into_iter().chain([
        (r#"[TOOL_CALLS]weather[ARGS]{"city": "Rome"}"#, true),
        (
            r#"Let me see.[TOOL_CALLS]weather[ARGS]{"city": "Rome"}"#,
            true,
        ),
        (
            r#"[TOOL_CALLS]weather[ARGS]{"city": "Rome"}[TOOL_CALLS]time[ARGS]{}"#,
            true,
        ),
        (
            r#"[TOOL_CALLS]weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Rome"}"#,
            true,
        ),
        (r#"[TOOL_CALLS]weather[ARGS]{"town": "Rome"}"#, false),
        (r#"[TOOL_CALLS]clock[ARGS]{}"#, false),
    ]) {
        assert_eq!(ok(&v11, text), want, "v11: {text}");
    }
    let single = grammar(MISTRAL, false);
    assert!(!ok(
        &single,
        r#"[TOOL_CALLS]weather[ARGS]{"city": "Rome"}[TOOL_CALLS]time[ARGS]{}"#
    ));
    // The earlier vocabularies: a JSON array after `[TOOL_CALLS]`, or the whole answer.
    let v3 = grammar(
        CallTokens {
            args: None,
            call_id: None,
            ..MISTRAL
        },
        true,
    );
    let array = r#"[{"name": "weather", "arguments": {"city": "Rome"}}, {"name": "time", "arguments": {}}]"#;
    for (text, want) in text_cases.into_iter().chain([
        (format!("[TOOL_CALLS] {array}").as_str(), true),
        (array, true),
        (
            r#"[TOOL_CALLS] [{"name": "weather", "arguments": {"town": "Rome"}}]"#,
            false,
        ),
    ]) {
        assert_eq!(ok(&v3, text), want, "v3: {text}");
    }
    let bare = grammar(CallTokens::default(), true);
    assert!(ok(&bare, array));
    assert!(ok(&bare, "Sunny."));
    // Without the token, calls after text are not read as calls: that is text, free.
    assert!(ok(&bare, &format!("Sure. {array}")));
    assert!(!ok(&bare, r#"[{"name": "weather", "arguments": {}}]"#));
}

/// Strict tools under `"auto"`: the model may answer in text or call, and a call it makes
/// follows the strict tool's schema (any object for the others), in Hermes' and Llama 3's
/// formats; without a strict tool, or with a forced choice, no such grammar is drawn under.
#[test]
fn strict_tools_under_auto_constrain_the_calls_not_the_choice() {
    let tools = json!([
        {"type": "function", "function": {"name": "weather", "strict": true,
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                "required": ["city"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "time"}},
    ]);
    let request = |parser, parallel: bool| {
        take(
            &mut fields(json!({"tools": tools, "parallel_tool_calls": parallel})),
            Some(parser),
        )
        .expect("take")
    };
    let hermes = request(ToolCallParser::Hermes, true)
        .strict_format(CallTokens::default())
        .expect("a grammar");
    assert!(Format::check(&hermes).is_ok(), "{hermes:?}");
    let call = |args: &str| {
        format!("<tool_call>\n{{\"name\": \"weather\", \"arguments\": {args}}}\n</tool_call>")
    };
    for (text, ok) in [
        ("Sunny, I think.".to_owned(), true),
        (String::new(), true),
        ("a < b, and <tool_ is no call".into(), true),
        (format!("Let me look.{}", call(r#"{"city": "Rome"}"#)), true),
        (
            format!(
                "{}\n{}",
                call(r#"{"city": "Rome"}"#),
                call(r#"{"city": "Oslo"}"#)
            ),
            true,
        ),
        (
            r#"<tool_call>{"name": "time", "arguments": {"zone": "UTC"}}</tool_call>"#.into(),
            true,
        ),
        (call(r#"{"town": "Rome"}"#), false),
        (call("{}"), false),
        (
            r#"<tool_call>{"name": "clock", "arguments": {}}</tool_call>"#.into(),
            false,
        ),
    ] {
        assert_eq!(drawable(&hermes, &text), ok, "hermes: {text}");
    }
    let single = request(ToolCallParser::Hermes, false)
        .strict_format(CallTokens::default())
        .expect("a grammar");
    let two = format!(
        "{}{}",
        call(r#"{"city": "Rome"}"#),
        call(r#"{"city": "Oslo"}"#)
    );
    assert!(drawable(&single, &call(r#"{"city": "Rome"}"#)));
    assert!(
        !drawable(&single, &two),
        "one call without parallel_tool_calls"
    );

    let llama = request(ToolCallParser::Llama3Json, true)
        .strict_format(CallTokens::default())
        .expect("a grammar");
    assert!(Format::check(&llama).is_ok(), "{llama:?}");
    for (text, ok) in [
        ("It is sunny {mostly}.", true),
        (
            r#"{"name": "weather", "parameters": {"city": "Rome"}}"#,
            true,
        ),
        (
            r#"{"name": "weather", "parameters": {"city": "Rome"}}; {"name": "time", "parameters": {}}"#,
            true,
        ),
        (
            r#"{"name": "weather", "parameters": {"town": "Rome"}}"#,
            false,
        ),
        (r#"{"answer": 42}"#, false),
    ] {
        assert_eq!(drawable(&llama, text), ok, "llama3_json: {text}");
    }

    // No strict tool, or a forced choice: no such grammar.
    let lax = take(
        &mut fields(json!({"tools": weather()})),
        Some(ToolCallParser::Hermes),
    )
    .expect("take");
    assert!(lax.strict_format(CallTokens::default()).is_none());
    let forced = take(
        &mut fields(json!({"tools": tools, "tool_choice": "required"})),
        Some(ToolCallParser::Hermes),
    )
    .expect("take");
    assert!(forced.strict_format(CallTokens::default()).is_none() && forced.format().is_some());
}
