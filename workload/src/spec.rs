//! What `--workload` names: a trace file or a synthetic mix, with a request count and a seed.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::error::WorkloadError;
use crate::request::Workload;
use crate::{synthetic, trace};

/// Where a workload's requests come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkloadSource {
    /// A Mooncake JSONL trace ([`trace::mooncake`]).
    Mooncake(PathBuf),
    /// An Azure CSV trace ([`trace::AZURE`]).
    Azure(PathBuf),
    /// A BurstGPT CSV trace ([`trace::BURSTGPT`]).
    Burstgpt(PathBuf),
    /// A Qwen-Bailian JSONL trace ([`trace::BAILIAN`]).
    Bailian(PathBuf),
    /// [`synthetic::arxiv`].
    Arxiv,
    /// [`synthetic::leval`].
    Leval,
    /// [`synthetic::humaneval`].
    Humaneval,
    /// [`synthetic::hybrid`].
    Hybrid,
}

impl WorkloadSource {
    /// Whether this is a trace file (with timestamps), not a synthetic mix.
    pub fn is_trace(&self) -> bool {
        matches!(
            self,
            WorkloadSource::Mooncake(_)
                | WorkloadSource::Azure(_)
                | WorkloadSource::Bailian(_)
                | WorkloadSource::Burstgpt(_)
        )
    }
}

/// A workload to load: its source, how many requests, and the synthetic mixes' seed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadSpec {
    /// Where the requests come from.
    pub source: WorkloadSource,
    /// Synthetic: how many ([`WorkloadSpec::DEFAULT_REQUESTS`] when `None`); traces: the first
    /// this many rows (all when `None`).
    pub requests: Option<usize>,
    /// Seed of a synthetic mix (traces ignore it).
    pub seed: u64,
}

impl WorkloadSpec {
    /// Requests a synthetic workload has when no count is given.
    pub const DEFAULT_REQUESTS: usize = 1000;

    /// Parses `mooncake:PATH`, `azure:PATH`, `bailian:PATH`, `burstgpt:PATH`, `arxiv`, `leval`, `humaneval` or `hybrid` (no
    /// request limit, seed 0: set the fields after for `--requests` and `--seed`).
    pub fn parse(s: &str) -> Result<Self, WorkloadError> {
        let s = s.trim();
        let (name, path) = match s.split_once(':') {
            Some((name, path)) => (name, Some(path)),
            None => (s, None),
        };
        let bad = |why: &str| {
            WorkloadError::Spec(format!(
                "workload {s:?}: {why} (expected mooncake:PATH, azure:PATH, bailian:PATH, burstgpt:PATH, arxiv, leval, humaneval or hybrid)"
            ))
        };
        let file = |path: Option<&str>| match path {
            Some(p) if !p.is_empty() => Ok(PathBuf::from(p)),
            _ => Err(bad(&format!("{name} needs a trace file: {name}:PATH"))),
        };
        let synthetic = |source: WorkloadSource| match path {
            None => Ok(source),
            Some(_) => Err(bad(&format!("{name} is synthetic and takes no argument"))),
        };
        let source = match name {
            "mooncake" => WorkloadSource::Mooncake(file(path)?),
            "azure" => WorkloadSource::Azure(file(path)?),
            "bailian" => WorkloadSource::Bailian(file(path)?),
            "burstgpt" => WorkloadSource::Burstgpt(file(path)?),
            "arxiv" => synthetic(WorkloadSource::Arxiv)?,
            "leval" => synthetic(WorkloadSource::Leval)?,
            "humaneval" => synthetic(WorkloadSource::Humaneval)?,
            "hybrid" => synthetic(WorkloadSource::Hybrid)?,
            _ => return Err(bad("unknown workload")),
        };
        Ok(WorkloadSpec {
            source,
            requests: None,
            seed: 0,
        })
    }

    /// Loads or generates the workload (arrivals as the source gives them: the trace's times,
    /// 0 for synthetic mixes). A trace is read only up to the rows asked for. Fails on an
    /// unreadable or malformed trace, or no requests.
    pub fn load(&self) -> Result<Workload, WorkloadError> {
        let n = self.requests.unwrap_or(WorkloadSpec::DEFAULT_REQUESTS);
        let rows = self.requests;
        let mut w = match &self.source {
            WorkloadSource::Mooncake(path) => trace::jsonl(path, &trace::MOONCAKE, rows)?,
            WorkloadSource::Azure(path) => trace::csv(path, &trace::AZURE, rows)?,
            WorkloadSource::Burstgpt(path) => trace::csv(path, &trace::BURSTGPT, rows)?,
            WorkloadSource::Bailian(path) => trace::jsonl(path, &trace::BAILIAN, rows)?,
            WorkloadSource::Arxiv => synthetic::arxiv(n, self.seed),
            WorkloadSource::Leval => synthetic::leval(n, self.seed),
            WorkloadSource::Humaneval => synthetic::humaneval(n, self.seed),
            WorkloadSource::Hybrid => synthetic::hybrid(n, self.seed),
        };
        if let Some(n) = self.requests {
            w.truncate(n);
        }
        if w.requests.is_empty() {
            return Err(WorkloadError::Empty(format!(
                "workload {self} with 0 requests"
            )));
        }
        Ok(w)
    }
}

