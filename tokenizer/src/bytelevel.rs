//! GPT-2's byte-level alphabet: every byte maps to one printable character, so a vocabulary of
//! strings can hold arbitrary bytes. Printable Latin-1 bytes map to themselves; the other 68 bytes
//! map to U+0100.. in byte order (space is 'Ġ' U+0120, newline 'Ċ' U+010A).

/// Characters of the alphabet lie below this code point.
const ALPHABET_END: usize = 0x100 + 68;

/// The byte <-> character tables.
#[derive(Clone, Debug)]
pub(crate) struct ByteLevel {
    to_char: [char; 256],
    /// Indexed by code point; `None` for characters outside the alphabet.
    to_byte: Vec<Option<u8>>,
}

impl ByteLevel {
    pub(crate) fn new() -> ByteLevel {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut to_char = ['\0'; 256];
        let mut to_byte = vec![None; ALPHABET_END];
        let mut next = 0x100u32;
        for b in 0..=255u8 {
            let cp = if printable(b) {
                u32::from(b)
            } else {
                next += 1;
                next - 1
            };
            // Every cp here is below ALPHABET_END, a valid scalar value.
            let c = char::from_u32(cp).unwrap_or(char::REPLACEMENT_CHARACTER);
            to_char[usize::from(b)] = c;
            to_byte[cp as usize] = Some(b);
        }
        ByteLevel { to_char, to_byte }
    }

    /// The character standing for byte `b`.
    pub(crate) fn char_of(&self, b: u8) -> char {
        self.to_char[usize::from(b)]
    }

    /// The byte character `c` stands for, if `c` is in the alphabet.
    pub(crate) fn byte_of(&self, c: char) -> Option<u8> {
        self.to_byte.get(c as usize).copied().flatten()
    }

    /// The bytes a vocabulary string stands for; characters outside the alphabet are kept as
    /// their own UTF-8 (llama.cpp prints a marker there; no GPT-2 vocabulary has any).
    pub(crate) fn decode_into(&self, token: &str, out: &mut Vec<u8>) {
        for c in token.chars() {
            match self.byte_of(c) {
                Some(b) => out.push(b),
                None => {
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_matches_gpt2() {
        let bl = ByteLevel::new();
        assert_eq!(bl.char_of(b' '), 'Ġ');
        assert_eq!(bl.char_of(b'\n'), 'Ċ');
        assert_eq!(bl.char_of(b'a'), 'a');
        assert_eq!(bl.char_of(0), '\u{100}');
        assert_eq!(bl.char_of(0xAD), '\u{143}');
        for b in 0..=255u8 {
            assert_eq!(bl.byte_of(bl.char_of(b)), Some(b));
        }
        assert_eq!(bl.byte_of('日'), None);
        let mut out = Vec::new();
        bl.decode_into("ĠhÃ©", &mut out);
        assert_eq!(out, " hé".as_bytes());
    }
}
