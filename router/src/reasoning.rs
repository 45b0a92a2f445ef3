//! Reasoning models' thinking, split from their answer: the text between `<think>` and
//! `</think>` goes out as `reasoning_content` (the name DeepSeek's API and vLLM's
//! `--reasoning-parser` use) and the rest as the answer, whole or as it streams. The answer
//! alone then goes on to the tool call reader.

/// How a model marks its thinking.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReasoningParser {
    /// DeepSeek-R1 and its distills: the template opens `<think>` in the prompt, so the answer
    /// starts inside the thinking (an opening tag, when the model writes one, is dropped) and
    /// `</think>` ends it.
    #[value(name = "deepseek_r1", alias = "deepseek-r1")]
    DeepseekR1,
    /// Qwen3 (and QwQ): thinking only where the answer starts with `<think>`; with thinking
    /// turned off (`chat_template_kwargs: {"enable_thinking": false}`) it is all answer.
    Qwen3,
}

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// A part of an answer read by [`ThinkSplitter`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Part {
    /// Thinking.
    Reasoning(String),
    /// The answer.
    Answer(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: whether thinking opens is not known.
    Start,
    Thinking,
    /// After `</think>`, nothing but whitespace yet (dropped before the answer).
    Closed,
    Answer,
}

/// Splits one answer's text, as it streams, into thinking and answer.
#[derive(Debug)]
pub(crate) struct ThinkSplitter {
    parser: ReasoningParser,
    state: State,
    /// Text not given out yet: what may be a tag, or whitespace before a decision.
    held: String,
}

impl ThinkSplitter {
    /// A splitter for answers of models that mark their thinking as `parser` says.
    pub(crate) fn new(parser: ReasoningParser) -> ThinkSplitter {
        ThinkSplitter {
            parser,
            state: State::Start,
            held: String::new(),
        }
    }

    /// Reads `text`, the answer's next part.
    pub(crate) fn push(&mut self, text: &str, out: &mut Vec<Part>) {
        self.held.push_str(text);
        loop {
            match self.state {
                State::Start => {
                    let start = self.held.trim_start();
                    if let Some(rest) = start.strip_prefix(OPEN) {
                        self.held = rest.to_owned();
                        self.state = State::Thinking;
                    } else if OPEN.starts_with(start) {
                        // Whitespace, or the start of `<think>`: wait.
                        return;
                    } else {
                        self.state = match self.parser {
                            ReasoningParser::DeepseekR1 => State::Thinking,
                            ReasoningParser::Qwen3 => State::Answer,
                        };
                    }
                }
                State::Thinking => match self.held.find(CLOSE) {
                    Some(end) => {
                        let thought: String = self.held[..end].to_owned();
                        self.held.drain(..end + CLOSE.len());
                        push_part(out, Part::Reasoning(thought));
                        self.state = State::Closed;
                    }
                    None => {
                        let keep = crate::tools::partial_suffix(&self.held, CLOSE);
                        let ready: String = self.held[..self.held.len() - keep].to_owned();
                        self.held.drain(..ready.len());
                        push_part(out, Part::Reasoning(ready));
                        return;
                    }
                },
                State::Closed => {
                    let rest = self.held.trim_start();
                    if rest.is_empty() {
                        self.held.clear();
                        return;
                    }
                    self.held = rest.to_owned();
                    self.state = State::Answer;
                }
                State::Answer => {
                    push_part(out, Part::Answer(std::mem::take(&mut self.held)));
                    return;
                }
            }
        }
    }

    /// Reads what is left at the answer's end: thinking cut off stays thinking.
    pub(crate) fn finish(&mut self, out: &mut Vec<Part>) {
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Thinking => push_part(out, Part::Reasoning(held)),
            State::Start if self.parser == ReasoningParser::DeepseekR1 => {
                push_part(out, Part::Reasoning(held));
            }
            State::Start | State::Answer => push_part(out, Part::Answer(held)),
            State::Closed => {}
        }
    }
}

/// Adds a part, leaving out empty ones.
fn push_part(out: &mut Vec<Part>, part: Part) {
    match &part {
        Part::Reasoning(t) | Part::Answer(t) if t.is_empty() => {}
        _ => out.push(part),
    }
}

