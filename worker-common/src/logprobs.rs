//! Log probabilities between the engine's form and the wire's.

use dolphin_engine::TokenLogprobs;
use dolphin_proto::v1;

/// The wire form of a step's log probabilities.
pub fn to_wire(lp: &TokenLogprobs) -> v1::TokenLogprobs {
    v1::TokenLogprobs {
        logprob: lp.logprob,
        top_ids: lp.top.iter().map(|t| t.0).collect(),
        top_logprobs: lp.top.iter().map(|t| t.1).collect(),
        rank: lp.rank,
    }
}

/// The engine form of a step's log probabilities from the wire (pairs past the shorter list
/// are dropped).
pub fn from_wire(lp: &v1::TokenLogprobs) -> TokenLogprobs {
    TokenLogprobs {
        logprob: lp.logprob,
        top: lp
            .top_ids
            .iter()
            .zip(&lp.top_logprobs)
            .map(|(&id, &l)| (id, l))
            .collect(),
        rank: lp.rank,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_drops_unpaired_entries() {
        let lp = TokenLogprobs {
            logprob: -0.5,
            top: vec![(7, -0.1), (3, -2.5)],
            rank: 2,
        };
        assert_eq!(from_wire(&to_wire(&lp)), lp);
        let mut wire = to_wire(&lp);
        wire.top_ids.push(9);
        assert_eq!(from_wire(&wire), lp);
    }
}
