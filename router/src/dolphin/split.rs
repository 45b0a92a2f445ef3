//! The prefill/decode split of a cluster ("3p1d": three prefill, one decode worker).
//!
//! Tables are learned per split (DESIGN.md section 1), so the split is the key that selects the
//! routing table; the live one is counted from the registered workers.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A prefill/decode split.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Split {
    /// Prefill workers.
    pub prefill: u32,
    /// Decode workers.
    pub decode: u32,
}

/// A split name that is not `<n>p<m>d`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad split {0:?}: expected <prefill>p<decode>d, e.g. \"3p1d\"")]
pub struct BadSplit(pub String);

impl Split {
    /// A split of `prefill` prefill and `decode` decode workers.
    pub const fn new(prefill: u32, decode: u32) -> Self {
        Split { prefill, decode }
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}p{}d", self.prefill, self.decode)
    }
}

impl FromStr for Split {
    type Err = BadSplit;

    fn from_str(s: &str) -> Result<Self, BadSplit> {
        let bad = || BadSplit(s.to_owned());
        let rest = s.strip_suffix('d').ok_or_else(bad)?;
        let (p, d) = rest.split_once('p').ok_or_else(bad)?;
        // Plain decimal digits only: "+3p1d" or "03p1d" would name the same split twice in etcd.
        let num = |x: &str| {
            let canonical = !x.is_empty()
                && x.bytes().all(|b| b.is_ascii_digit())
                && (x == "0" || !x.starts_with('0'));
            canonical.then(|| x.parse::<u32>().ok()).flatten()
        };
        Ok(Split {
            prefill: num(p).ok_or_else(bad)?,
            decode: num(d).ok_or_else(bad)?,
        })
    }
}

impl Serialize for Split {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Split {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        let s: Split = "3p1d".parse().expect("split");
        assert_eq!(s, Split::new(3, 1));
        assert_eq!(s.to_string(), "3p1d");
        assert_eq!("0p16d".parse::<Split>().expect("split"), Split::new(0, 16));
        for bad in [
            "", "3p1", "p1d", "3pd", "3p1dd", "x3p1d", "03p1d", "+3p1d", "3 p1d",
        ] {
            assert!(bad.parse::<Split>().is_err(), "{bad:?}");
        }
        let json = serde_json::to_string(&Split::new(16, 16)).expect("json");
        assert_eq!(json, "\"16p16d\"");
        assert!(serde_json::from_str::<Split>("\"nope\"").is_err());
    }
}
