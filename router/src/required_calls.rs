//! `tool_choice: "required"`'s answer read as it streams. The answer is drawn under a format
//! (`ToolRequest::format`): a JSON array of `{"name": ..., "parameters": {...}}` objects. Each
//! call is given out as soon as its name is complete, and its parameters' text as it arrives,
//! as vLLM streams forced calls, instead of the whole array at its end.
//!
//! A byte scanner over the JSON's structure: its structural characters are ASCII, and bytes of
//! multi-byte characters only occur inside strings, so no character is ever split.

/// What a call's object expects next.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Next {
    #[default]
    Key,
    Value,
}

/// A streamed call's progress, as the scanner reports it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Call `index`'s function is known.
    Begins { index: u32, name: String },
    /// More of call `index`'s parameters (JSON text).
    Arguments { index: u32, text: String },
}

/// Reads the array of calls as it streams (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct RequiredCalls {
    /// The answer so far.
    text: String,
    /// Bytes of `text` scanned.
    at: usize,
    /// Nesting: 1 inside the array, 2 inside a call's object.
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// Where the string being read began (its opening quote).
    string_start: usize,
    /// In a call's object: what comes next, and the last key read.
    next: Next,
    key: String,
    /// The current call: its function once read, where its parameters begin and end, the
    /// bytes of them given out, and whether its beginning went out.
    name: Option<String>,
    params: Option<usize>,
    params_end: Option<usize>,
    sent: usize,
    begun: bool,
    /// Calls begun.
    calls: u32,
}

impl RequiredCalls {
    /// Calls begun so far.
    pub(crate) fn calls(&self) -> u32 {
        self.calls
    }

    /// The answer received so far.
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    /// Reads `more` of the answer; what it completes goes to `out`.
    pub(crate) fn push(&mut self, more: &str, out: &mut Vec<Progress>) {
        self.text.push_str(more);
        while self.at < self.text.len() {
            let i = self.at;
            let b = self.text.as_bytes()[i];
            self.at += 1;
            self.scan(i, b, out);
        }
        self.give_out(out);
    }

    fn in_call_value(&self) -> bool {
        self.depth == 2 && self.next == Next::Value
    }

