//! Streaming detokenization: token ids in, text out, never splitting a UTF-8 character.
//!
//! Byte-level tokens can end in the middle of a character (an emoji is often two or three
//! tokens). The decoder keeps the incomplete tail and emits it once the next tokens complete it.
//! Bytes that can never become valid UTF-8 are emitted as U+FFFD at once, so a bad token cannot
//! stall the stream; [`StreamDecoder::finish`] flushes a tail cut short by the end of output.

use crate::tokenizer::GgufTokenizer;

/// Turns a stream of token ids into text deltas.
#[derive(Clone, Debug, Default)]
pub struct StreamDecoder {
    /// Bytes of an incomplete character (at most 3).
    pending: Vec<u8>,
    /// Whether special tokens are left out of the text.
    keep_special: bool,
}

impl StreamDecoder {
    /// A decoder that skips special tokens (as [`GgufTokenizer::decode`] does).
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// A decoder that also emits the text of special tokens such as `<|im_end|>`.
    pub fn keeping_special() -> StreamDecoder {
        StreamDecoder {
            pending: Vec::new(),
            keep_special: true,
        }
    }

    /// Adds tokens and returns the text they complete (possibly empty).
    pub fn push(&mut self, tokenizer: &GgufTokenizer, ids: &[u32]) -> String {
        for &id in ids {
            tokenizer.append_token_bytes(id, !self.keep_special, &mut self.pending);
        }
        self.take_complete()
    }

    /// Adds raw bytes and returns the text they complete (possibly empty).
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        self.take_complete()
    }

    /// Ends the stream: returns any held-back bytes, an incomplete character as U+FFFD.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }

    /// Whether bytes of an incomplete character are held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Moves every complete character (and U+FFFD for every invalid sequence) out of `pending`,
    /// keeping only an incomplete character at the end.
    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, tail) = rest.split_at(e.valid_up_to());
                    // valid_up_to guarantees `valid` is UTF-8.
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        // The tail is a prefix of a character that later bytes may complete.
                        None => {
                            rest = tail;
                            break;
                        }
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &tail[bad..];
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let start = self.pending.len() - keep;
        self.pending.drain(..start);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn holds_back_split_characters() {
        let mut d = StreamDecoder::new();
        let dolphin = "🐬".as_bytes();
        assert_eq!(d.push_bytes(b"hi "), "hi ");
        assert_eq!(d.push_bytes(&dolphin[..1]), "");
        assert_eq!(d.push_bytes(&dolphin[1..3]), "");
        assert!(d.has_pending());
        assert_eq!(d.push_bytes(&[dolphin[3], b'!']), "🐬!");
        assert!(!d.has_pending());
        assert_eq!(d.finish(), "");
    }

    #[test]
    fn invalid_bytes_do_not_stall_the_stream() {
        let mut d = StreamDecoder::new();
        // 0xff is never valid; 0xe6 0x97 then 'x' is a broken 3-byte sequence.
        assert_eq!(d.push_bytes(&[b'a', 0xff, b'b']), "a\u{FFFD}b");
        assert_eq!(d.push_bytes(&[0xe6, 0x97]), "");
        assert_eq!(d.push_bytes(b"x"), "\u{FFFD}x");
    }

    #[test]
    fn finish_flushes_an_incomplete_tail() {
        let mut d = StreamDecoder::new();
        assert_eq!(d.push_bytes(&"é".as_bytes()[..1]), "");
        assert_eq!(d.finish(), "\u{FFFD}");
        assert!(!d.has_pending());
    }

    proptest! {
        #[test]
        fn any_chunking_of_valid_text_reproduces_it(s in "\\PC{0,60}", cuts in proptest::collection::vec(0usize..300, 0..20)) {
            let bytes = s.as_bytes();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (bytes.len() + 1)).collect();
            cuts.sort_unstable();
            let mut d = StreamDecoder::new();
            let mut out = String::new();
            let mut prev = 0;
            for c in cuts.into_iter().chain([bytes.len()]) {
                out.push_str(&d.push_bytes(&bytes[prev..c]));
                prev = c;
            }
            out.push_str(&d.finish());
            prop_assert_eq!(out, s);
        }

        #[test]
        fn arbitrary_bytes_match_lossy_decoding(bytes in proptest::collection::vec(any::<u8>(), 0..64), step in 1usize..5) {
            let mut d = StreamDecoder::new();
            let mut out = String::new();
            for chunk in bytes.chunks(step) {
                out.push_str(&d.push_bytes(chunk));
            }
            out.push_str(&d.finish());
            prop_assert_eq!(out, String::from_utf8_lossy(&bytes).into_owned());
        }
    }
}
