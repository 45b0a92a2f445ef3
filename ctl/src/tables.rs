//! `dolphinctl tables`: DolphinRouting's routing tables through the router's `RouterAdmin`
//! (list, show, diff, put, activate, rollback), and `fit`, which learns a new table's clusters
//! offline from a request log.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand, ValueEnum};
use dolphin_learn::fit::{FitConfig, InitBits, fit_table};
use dolphin_proto::v1;
use dolphin_router::dolphin::split::Split;
use dolphin_router::dolphin::table::{ClusterMethod, Reward, RoutingTable, TableSlo};
use dolphin_router::policy::ThresholdConfig;

use crate::cli::DEFAULT_ROUTER_ADMIN;
use crate::client::admin;
use crate::error::CtlError;
use crate::table_diff::diff;

/// `dolphinctl tables`.
#[derive(Clone, Debug, Args)]
pub struct TablesArgs {
    /// URL of the router's admin listener.
    #[arg(long, global = true, env = "DOLPHIN_ROUTER_ADMIN", default_value = DEFAULT_ROUTER_ADMIN)]
    pub router_admin: String,
    /// What to do.
    #[command(subcommand)]
    pub command: TablesCommand,
}

/// The table subcommands.
#[derive(Clone, Debug, Subcommand)]
pub enum TablesCommand {
    /// Splits, their versions and active pointers, and what the router has loaded.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a table (the split's active one unless --version).
    Show {
        /// The split, e.g. 3p1d.
        split: String,
        /// A stored version.
        #[arg(long)]
        version: Option<String>,
    },
    /// Compare two versions of a split (or, without --split, two table files).
    Diff {
        /// The split whose versions to compare; absent: A and B are files.
        #[arg(long)]
        split: Option<String>,
        /// Version (or file) A.
        a: String,
        /// Version (or file) B.
        b: String,
    },
    /// Store a table file as a new version.
    Put {
        /// The table JSON file.
        file: PathBuf,
        /// Version name (default: the next v<N>).
        #[arg(long)]
        version: Option<String>,
        /// Also activate it.
        #[arg(long)]
        activate: bool,
    },
    /// Make a stored version the active one of its split.
    Activate {
        /// The split.
        split: String,
        /// The version.
        version: String,
    },
    /// Return a split to its previously active version.
    Rollback {
        /// The split.
        split: String,
    },
    /// Learn a new table's standardizer and clusters from a request log (offline).
    Fit(Box<FitArgs>),
}

/// Initial bits of a fitted table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BitsInit {
    /// The Dynamo 1.6 rule's majority decision per cluster.
    Threshold,
    /// All local.
    Local,
    /// All remote.
    Remote,
}