/// Where a chat answer's format (structured output, a forced tool call) starts for a reasoning
/// model whose rendered prompt is `prompt`: after the tokens of `</think>` (the answer
/// thinks first), or at once (empty) where the prompt ends with the thinking closed already
/// (Qwen3's template with `enable_thinking: false` writes an empty `<think></think>`).
pub(crate) fn format_gate(tokenizer: &dyn crate::tokenizer::Tokenizer, prompt: &[u32]) -> Vec<u32> {
    // The tail is enough: a closed thinking is the last thing the prompt holds.
    let tail = tokenizer.decode(&prompt[prompt.len().saturating_sub(32)..]);
    if tail.trim_end().ends_with(CLOSE) {
        return Vec::new();
    }
    tokenizer.encode(CLOSE).unwrap_or_default()
}

/// The thinking and the answer of `parts`, each joined.
pub(crate) fn join(parts: Vec<Part>) -> (String, String) {
    let (mut reasoning, mut answer) = (String::new(), String::new());
    for p in parts {
        match p {
            Part::Reasoning(t) => reasoning.push_str(&t),
            Part::Answer(t) => answer.push_str(&t),
        }
    }
    (reasoning, answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `text` read in chunks cut at `cuts`: the thinking and the answer.
    fn split(parser: ReasoningParser, text: &str, cuts: &[usize]) -> (String, String) {
        let mut s = ThinkSplitter::new(parser);
        let mut parts = Vec::new();
        let mut at = 0;
        for &cut in cuts.iter().chain([&text.len()]) {
            s.push(&text[at..cut], &mut parts);
            at = cut;
        }
        s.finish(&mut parts);
        join(parts)
    }

    fn every_cut(parser: ReasoningParser, text: &str, want: (&str, &str)) {
        for a in 0..=text.len() {
            for b in a..=text.len() {
                let got = split(parser, text, &[a, b]);
                assert_eq!(
                    (got.0.as_str(), got.1.as_str()),
                    want,
                    "{parser:?} {text:?} cut at {a}, {b}"
                );
            }
        }
    }

    #[test]
    fn thinking_and_answer_split_however_the_text_is_cut() {
        use ReasoningParser::{DeepseekR1, Qwen3};
        let text = "<think>\nLet me see: 2 + 2 < 5.\n</think>\n\nIt is 4.";
        let want = ("\nLet me see: 2 + 2 < 5.\n", "It is 4.");
        every_cut(Qwen3, text, want);
        every_cut(DeepseekR1, text, want);
        // R1's template opened the thinking in the prompt.
        every_cut(DeepseekR1, "Hmm.</think>Four.", ("Hmm.", "Four."));
        // Qwen3 without thinking: all answer, whitespace and all.
        every_cut(Qwen3, " It is <b>4</b>.", ("", " It is <b>4</b>."));
        every_cut(Qwen3, "<thin", ("", "<thin"));
        // Cut off while thinking: thinking.
        every_cut(
            Qwen3,
            "<think>still thinking </th",
            ("still thinking </th", ""),
        );
        every_cut(DeepseekR1, "still", ("still", ""));
        assert_eq!(split(Qwen3, "", &[]), (String::new(), String::new()));
    }

    #[test]
    fn a_format_starts_after_the_thinking_unless_the_prompt_closed_it() {
        use crate::tokenizer::{SimTokenizer, Tokenizer};
        let tok = SimTokenizer;
        let prompt = |text: &str| Tokenizer::encode(&tok, text).expect("encodes");
        let close = Tokenizer::encode(&tok, CLOSE).expect("encodes");
        assert_eq!(format_gate(&tok, &prompt("<|im_start|>assistant\n")), close);
        assert_eq!(format_gate(&tok, &prompt("assistant\n<think>\n")), close);
        assert!(format_gate(&tok, &prompt("assistant\n<think>\n\n</think>\n\n")).is_empty());
    }

    #[test]
    fn thinking_streams_as_it_comes() {
        let mut s = ThinkSplitter::new(ReasoningParser::Qwen3);
        let mut parts = Vec::new();
        s.push("<think>a", &mut parts);
        s.push("b</", &mut parts);
        assert_eq!(
            parts,
            vec![Part::Reasoning("a".into()), Part::Reasoning("b".into())]
        );
        s.push("think>\n\nc", &mut parts);
        assert_eq!(parts[2..], [Part::Answer("c".into())]);
    }
}
