//! What changed between two routing tables, as lines an operator reads (`dolphinctl tables
//! diff`): the fields that differ, each flipped bit, and how far each cluster moved.

use dolphin_router::dolphin::table::{FEATURE_NAMES, RoutingTable};

fn bit_name(b: u8) -> &'static str {
    if b == 1 { "remote" } else { "local" }
}

fn max_shift(a: &[Vec<f64>], b: &[Vec<f64>], c: usize) -> f64 {
    a[c].iter()
        .zip(&b[c])
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

fn load_rule(t: &RoutingTable) -> String {
    t.load_rule.map_or("none".into(), |r| r.to_string())
}

/// The differences from `a` to `b`; empty when they are the same.
pub fn diff(a: &RoutingTable, b: &RoutingTable) -> Vec<String> {
    let mut out = Vec::new();
    let mut field = |name: &str, x: String, y: String| {
        if x != y {
            out.push(format!("{name}: {x} -> {y}"));
        }
    };
    field("split", a.split.to_string(), b.split.to_string());
    field("k", a.k.to_string(), b.k.to_string());
    field("method", a.method.as_str().into(), b.method.as_str().into());
    field(
        "slo.ttft_ms",
        a.slo.ttft_ms.to_string(),
        b.slo.ttft_ms.to_string(),
    );
    field(
        "slo.tpot_ms",
        a.slo.tpot_ms.to_string(),
        b.slo.tpot_ms.to_string(),
    );
    field("load_rule", load_rule(a), load_rule(b));
    let (pa, pb) = (&a.provenance, &b.provenance);
    field(
        "provenance.workload",
        pa.workload.clone(),
        pb.workload.clone(),
    );
    field("provenance.date", pa.date.clone(), pb.date.clone());
    field(
        "provenance.rounds",
        pa.rounds.to_string(),
        pb.rounds.to_string(),
    );
    for (d, name) in FEATURE_NAMES.iter().enumerate() {
        let (sa, sb) = (&a.standardizer, &b.standardizer);
        field(
            &format!("standardizer.{name}"),
            format!("mean {:.4} std {:.4}", sa.mean[d], sa.std[d]),
            format!("mean {:.4} std {:.4}", sb.mean[d], sb.std[d]),
        );
    }
    if a.k != b.k || a.method != b.method {
        out.push("clusters are not comparable (different k or method)".into());
        return out;
    }
    let centres = |t: &RoutingTable| {
        t.model
            .centroids
            .clone()
            .or_else(|| t.model.means.clone())
            .unwrap_or_default()
    };
    let (ca, cb) = (centres(a), centres(b));
    let mut flipped = 0;
    for c in 0..a.k {
        let (ba, bb) = (a.bits[c], b.bits[c]);
        let shift = if c < ca.len() && c < cb.len() {
            max_shift(&ca, &cb, c)
        } else {
            0.0
        };
        let reward = |t: &RoutingTable| t.provenance.rewards.get(c).map(|r| format!("{r:.3}"));
        let mut parts = Vec::new();
        if ba != bb {
            flipped += 1;
            parts.push(format!("bit {} -> {}", bit_name(ba), bit_name(bb)));
        }
        if shift > 1e-9 {
            parts.push(format!(
                "centre moved {shift:.4} (max per feature, standardized)"
            ));
        }
        if reward(a) != reward(b) {
            parts.push(format!(
                "reward {} -> {}",
                reward(a).unwrap_or_else(|| "-".into()),
                reward(b).unwrap_or_else(|| "-".into())
            ));
        }
        if !parts.is_empty() {
            out.push(format!("cluster {c}: {}", parts.join(", ")));
        }
    }
    if flipped > 0 {
        out.push(format!("{flipped} of {} bits flipped", a.k));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> RoutingTable {
        let json = r#"{"schema_version": 1, "split": "3p1d", "slo": {"ttft_ms": 5000, "tpot_ms": 250},
            "k": 2, "method": "kmeans",
            "standardizer": {"transform": "log1p", "mean": [8, 7, 7, 5], "std": [1, 1, 1, 1]},
            "model": {"centroids": [[-1, -1, -1, 0], [1, 1, 1, 0]]}, "bits": [0, 1],
            "provenance": {"workload": "w", "date": "d", "rounds": 3, "rewards": [0.5, 0.7]}}"#;
        RoutingTable::from_json(json).expect("valid")
    }

    #[test]
    fn names_flipped_bits_and_moved_clusters() {
        let a = table();
        assert!(diff(&a, &a).is_empty());
        let mut b = a.clone();
        b.bits = vec![1, 1];
        b.provenance.rounds = 26;
        b.load_rule = Some(dolphin_router::dolphin::table::LoadRule {
            prefill_busy_threshold: 1.0,
        });
        b.model.centroids = Some(vec![vec![-1.0, -1.0, -1.0, 0.5], vec![1.0, 1.0, 1.0, 0.0]]);
        let d = diff(&a, &b);
        assert!(
            d.contains(&"provenance.rounds: 3 -> 26".to_string()),
            "{d:?}"
        );
        assert!(
            d.contains(&"load_rule: none -> local while prefill busy > 1".to_string()),
            "{d:?}"
        );
        assert!(
            d.iter()
                .any(|l| l.starts_with("cluster 0: bit local -> remote, centre moved 0.5000")),
            "{d:?}"
        );
        assert!(!d.iter().any(|l| l.starts_with("cluster 1")), "{d:?}");
        assert!(d.contains(&"1 of 2 bits flipped".to_string()));
        let mut c = a.clone();
        c.k = 3;
        assert!(diff(&a, &c).iter().any(|l| l.contains("not comparable")));
    }
}
