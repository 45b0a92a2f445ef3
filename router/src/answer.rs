//! What the router reads out of a chat answer's text before the client sees it: the thinking
//! of a reasoning model ([`crate::reasoning`]), then the tool calls in what remains
//! ([`crate::tools`]). Both front ends read answers through [`AnswerReader`], so an answer
//! reads the same over HTTP and gRPC.

use crate::reasoning::{self, ReasoningParser, ThinkSplitter};
use crate::tools::{self, CallPart, CallReader, Mode};

/// One batch of an answer, read: its thinking, its text and its calls (or parts of them).
#[derive(Debug, Default)]
pub(crate) struct Read {
    pub(crate) reasoning: String,
    pub(crate) text: String,
    pub(crate) calls: Vec<CallPart>,
}

/// Reads one answer, whole or as it streams.
#[derive(Debug)]
pub(crate) struct AnswerReader {
    think: Option<ThinkSplitter>,
    calls: CallReader,
}

impl AnswerReader {
    /// A reader for answers whose calls are read as `tools` says and whose thinking is split
    /// off by `reasoning`; `None` when there is nothing to read (plain text).
    pub(crate) fn new(tools: &Mode, reasoning: Option<ReasoningParser>) -> Option<AnswerReader> {
        if *tools == Mode::Text && reasoning.is_none() {
            return None;
        }
        Some(AnswerReader {
            think: reasoning.map(ThinkSplitter::new),
            calls: CallReader::new(tools.clone()),
        })
    }

    /// Reads `text`, the answer's next part; `end`: the answer ends with it.
    pub(crate) fn read(&mut self, text: &str, end: bool) -> Read {
        let (reasoning, answer) = match &mut self.think {
            Some(think) => {
                let mut parts = Vec::new();
                think.push(text, &mut parts);
                if end {
                    think.finish(&mut parts);
                }
                reasoning::join(parts)
            }
            None => (String::new(), text.to_owned()),
        };
        let mut pieces = Vec::new();
        self.calls.push(&answer, &mut pieces);
        if end {
            self.calls.finish(&mut pieces);
        }
        let (text, calls) = tools::join(pieces);
        Read {
            reasoning,
            text,
            calls,
        }
    }

    /// Whether the answer ended as calls the model chose (or was required) to make.
    pub(crate) fn ends_in_calls(&self) -> bool {
        self.calls.ends_in_calls()
    }

    /// The finish reason OpenAI gives (`"tool_calls"`, or the text's).
    pub(crate) fn finish_reason(&self, text_reason: &'static str) -> &'static str {
        self.calls.finish_reason(text_reason)
    }
}
