//! What the router reads out of a chat answer's text before the client sees it: the thinking
//! of a reasoning model ([`crate::reasoning`]), then the tool calls in what remains
//! ([`crate::tools`]). Both front ends read answers through [`AnswerReader`], so an answer
//! reads the same over HTTP and gRPC.

use crate::reasoning::{self, ReasoningParser, ThinkSplitter};
use crate::tools::{self, CallIds, CallPart, CallReader, Mode, ToolCallParser};

/// How the router reads chat answers beyond a request's own tool mode: the thinking split off
/// by the router's `--reasoning-parser`, and call ids as its `--tool-call-parser`'s models
/// need them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Readers {
    pub(crate) reasoning: Option<ReasoningParser>,
    pub(crate) ids: CallIds,
}

impl Readers {
    /// The router's readers, from its parsers.
    pub(crate) fn of(reasoning: Option<ReasoningParser>, tools: Option<ToolCallParser>) -> Self {
        Readers {
            reasoning,
            ids: CallIds::for_parser(tools),
        }
    }
}

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
    /// Some of the answer was read before (it streams).
    streams: bool,
}

impl AnswerReader {
    /// A reader for answers whose calls are read as `tools` says and whose thinking is split
    /// off as `readers` say; `None` when there is nothing to read (plain text).
    pub(crate) fn new(tools: &Mode, readers: Readers) -> Option<AnswerReader> {
        if *tools == Mode::Text && readers.reasoning.is_none() {
            return None;
        }
        Some(AnswerReader {
            think: readers.reasoning.map(ThinkSplitter::new),
            calls: CallReader::new(tools.clone(), readers.ids),
            streams: false,
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
        if end && !self.streams {
            self.calls.read_whole(&answer, &mut pieces);
        } else {
            self.calls.push(&answer, &mut pieces);
            if end {
                self.calls.finish(&mut pieces);
            }
        }
        self.streams = true;
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

    /// Whether the answer made any call, a named (forced) one included.
    pub(crate) fn made_calls(&self) -> bool {
        self.calls.made_calls()
    }

    /// The finish reason OpenAI gives (`"tool_calls"`, or the text's).
    pub(crate) fn finish_reason(&self, text_reason: &'static str) -> &'static str {
        self.calls.finish_reason(text_reason)
    }
}