    fn scan(&mut self, i: usize, b: u8, out: &mut Vec<Progress>) {
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_string = false;
                self.string_ended(i);
            }
            return;
        }
        let starts_params =
            self.in_call_value() && self.key == "parameters" && self.params.is_none();
        match b {
            b'"' => {
                if starts_params {
                    self.params = Some(i);
                }
                self.in_string = true;
                self.string_start = i;
            }
            b'{' | b'[' => {
                if starts_params {
                    self.params = Some(i);
                }
                self.depth += 1;
                if self.depth == 2 {
                    // A new call's object.
                    self.next = Next::Key;
                    self.key.clear();
                    self.name = None;
                    self.params = None;
                    self.params_end = None;
                    self.sent = 0;
                    self.begun = false;
                }
            }
            b'}' | b']' => {
                if self.depth == 2 {
                    // The call's object ends: a scalar parameters value ends here.
                    self.end_params(i);
                    self.give_out(out);
                } else if self.depth == 3 {
                    // The parameters' object or array closes.
                    self.end_params(i + 1);
                }
                self.depth = self.depth.saturating_sub(1);
            }
            b':' if self.depth == 2 => self.next = Next::Value,
            b',' if self.depth == 2 => {
                self.end_params(i);
                self.next = Next::Key;
                self.key.clear();
            }
            b if starts_params && !b.is_ascii_whitespace() => self.params = Some(i),
            _ => {}
        }
    }

    /// A string of the call's object ended at `i` (its closing quote): a key, or the name.
    fn string_ended(&mut self, i: usize) {
        if self.depth != 2 {
            return;
        }
        let Ok(value) = serde_json::from_str::<String>(&self.text[self.string_start..=i]) else {
            return;
        };
        match self.next {
            Next::Key => self.key = value,
            Next::Value if self.key == "name" && self.name.is_none() => self.name = Some(value),
            Next::Value => {}
        }
    }

    /// The parameters' value ends before `end` (where it began and has not ended yet).
    fn end_params(&mut self, end: usize) {
        if self.params.is_some() && self.params_end.is_none() {
            self.params_end = Some(end);
        }
    }

    /// The current call's beginning once its name is known, and its parameters read so far.
    fn give_out(&mut self, out: &mut Vec<Progress>) {
        let Some(name) = &self.name else {
            return;
        };
        if !self.begun {
            self.begun = true;
            self.calls += 1;
            out.push(Progress::Begins {
                index: self.calls - 1,
                name: name.clone(),
            });
        }
        let Some(start) = self.params else {
            return;
        };
        // A scalar or string still coming stays back until it ends: its text may yet be cut
        // by the closing structure (`1` of `12`); objects and arrays go out as they come.
        let open_scalar =
            self.params_end.is_none() && !matches!(self.text.as_bytes()[start], b'{' | b'[');
        let end = match self.params_end {
            Some(end) => end,
            None if open_scalar => return,
            None => self.at,
        };
        let from = start + self.sent;
        if end > from {
            let text = &self.text[from..end];
            // The whitespace between a scalar and the `,` or `}` after it is not part of it.
            let text = if self.params_end.is_some() {
                text.trim_end()
            } else {
                text
            };
            out.push(Progress::Arguments {
                index: self.calls - 1,
                text: text.to_owned(),
            });
            self.sent = end - start;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads `text` cut at every position and joins the progress: each call's name and all of
    /// its parameters' text.
    fn read_cut(text: &str, cut: usize) -> Vec<(u32, String, String)> {
        let mut r = RequiredCalls::default();
        let mut out = Vec::new();
        r.push(&text[..cut], &mut out);
        r.push(&text[cut..], &mut out);
        let mut calls: Vec<(u32, String, String)> = Vec::new();
        for p in out {
            match p {
                Progress::Begins { index, name } => calls.push((index, name, String::new())),
                Progress::Arguments { index, text } => {
                    let call = calls
                        .iter_mut()
                        .find(|c| c.0 == index)
                        .expect("begun first");
                    call.2.push_str(&text);
                }
            }
        }
        calls
    }

    #[test]
    fn calls_come_out_as_they_stream_however_cut() {
        let text = r#"[{"name": "weather", "parameters": {"city": "Par\"is é", "days": [1, {"x": "}"}]}}, {"name":"time","parameters":{}}]"#;
        let want = vec![
            (
                0,
                "weather".to_owned(),
                r#"{"city": "Par\"is é", "days": [1, {"x": "}"}]}"#.to_owned(),
            ),
            (1, "time".to_owned(), "{}".to_owned()),
        ];
        for cut in (0..=text.len()).filter(|&c| text.is_char_boundary(c)) {
            assert_eq!(read_cut(text, cut), want, "cut at {cut}");
        }
    }

    #[test]
    fn the_name_goes_out_before_the_parameters_end() {
        let mut r = RequiredCalls::default();
        let mut out = Vec::new();
        r.push(r#"[{"name": "weather", "parameters": {"ci"#, &mut out);
        assert_eq!(
            out,
            vec![
                Progress::Begins {
                    index: 0,
                    name: "weather".into()
                },
                Progress::Arguments {
                    index: 0,
                    text: r#"{"ci"#.into()
                },
            ]
        );
        assert_eq!(r.calls(), 1);
        // Parameters written before the name wait for it; scalars wait for their end.
        let text = r#"[{"parameters": 12, "name": "f"}]"#;
        for cut in 0..=text.len() {
            assert_eq!(
                read_cut(text, cut),
                vec![(0, "f".to_owned(), "12".to_owned())],
                "cut at {cut}"
            );
        }
    }

    proptest::proptest! {
        /// Any text, however cut, reads without a panic, and what went out of a call's
        /// arguments is always a part of the text.
        #[test]
        fn any_text_reads_without_panicking(
            text in proptest::prop_oneof!["\\PC{0,80}", "[\\[\\]{}\":, a-z0-9\\\\]{0,80}"],
            cut in 0usize..80,
        ) {
            let mut cut = cut.min(text.len());
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            let mut r = RequiredCalls::default();
            let mut out = Vec::new();
            r.push(&text[..cut], &mut out);
            r.push(&text[cut..], &mut out);
            for p in out {
                if let Progress::Arguments { text: part, .. } = p {
                    proptest::prop_assert!(text.contains(part.as_str()));
                }
            }
        }
    }
}