impl FromStr for WorkloadSpec {
    type Err = WorkloadError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        WorkloadSpec::parse(s)
    }
}

/// The source in the form [`WorkloadSpec::parse`] reads.
impl fmt::Display for WorkloadSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            WorkloadSource::Mooncake(p) => write!(f, "mooncake:{}", p.display()),
            WorkloadSource::Azure(p) => write!(f, "azure:{}", p.display()),
            WorkloadSource::Bailian(p) => write!(f, "bailian:{}", p.display()),
            WorkloadSource::Burstgpt(p) => write!(f, "burstgpt:{}", p.display()),
            WorkloadSource::Arxiv => write!(f, "arxiv"),
            WorkloadSource::Leval => write!(f, "leval"),
            WorkloadSource::Humaneval => write!(f, "humaneval"),
            WorkloadSource::Hybrid => write!(f, "hybrid"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn spec(s: &str) -> WorkloadSpec {
        WorkloadSpec::parse(s).expect(s)
    }

    #[test]
    fn every_form_parses_and_prints_back() {
        let cases = [
            (
                "mooncake:/t/mc.jsonl",
                WorkloadSource::Mooncake("/t/mc.jsonl".into()),
            ),
            (
                "azure:../shared/traces/a.csv",
                WorkloadSource::Azure("../shared/traces/a.csv".into()),
            ),
            (
                "burstgpt:BurstGPT_1.csv",
                WorkloadSource::Burstgpt("BurstGPT_1.csv".into()),
            ),
            (
                "bailian:qwen_traceA_blksz_16.jsonl",
                WorkloadSource::Bailian("qwen_traceA_blksz_16.jsonl".into()),
            ),
            ("arxiv", WorkloadSource::Arxiv),
            (" leval", WorkloadSource::Leval),
            ("humaneval", WorkloadSource::Humaneval),
            ("hybrid", WorkloadSource::Hybrid),
        ];
        for (s, source) in cases {
            let w: WorkloadSpec = s.parse().expect(s);
            assert_eq!(
                w,
                WorkloadSpec {
                    source,
                    requests: None,
                    seed: 0
                }
            );
            assert_eq!(w.to_string(), s.trim());
        }
        // A path may itself hold colons.
        assert_eq!(
            spec("azure:C:/x.csv").source,
            WorkloadSource::Azure("C:/x.csv".into())
        );
    }

    #[test]
    fn bad_forms_say_why() {
        for (s, needle) in [
            ("", "unknown workload"),
            ("sharegpt", "unknown workload"),
            ("mooncake", "needs a trace file"),
            ("azure:", "needs a trace file"),
            ("arxiv:500", "takes no argument"),
        ] {
            let err = WorkloadSpec::parse(s).expect_err(s);
            assert!(matches!(err, WorkloadError::Spec(_)));
            assert!(err.to_string().contains(needle), "{s}: {err}");
        }
    }

    #[test]
    fn load_generates_counts_and_truncates_traces() {
        let mut s = spec("hybrid");
        assert_eq!(
            s.load().expect("loads").requests.len(),
            WorkloadSpec::DEFAULT_REQUESTS
        );
        s.requests = Some(30);
        s.seed = 5;
        let w = s.load().expect("loads");
        assert_eq!(w, synthetic::hybrid(30, 5));
        s.requests = Some(0);
        assert!(matches!(s.load(), Err(WorkloadError::Empty(_))));

        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("t.jsonl");
        let mut f = std::fs::File::create(&path).expect("create");
        for t in 0..5 {
            writeln!(
                f,
                r#"{{"timestamp": {t}, "input_length": 9, "output_length": 2, "hash_ids": [{t}]}}"#
            )
            .expect("write");
        }
        let mut s = spec(&format!("mooncake:{}", path.display()));
        assert_eq!(s.load().expect("loads").requests.len(), 5);
        s.requests = Some(3);
        let w = s.load().expect("loads");
        assert_eq!(w.requests.len(), 3);
        assert_eq!(w.requests[2].hash_ids, [2]);
        s.requests = Some(50);
        assert_eq!(s.load().expect("loads").requests.len(), 5);
        let missing = spec("azure:/nonexistent.csv").load().expect_err("absent");
        assert!(matches!(missing, WorkloadError::Io { .. }), "{missing}");
    }
}