/// `dolphinctl tables fit`.
#[derive(Clone, Debug, Args)]
pub struct FitArgs {
    /// The router's request log (JSON lines).
    #[arg(long)]
    pub log: PathBuf,
    /// The split the table is for, e.g. 3p1d.
    #[arg(long)]
    pub split: String,
    /// Clusters.
    #[arg(long, default_value_t = 8)]
    pub k: usize,
    /// Clustering method.
    #[arg(long, value_enum, default_value = "kmeans")]
    pub method: Method,
    /// TTFT SLO the table is for, in milliseconds.
    #[arg(long, default_value_t = 5000.0)]
    pub ttft_slo_ms: f64,
    /// TPOT SLO the table is for, in milliseconds.
    #[arg(long, default_value_t = 250.0)]
    pub tpot_slo_ms: f64,
    /// Workload name recorded in the provenance.
    #[arg(long, default_value = "unnamed")]
    pub workload: String,
    /// How the bits start.
    #[arg(long, value_enum, default_value = "threshold")]
    pub bits: BitsInit,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write the table here (default: stdout).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Clustering methods.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Method {
    /// k-means (nearest centroid).
    Kmeans,
    /// Gaussian mixture with diagonal covariances (most likely component).
    Gmm,
}

/// Failures of the table and classifier commands that are not RPC failures.
#[derive(Debug, thiserror::Error)]
pub enum TablesError {
    /// A file could not be read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A file could not be written.
    #[error("cannot write {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A table that does not validate.
    #[error("{what} is not a valid table")]
    Table {
        /// Where it came from.
        what: String,
        /// Why.
        #[source]
        source: dolphin_router::dolphin::TableError,
    },
    /// Learning failed.
    #[error(transparent)]
    Learn(#[from] dolphin_learn::LearnError),
    /// A bad argument.
    #[error("{0}")]
    Usage(String),
}

fn read(path: &Path) -> Result<String, TablesError> {
    std::fs::read_to_string(path).map_err(|source| TablesError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn parse(what: &str, json: &str) -> Result<RoutingTable, TablesError> {
    RoutingTable::from_json(json).map_err(|source| TablesError::Table {
        what: what.to_owned(),
        source,
    })
}

/// Runs a `tables` command, writing its output to `out`.
pub async fn run(args: TablesArgs, out: &mut impl Write) -> Result<(), CtlError> {
    let url = args.router_admin.as_str();
    let w = |out: &mut dyn Write, text: String| {
        out.write_all(text.as_bytes()).map_err(CtlError::Output)
    };
    match args.command {
        TablesCommand::List { json } => {
            let resp = admin(url)
                .await?
                .list_tables(v1::ListTablesRequest {})
                .await
                .map_err(|s| CtlError::rpc("ListTables", s))?
                .into_inner();
            let text = if json {
                list_json(&resp)
            } else {
                render_list(&resp)
            };
            w(out, text)
        }
        TablesCommand::Show { split, version } => {
            let doc = get(url, &split, version.unwrap_or_default()).await?;
            let table = parse(&format!("{}/{}", doc.split, doc.version), &doc.json)?;
            w(
                out,
                format!(
                    "# split {} version {}{}\n{}\n",
                    doc.split,
                    doc.version,
                    if doc.active { " (active)" } else { "" },
                    table.to_json_pretty()
                ),
            )
        }
        TablesCommand::Diff { split, a, b } => {
            let (ta, tb) = match split {
                Some(split) => {
                    let da = get(url, &split, a.clone()).await?;
                    let db = get(url, &split, b.clone()).await?;
                    (parse(&a, &da.json)?, parse(&b, &db.json)?)
                }
                None => (
                    parse(&a, &read(Path::new(&a))?)?,
                    parse(&b, &read(Path::new(&b))?)?,
                ),
            };
            let lines = diff(&ta, &tb);
            let text = if lines.is_empty() {
                "no differences\n".to_owned()
            } else {
                lines.iter().map(|l| format!("{l}\n")).collect()
            };
            w(out, text)
        }
        TablesCommand::Put {
            file,
            version,
            activate,
        } => {
            let json = read(&file)?;
            let table = parse(&file.display().to_string(), &json)?;
            let resp = admin(url)
                .await?
                .put_table(v1::PutTableRequest {
                    split: table.split.to_string(),
                    version: version.unwrap_or_default(),
                    json,
                    activate,
                })
                .await
                .map_err(|s| CtlError::rpc("PutTable", s))?
                .into_inner();
            w(
                out,
                format!(
                    "stored {}/{}{}\n",
                    resp.split,
                    resp.version,
                    if resp.activated { " (active)" } else { "" }
                ),
            )
        }
        TablesCommand::Activate { split, version } => {
            let p = admin(url)
                .await?
                .activate_table(v1::ActivateTableRequest { split, version })
                .await
                .map_err(|s| CtlError::rpc("ActivateTable", s))?
                .into_inner();
            w(out, format!("{}: active {}\n", p.split, p.version))
        }
        TablesCommand::Rollback { split } => {
            let p = admin(url)
                .await?
                .rollback_table(v1::RollbackTableRequest { split })
                .await
                .map_err(|s| CtlError::rpc("RollbackTable", s))?
                .into_inner();
            w(out, format!("{}: rolled back to {}\n", p.split, p.version))
        }
        TablesCommand::Fit(args) => {
            let (table, summary) = fit(&args)?;
            match &args.out {
                Some(path) => {
                    std::fs::write(path, format!("{}\n", table.to_json_pretty())).map_err(
                        |source| TablesError::Write {
                            path: path.clone(),
                            source,
                        },
                    )?;
                    w(out, format!("{summary}wrote {}\n", path.display()))
                }
                None => {
                    eprint!("{summary}");
                    w(out, format!("{}\n", table.to_json_pretty()))
                }
            }
        }
    }
}

async fn get(url: &str, split: &str, version: String) -> Result<v1::TableDocument, CtlError> {
    Ok(admin(url)
        .await?
        .get_table(v1::GetTableRequest {
            split: split.to_owned(),
            version,
        })
        .await
        .map_err(|s| CtlError::rpc("GetTable", s))?
        .into_inner())
}

/// Fits a table; returns it and a human summary.
pub fn fit(args: &FitArgs) -> Result<(RoutingTable, String), TablesError> {
    let split: Split = args
        .split
        .parse()
        .map_err(|e: dolphin_router::dolphin::split::BadSplit| TablesError::Usage(e.to_string()))?;
    let log = dolphin_learn::log::read(&args.log)?;
    let cfg = FitConfig {
        split,
        k: args.k,
        method: match args.method {
            Method::Kmeans => ClusterMethod::Kmeans,
            Method::Gmm => ClusterMethod::Gmm,
        },
        slo: TableSlo {
            ttft_ms: args.ttft_slo_ms,
            tpot_ms: args.tpot_slo_ms,
        },
        workload: args.workload.clone(),
        bits: match args.bits {
            BitsInit::Threshold => InitBits::Threshold(ThresholdConfig::default()),
            BitsInit::Local => InitBits::Local,
            BitsInit::Remote => InitBits::Remote,
        },
        seed: args.seed,
        features: [true; 4],
        reward: Reward::E2e,
        load_rule: None,
    };
    let mut r = fit_table(&log.records, &cfg)?;
    // Bits set, not learned: no evidence, so the router takes them as given (`dolphinctl
    // learn` measures the bits and keeps the evidence).
    r.table.evidence.clear();
    let mut s = format!(
        "fitted {} {} clusters for split {} on {} requests ({} unparsable lines skipped)\n",
        r.table.k,
        r.table.method.as_str(),
        split,
        r.samples,
        log.bad_lines
    );
    for (c, size) in r.cluster_sizes.iter().enumerate() {
        s.push_str(&format!(
            "  cluster {c}: {size} requests, threshold rule remote for {:.0}%, bit {}\n",
            100.0 * r.threshold_remote_share[c],
            r.table.bits[c]
        ));
    }
    Ok((r.table, s))
}

fn list_json(r: &v1::ListTablesResponse) -> String {
    let splits: Vec<serde_json::Value> = r
        .splits
        .iter()
        .map(|s| {
            serde_json::json!({
                "split": s.split, "versions": s.versions, "active": s.active,
                "history": s.history, "loaded": s.loaded, "refused": s.refused,
            })
        })
        .collect();
    let v = serde_json::json!({
        "live_split": r.live_split, "live_version": r.live_version, "store": r.store, "splits": splits,
    });
    format!("{}\n", serde_json::to_string_pretty(&v).unwrap_or_default())
}

/// The `tables list` text.
pub fn render_list(r: &v1::ListTablesResponse) -> String {
    let mut out = format!(
        "live split {}: {} (store: {})\n",
        r.live_split,
        if r.live_version.is_empty() {
            "no table, the fallback policy decides".to_owned()
        } else {
            format!("table {}", r.live_version)
        },
        r.store
    );
    if r.splits.is_empty() {
        out.push_str("(no tables)\n");
    }
    for s in &r.splits {
        let dash = |x: &str| {
            if x.is_empty() {
                "-".to_owned()
            } else {
                x.to_owned()
            }
        };
        out.push_str(&format!(
            "{}  active {}  loaded {}  versions [{}]  history [{}]\n",
            s.split,
            dash(&s.active),
            dash(&s.loaded),
            s.versions.join(", "),
            s.history.join(", ")
        ));
        if !s.refused.is_empty() {
            out.push_str(&format!("  refused: {}\n", s.refused));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_says_what_decides_the_live_split() {
        let mut r = v1::ListTablesResponse {
            live_split: "3p1d".into(),
            store: "etcd".into(),
            ..Default::default()
        };
        assert!(render_list(&r).contains("fallback"));
        r.live_version = "v2".into();
        r.splits.push(v1::SplitTables {
            split: "3p1d".into(),
            versions: vec!["v1".into(), "v2".into()],
            active: "v2".into(),
            history: vec!["v1".into()],
            loaded: "v2".into(),
            refused: "version v3: bad".into(),
        });
        let text = render_list(&r);
        assert!(text.contains("table v2"), "{text}");
        assert!(text.contains("versions [v1, v2]"), "{text}");
        assert!(text.contains("refused: version v3"), "{text}");
        let json: serde_json::Value = serde_json::from_str(&list_json(&r)).expect("json");
        assert_eq!(json["splits"][0]["history"][0], "v1");
    }

    #[test]
    fn fit_reads_a_log_and_writes_a_valid_table() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("log.jsonl");
        let lines: String = dolphin_learn::synthetic::log(300, 2)
            .iter()
            .map(|r| format!("{}\n", serde_json::to_string(r).expect("json")))
            .collect();
        std::fs::write(&log, lines).expect("write");
        let args = FitArgs {
            log,
            split: "2p2d".into(),
            k: 3,
            method: Method::Gmm,
            ttft_slo_ms: 1000.0,
            tpot_slo_ms: 50.0,
            workload: "synthetic".into(),
            bits: BitsInit::Threshold,
            seed: 1,
            out: None,
        };
        let (table, summary) = fit(&args).expect("fit");
        assert_eq!(table.split, Split::new(2, 2));
        assert!(summary.contains("cluster 2:"), "{summary}");
        RoutingTable::from_json(&table.to_json_pretty()).expect("valid");
        let bad = FitArgs {
            split: "two".into(),
            ..args
        };
        assert!(matches!(fit(&bad), Err(TablesError::Usage(_))));
    }
}
