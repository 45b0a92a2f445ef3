//! The words and the alphabet against `tokenizers`' own pre-tokenizers.

use proptest::prelude::*;
use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

use super::*;

/// The words `tokenizers`' pre-tokenizer of `kind` cuts from `text`, in its byte-level form.
fn reference(kind: PreTokenizerKind, text: &str) -> Vec<String> {
    let mut pre = PreTokenizedString::from(text);
    kind.build().pre_tokenize(&mut pre).expect("pre-tokenizes");
    pre.get_splits(OffsetReferential::Normalized, OffsetType::None)
        .into_iter()
        .map(|(w, _, _)| w.to_string())
        .collect()
}

fn ours(kind: PreTokenizerKind, text: &str) -> Vec<String> {
    let (words, chars) = (Words::new(kind), ByteChars::new());
    let mut out = Vec::new();
    words
        .each(text, |w| {
            let mut s = String::new();
            chars.write(w, &mut s);
            out.push(s);
            Ok::<_, ()>(())
        })
        .unwrap();
    out
}

const KINDS: [PreTokenizerKind; 2] = [PreTokenizerKind::Gpt2, PreTokenizerKind::Gpt2SplitDigits];

#[test]
fn whitespace_before_a_word_leaves_it_one_character() {
    let k = PreTokenizerKind::Gpt2;
    let plain = |text: &str| -> Vec<String> {
        let mut out = Vec::new();
        Words::new(k)
            .each(text, |w| {
                out.push(w.to_string());
                Ok::<_, ()>(())
            })
            .unwrap();
        out
    };
    assert_eq!(plain("a   b"), ["a", "  ", " b"]);
    assert_eq!(plain("a\n\nb"), ["a", "\n", "\n", "b"]);
    assert_eq!(plain("a \n"), ["a", " \n"]);
    assert_eq!(
        plain("a\u{3000}\u{3000}b"),
        ["a", "\u{3000}", "\u{3000}", "b"]
    );
    assert_eq!(plain("it's  12"), ["it", "'s", " ", " 12"]);
    assert_eq!(plain(""), Vec::<String>::new());
    for k in KINDS {
        for text in [
            "a   b",
            "x  1 2",
            "\t\t\n",
            " 12ab",
            "'re'S",
            "é\u{0}\u{80}",
        ] {
            assert_eq!(ours(k, text), reference(k, text), "{k:?} {text:?}");
        }
    }
}

#[test]
fn the_alphabet_is_gpt2s() {
    let chars = ByteChars::new();
    assert_eq!(chars.of(b'a'), 'a');
    assert_eq!(chars.of(b' '), 'Ġ');
    assert_eq!(chars.of(b'\n'), 'Ċ');
    assert_eq!(chars.of(0), '\u{100}');
    assert_eq!(chars.of(0xAD), '\u{143}');
    let all: std::collections::HashSet<char> = (0..=255).map(|b| chars.of(b)).collect();
    assert_eq!(all.len(), 256);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn words_are_tokenizers_words(
        text in "\\PC{0,48}|[ \t\r\n\u{a0}\u{3000}a-z0-9'.é٣]{0,48}|(\\s{0,3}\\S{0,3}){0,12}|\\p{Any}{0,24}",
    ) {
        for k in KINDS {
            prop_assert_eq!(ours(k, &text), reference(k, &text), "{:?}", k);
        }
    }
}
