//! `dolphinctl classifier`: train the output-length classifier from a request log (held-out
//! accuracy against the majority-class baseline), store it next to the tables, show it.

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use dolphin_learn::classifier::{TrainConfig, TrainReport, train};
use dolphin_proto::v1;
use dolphin_router::dolphin::classifier::CLASS_NAMES;

use crate::cli::DEFAULT_ROUTER_ADMIN;
use crate::error::CtlError;
use crate::tables::TablesError;

/// `dolphinctl classifier`.
#[derive(Clone, Debug, Args)]
pub struct ClassifierArgs {
    /// URL of the router's admin listener.
    #[arg(long, global = true, env = "DOLPHIN_ROUTER_ADMIN", default_value = DEFAULT_ROUTER_ADMIN)]
    pub router_admin: String,
    /// What to do.
    #[command(subcommand)]
    pub command: ClassifierCommand,
}

/// The classifier subcommands.
#[derive(Clone, Debug, Subcommand)]
pub enum ClassifierCommand {
    /// Train from a request log and report held-out accuracy against the majority baseline.
    Train(TrainArgs),
    /// Print the classifier the router uses.
    Show,
}

/// `dolphinctl classifier train`.
#[derive(Clone, Debug, Args)]
pub struct TrainArgs {
    /// The router's request log (JSON lines).
    #[arg(long)]
    pub log: PathBuf,
    /// Write the classifier JSON here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Store it in the router (etcd, next to the tables), which starts using it.
    #[arg(long)]
    pub put: bool,
    /// Passes over the training requests.
    #[arg(long, default_value_t = 40)]
    pub epochs: usize,
    /// Share of requests held out for evaluation.
    #[arg(long, default_value_t = 0.2)]
    pub heldout: f64,
    /// Prefix-family buckets (a power of two).
    #[arg(long, default_value_t = 256)]
    pub family_buckets: usize,
    /// Hashed-token buckets (a power of two).
    #[arg(long, default_value_t = 256)]
    pub hash_buckets: usize,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Trains from the log named in `args`.
pub fn train_from_log(args: &TrainArgs) -> Result<(TrainReport, usize), TablesError> {
    let log = dolphin_learn::log::read(&args.log)?;
    let cfg = TrainConfig {
        n_family: args.family_buckets,
        n_hash: args.hash_buckets,
        epochs: args.epochs,
        heldout: args.heldout,
        seed: args.seed,
        source: args.log.display().to_string(),
        ..TrainConfig::default()
    };
    Ok((train(&log.records, &cfg)?, log.bad_lines))
}

/// The human report of a training run.
pub fn describe(r: &TrainReport, bad_lines: usize) -> String {
    let [b0, b1] = r.boundaries;
    let mut s = format!(
        "trained on {} requests ({} train, {} held out; {} skipped, {} unparsable lines)\n",
        r.samples, r.train, r.heldout, r.skipped, bad_lines
    );
    s.push_str(&format!(
        "classes: short < {b0} <= medium < {b1} <= long output tokens\n"
    ));
    for (c, name) in CLASS_NAMES.iter().enumerate() {
        s.push_str(&format!(
            "  {name:<6} representative {:>6} tokens, {} training requests\n",
            r.representative[c], r.class_counts[c]
        ));
    }
    s.push_str(&format!(
        "held-out accuracy {:.1}% vs majority baseline {:.1}% (always {}); train accuracy {:.1}%\n",
        100.0 * r.heldout_accuracy,
        100.0 * r.majority_baseline,
        CLASS_NAMES[r.majority_class],
        100.0 * r.train_accuracy
    ));
    s
}

/// Runs a `classifier` command, writing its output to `out`.
pub async fn run(args: ClassifierArgs, out: &mut impl Write) -> Result<(), CtlError> {
    let w = |out: &mut dyn Write, text: String| {
        out.write_all(text.as_bytes()).map_err(CtlError::Output)
    };
    match args.command {
        ClassifierCommand::Show => {
            let doc = crate::client::admin(&args.router_admin)
                .await?
                .get_classifier(v1::GetClassifierRequest {})
                .await
                .map_err(|s| CtlError::rpc("GetClassifier", s))?
                .into_inner();
            let note = if doc.prior {
                "# the built-in prior (no classifier trained yet)\n"
            } else {
                ""
            };
            w(out, format!("{note}{}\n", doc.json))
        }
        ClassifierCommand::Train(t) => {
            let (report, bad_lines) = train_from_log(&t)?;
            let json = report.classifier.to_json_pretty();
            if let Some(path) = &t.out {
                std::fs::write(path, format!("{json}\n")).map_err(|source| TablesError::Write {
                    path: path.clone(),
                    source,
                })?;
            }
            if t.put {
                crate::client::admin(&args.router_admin)
                    .await?
                    .put_classifier(v1::ClassifierDocument {
                        json: json.clone(),
                        prior: false,
                    })
                    .await
                    .map_err(|s| CtlError::rpc("PutClassifier", s))?;
            }
            let mut text = if t.json {
                format!(
                    "{}\n",
                    serde_json::to_string_pretty(&report).unwrap_or_default()
                )
            } else {
                describe(&report, bad_lines)
            };
            if let Some(path) = &t.out {
                text.push_str(&format!("wrote {}\n", path.display()));
            }
            if t.put {
                text.push_str("stored in the router\n");
            }
            w(out, text)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn trains_from_a_log_file_and_reports_against_the_baseline() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("log.jsonl");
        let lines: String = dolphin_learn::synthetic::log(1200, 4)
            .iter()
            .map(|r| format!("{}\n", serde_json::to_string(r).expect("json")))
            .collect();
        std::fs::write(&log, format!("{lines}garbage\n")).expect("write");
        let out_file = dir.path().join("classifier.json");
        let args = ClassifierArgs {
            router_admin: "http://127.0.0.1:1".into(),
            command: ClassifierCommand::Train(TrainArgs {
                log,
                out: Some(out_file.clone()),
                put: false,
                epochs: 10,
                heldout: 0.25,
                family_buckets: 64,
                hash_buckets: 64,
                seed: 3,
                json: false,
            }),
        };
        let mut out = Vec::new();
        run(args, &mut out).await.expect("train");
        let text = String::from_utf8(out).expect("utf8");
        assert!(text.contains("held-out accuracy"), "{text}");
        assert!(text.contains("1 unparsable lines"), "{text}");
        let saved = std::fs::read_to_string(&out_file).expect("saved");
        dolphin_router::dolphin::OutputClassifier::from_json(&saved).expect("valid classifier");
    }
}
