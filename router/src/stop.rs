//! Stop strings: end the output where one appears, without ever streaming part of it.
//!
//! Workers stop on token ids; stop *strings* need the text, which only the router has. Text that
//! could still turn out to be the start of a stop string is held back until it cannot.

/// Finds stop strings in streamed text.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet released.
    held: String,
    /// Longest stop string, in bytes.
    max_len: usize,
    /// Whether the stop string found is part of the text (`include_stop_str_in_output`).
    include: bool,
    /// The stop string that ended the text, once one did.
    matched: Option<usize>,
}

/// What one piece of text released.
#[derive(Debug, PartialEq, Eq)]
pub struct Released {
    /// Text safe to send.
    pub text: String,
    /// A stop string was found: the output ends after `text`.
    pub stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored); with `include`, the text released at
    /// a stop ends with the stop string, else just before it.
    pub fn new(stops: &[String], include: bool) -> Self {
        let stops: Vec<String> = stops.iter().filter(|s| !s.is_empty()).cloned().collect();
        let max_len = stops.iter().map(String::len).max().unwrap_or(0);
        Self {
            stops,
            held: String::new(),
            max_len,
            include,
            matched: None,
        }
    }

    /// The stop string that ended the text, once one did.
    pub fn matched(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    /// Whether there is anything to match (else text passes straight through).
    pub fn is_active(&self) -> bool {
        !self.stops.is_empty()
    }

    /// Adds text; returns what can be released now.
    pub fn push(&mut self, text: &str) -> Released {
        if !self.is_active() {
            return Released {
                text: text.to_string(),
                stopped: false,
            };
        }
        self.held.push_str(text);
        // The earliest stop in the text; of two at the same place, the first listed.
        let first = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| self.held.find(s.as_str()).map(|pos| (pos, s.len(), i)))
            .min_by_key(|&(pos, _, i)| (pos, i));
        if let Some((pos, len, i)) = first {
            self.matched = Some(i);
            let end = if self.include { pos + len } else { pos };
            let out = self.held[..end].to_string();
            self.held.clear();
            return Released {
                text: out,
                stopped: true,
            };
        }
        // Hold back the longest tail that is a proper prefix of some stop string.
        let mut keep = 0;
        for start in (0..self.held.len())
            .rev()
            .take(self.max_len.saturating_sub(1))
        {
            if !self.held.is_char_boundary(start) {
                continue;
            }
            let tail = &self.held[start..];
            if self.stops.iter().any(|s| s.starts_with(tail)) {
                keep = self.held.len() - start;
            }
        }
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        Released {
            text: out,
            stopped: false,
        }
    }

    /// The output ended without a stop string: release what was held.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(stops: &[&str]) -> StopMatcher {
        StopMatcher::new(
            &stops.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            false,
        )
    }

    #[test]
    fn keeps_the_stop_string_when_asked() {
        let stops = ["END".to_string(), "ENDING".to_string(), "xy".to_string()];
        let mut s = StopMatcher::new(&stops, true);
        assert_eq!(
            s.push("abcE"),
            Released {
                text: "abc".into(),
                stopped: false
            }
        );
        // Two stops start at the same place: the first listed ends the text.
        assert_eq!(
            s.push("NDINGxy"),
            Released {
                text: "END".into(),
                stopped: true
            }
        );
        let mut s = StopMatcher::new(&stops, true);
        assert_eq!(
            s.push("a xy END"),
            Released {
                text: "a xy".into(),
                stopped: true
            }
        );
    }

    #[test]
    fn passes_through_without_stops() {
        let mut s = m(&[""]);
        assert!(!s.is_active());
        assert_eq!(
            s.push("abc"),
            Released {
                text: "abc".into(),
                stopped: false
            }
        );
    }

    #[test]
    fn stops_inside_one_piece() {
        let mut s = m(&["END"]);
        assert_eq!(
            s.push("abcENDxyz"),
            Released {
                text: "abc".into(),
                stopped: true
            }
        );
    }

    #[test]
    fn holds_back_a_possible_prefix_across_pieces() {
        let mut s = m(&["END"]);
        assert_eq!(
            s.push("abcE"),
            Released {
                text: "abc".into(),
                stopped: false
            }
        );
        assert_eq!(
            s.push("N"),
            Released {
                text: "".into(),
                stopped: false
            }
        );
        assert_eq!(
            s.push("D!"),
            Released {
                text: "".into(),
                stopped: true
            }
        );
    }

    #[test]
    fn releases_a_false_alarm() {
        let mut s = m(&["END"]);
        assert_eq!(
            s.push("xE"),
            Released {
                text: "x".into(),
                stopped: false
            }
        );
        assert_eq!(
            s.push("Nx"),
            Released {
                text: "ENx".into(),
                stopped: false
            }
        );
        assert_eq!(
            s.push("E"),
            Released {
                text: "".into(),
                stopped: false
            }
        );
        assert_eq!(s.finish(), "E");
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        let mut s = m(&["bb", "a"]);
        assert_eq!(
            s.push("xbbya"),
            Released {
                text: "x".into(),
                stopped: true
            }
        );
    }

    #[test]
    fn multibyte_text_is_cut_on_char_boundaries() {
        let mut s = m(&["éé"]);
        assert_eq!(
            s.push("aé"),
            Released {
                text: "a".into(),
                stopped: false
            }
        );
        assert_eq!(
            s.push("b"),
            Released {
                text: "éb".into(),
                stopped: false
            }
        );
    }
}
