//! `dolphinctl learn` end to end, run as a process. On the simulator: the learned table is valid
//! for its split and K, its provenance counts the logged rounds, a log written for other
//! settings is refused, and a rerun or an interrupted run resumes from the log and learns the
//! same table to the bit. Bad input fails clearly and writes nothing. On a live 1p1d cluster
//! (sim engine, etcd, `--policy dolphin`): every round is stored as a table version the router
//! loads before the period is measured, the learned table is stored and activated; a router
//! without the dolphin policy, or a split other than the live one, is refused.

use std::path::Path;
use std::process::Output;

use anyhow::Context;
use dolphin_proto::v1::{GetPolicyRequest, GetTableRequest, ListTablesRequest, PolicyConfig};
use dolphin_router::dolphin::{CompiledTable, RoutingTable};
use dolphin_tests::binaries::dolphinctl;
use dolphin_tests::wait::{self, GENEROUS};
use dolphin_tests::{ClusterConfig, TestCluster};
use serde_json::Value;

/// The simulator run of these tests. The SLOs are tight for the fast dynamo-mocker profile so
/// that the bits matter: periods differ in attainment, and the search has something to compare.
const SIM: [&str; 19] = [
    "learn",
    "--target",
    "sim",
    "--split",
    "2p2d",
    "--k",
    "3",
    "--workload",
    "humaneval",
    "--requests",
    "60",
    "--arrivals",
    "closed:8",
    "--sim-profile",
    "dynamo-mocker",
    "--slo-ttft",
    "25ms",
    "--slo-tpot",
    "6ms",
];

/// Rounds of the simulator run (patience is 8, so the search runs them all).
const SIM_ROUNDS: usize = 8;

fn text(out: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// The simulator run with `--max-rounds`, `--log` and `--out`.
fn sim(max_rounds: usize, log: &Path, out: &Path) -> Vec<String> {
    let mut a = strings(&SIM);
    a.extend([
        "--max-rounds".to_owned(),
        max_rounds.to_string(),
        "--log".to_owned(),
        path(log),
        "--out".to_owned(),
        path(out),
    ]);
    a
}

/// A learned table file, loaded and validated as the router loads tables.
fn load_table(file: &Path) -> anyhow::Result<RoutingTable> {
    let json = std::fs::read_to_string(file).with_context(|| format!("reading {file:?}"))?;
    Ok(CompiledTable::from_json(&json)
        .with_context(|| format!("{file:?} is not a valid table"))?
        .table()
        .clone())
}

/// A round log: its header and its rounds.
fn read_log(log: &Path) -> anyhow::Result<(Value, Vec<Value>)> {
    let text = std::fs::read_to_string(log).with_context(|| format!("reading {log:?}"))?;
    let mut lines = text.lines().map(serde_json::from_str::<Value>);
    let header = lines.next().context("empty log")??;
    let rounds = lines.collect::<Result<Vec<_>, _>>()?;
    Ok((header, rounds))
}

/// The rounds measured by a run, as numbered in its stderr's round lines.
fn measured(out: &Output) -> Vec<usize> {
    stderr(out)
        .lines()
        .filter_map(|l| l.strip_prefix("round "))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

/// The first `n` lines of `text`, newlines included.
fn first_lines(text: &str, n: usize) -> String {
    text.split_inclusive('\n').take(n).collect()
}

#[tokio::test]
async fn learns_on_the_simulator_and_resumes_from_its_log() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("rounds.jsonl");
    let out = dir.path().join("table.json");

    let run = dolphinctl(&sim(SIM_ROUNDS, &log, &out)).await?;
    anyhow::ensure!(run.status.success(), "learn failed: {}", text(&run));
    assert!(run.stdout.is_empty(), "{}", text(&run));
    let err = stderr(&run);
    assert!(
        err.contains("fitted 3 kmeans clusters on 60 requests"),
        "{}",
        text(&run)
    );
    assert_eq!(
        measured(&run),
        (0..SIM_ROUNDS).collect::<Vec<_>>(),
        "{}",
        text(&run)
    );
    let table = load_table(&out)?;
    assert_eq!(table.split.to_string(), "2p2d");
    assert_eq!(table.k, 3);
    assert_eq!(table.bits.len(), 3);
    let (header, rounds) = read_log(&log)?;
    assert_eq!(rounds.len(), SIM_ROUNDS, "{rounds:?}");
    assert_eq!(table.provenance.rounds as usize, rounds.len());
    assert_eq!(table.provenance.rewards.len(), 3, "{:?}", table.provenance);
    let settings = header["settings"].as_str().context("no settings")?;
    assert!(
        settings.contains("split 2p2d k 3") && settings.contains("max_rounds 8"),
        "{settings}"
    );
    // The header holds the fitted table: the learned one has its clusters.
    let fitted: RoutingTable = serde_json::from_value(header["table"].clone())?;
    assert_eq!(fitted.model, table.model);
    assert_eq!(fitted.standardizer, table.standardizer);
    for (i, r) in rounds.iter().enumerate() {
        assert_eq!(r["round"], i, "{r}");
        let n: u64 = r["per_cluster"]
            .as_array()
            .context("per_cluster")?
            .iter()
            .filter_map(|c| c[0].as_u64())
            .sum();
        assert_eq!(n, 60, "every request is in a cluster: {r}");
    }
    let last = rounds.last().context("no rounds")?;
    assert_eq!(last["best_bits"], serde_json::json!(table.bits), "{last}");
    // The SLOs make the bits matter, so the search compares different outcomes.
    assert!(
        rounds
            .iter()
            .any(|r| r["attainment"] != rounds[0]["attainment"]),
        "every round measured the same: {rounds:?}"
    );
    let full_log = std::fs::read(&log)?;
    let full_table = std::fs::read(&out)?;

    // Other settings (more rounds) with the same log: refused, nothing touched.
    let other = dir.path().join("other.json");
    let run = dolphinctl(&sim(12, &log, &other)).await?;
    assert_eq!(run.status.code(), Some(64), "{}", text(&run));
    let err = stderr(&run);
    assert!(
        err.contains(&format!(
            "the round log {} was written for other settings",
            log.display()
        )) && err.contains("max_rounds 12"),
        "{}",
        text(&run)
    );
    assert!(!other.exists());
    assert_eq!(std::fs::read(&log)?, full_log);

    // The same settings: every round comes from the log, none is measured again, and the
    // table is the same to the bit.
    let again = dir.path().join("again.json");
    let run = dolphinctl(&sim(SIM_ROUNDS, &log, &again)).await?;
    anyhow::ensure!(run.status.success(), "resume failed: {}", text(&run));
    assert!(
        stderr(&run).contains(&format!(
            "resuming from {SIM_ROUNDS} rounds in {}",
            log.display()
        )),
        "{}",
        text(&run)
    );
    assert_eq!(measured(&run), Vec::<usize>::new(), "{}", text(&run));
    assert_eq!(load_table(&again)?.bits, table.bits);
    assert_eq!(std::fs::read(&again)?, full_table);
    assert_eq!(std::fs::read(&log)?, full_log);

    // Interrupted after round 2 (header + 3 rounds), then once more in the middle of writing
    // round 3 (a torn last line): each resumes from 3 rounds, measures the rest, and ends
    // with the uninterrupted run's table and log, byte for byte (the simulator is
    // deterministic).
    let full_text = String::from_utf8(full_log.clone())?;
    let torn_line = full_text.lines().nth(4).context("no round 3")?;
    let torn = first_lines(&full_text, 4) + &torn_line[..torn_line.len() / 2];
    for (what, cut) in [("cut", first_lines(&full_text, 4)), ("torn", torn)] {
        std::fs::write(&log, cut)?;
        let resumed = dir.path().join(format!("{what}.json"));
        let run = dolphinctl(&sim(SIM_ROUNDS, &log, &resumed)).await?;
        anyhow::ensure!(run.status.success(), "{what}: {}", text(&run));
        assert!(
            stderr(&run).contains("resuming from 3 rounds"),
            "{what}: {}",
            text(&run)
        );
        assert_eq!(
            measured(&run),
            (3..SIM_ROUNDS).collect::<Vec<_>>(),
            "{what}: {}",
            text(&run)
        );
        assert_eq!(load_table(&resumed)?.bits, table.bits, "{what}");
        assert_eq!(std::fs::read(&resumed)?, full_table, "{what}");
        assert_eq!(
            String::from_utf8(std::fs::read(&log)?)?,
            full_text,
            "{what}: the resumed log"
        );
    }
    Ok(())
}

#[tokio::test]
async fn learns_under_a_load_rule_and_keeps_it_in_the_table_and_the_log() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (log, out) = (dir.path().join("rounds.jsonl"), dir.path().join("t.json"));
    let mut args = sim(2, &log, &out);
    args.extend(strings(&["--load-rule-busy-threshold", "0.5"]));
    let run = dolphinctl(&args).await?;
    anyhow::ensure!(run.status.success(), "learn failed: {}", text(&run));
    let table = load_table(&out)?;
    assert_eq!(
        table.load_rule.map(|r| r.prefill_busy_threshold),
        Some(0.5),
        "{}",
        text(&run)
    );
    let (header, _) = read_log(&log)?;
    let settings = header["settings"].as_str().context("no settings")?;
    assert!(settings.contains("load_rule busy 0.5"), "{settings}");
    let fitted: RoutingTable = serde_json::from_value(header["table"].clone())?;
    assert_eq!(fitted.load_rule, table.load_rule);
    // The same log without the rule: other settings, refused.
    let plain = dolphinctl(&sim(2, &log, &dir.path().join("plain.json"))).await?;
    assert_eq!(plain.status.code(), Some(64), "{}", text(&plain));
    Ok(())
}

/// The simulator run of these tests, two rounds, with `--choose-load-rule`, `extra` and `--out
/// out`; it must succeed.
async fn choose_load_rule(out: &Path, extra: &[&str]) -> anyhow::Result<Output> {
    let mut args = strings(&SIM);
    args.extend(strings(&["--max-rounds", "2", "--choose-load-rule"]));
    args.extend(strings(extra));
    args.extend(["--out".to_owned(), path(out)]);
    let run = dolphinctl(&args).await?;
    anyhow::ensure!(run.status.success(), "learn failed: {}", text(&run));
    Ok(run)
}

/// `--choose-load-rule`'s line per candidate: its rule and its validation attainment.
fn rule_lines(stderr: &str) -> Vec<(String, f64)> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("load rule "))
        .map(|l| {
            let rule = l.split("training").next().unwrap_or("").trim().to_owned();
            let validation = l.rsplit(' ').next().and_then(|v| v.parse().ok());
            (rule, validation.unwrap_or(f64::NAN))
        })
        .collect()
}

#[tokio::test]
async fn chooses_a_load_rule_on_a_validation_sample() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("t.json");
    let run = choose_load_rule(&out, &[]).await?;
    let err = stderr(&run);
    assert!(
        err.contains("choosing a load rule: learning on 60 requests, validating on 60"),
        "{}",
        text(&run)
    );
    let candidates = rule_lines(&err);
    let rules: Vec<&str> = candidates.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(
        rules,
        [
            "none",
            "local while prefill busy > 0.5",
            "local while prefill busy > 1",
            "local while prefill busy > 2"
        ],
        "{}",
        text(&run)
    );
    let top = candidates.iter().map(|c| c.1).fold(f64::MIN, f64::max);
    let chosen = &candidates.iter().find(|c| c.1 == top).context("a top")?.0;
    assert!(
        err.contains(&format!("chose load rule {chosen}:")),
        "{}",
        text(&run)
    );
    let table = load_table(&out)?;
    let name = table.load_rule.map_or("none".to_owned(), |r| r.to_string());
    assert_eq!(&name, chosen);

    // Other candidates, in the order given.
    let run = choose_load_rule(&out, &["--load-rule-candidates", "3,none"]).await?;
    let rules: Vec<String> = rule_lines(&stderr(&run)).into_iter().map(|c| c.0).collect();
    assert_eq!(
        rules,
        ["local while prefill busy > 3", "none"],
        "{}",
        text(&run)
    );

    // What it cannot do: a round log, the live target, a fixed rule, a trace too short to
    // hold a validation sample after the training rows, a candidate that is not a rule.
    let trace = dir.path().join("short.jsonl");
    std::fs::write(
        &trace,
        "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [0, 1]}\n\
         {\"timestamp\": 10, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [0, 2]}\n\
         {\"timestamp\": 20, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [3, 4]}\n",
    )?;
    let base = strings(&[
        "learn",
        "--split",
        "1p1d",
        "--k",
        "2",
        "--sim-profile",
        "dynamo-mocker",
        "--choose-load-rule",
    ]);
    let log = dir.path().join("rounds.jsonl");
    let other = dir.path().join("other.json");
    let (log_arg, trace_arg) = (path(&log), format!("mooncake:{}", trace.display()));
    let cases: [(Vec<&str>, &str); 5] = [
        (
            vec![
                "--workload",
                "humaneval",
                "--load-rule-candidates",
                "none,fast",
            ],
            "expected a number of steps >= 0, got \"fast\"",
        ),
        (
            vec!["--workload", "humaneval", "--log", &log_arg],
            "--choose-load-rule runs one search per rule and writes no round log",
        ),
        (
            vec!["--workload", "humaneval", "--target", "live"],
            "--choose-load-rule learns on the simulator (--target sim)",
        ),
        (
            vec!["--workload", "humaneval", "--load-rule-busy-threshold", "1"],
            "cannot be used with",
        ),
        (
            vec!["--workload", &trace_arg, "--requests", "2"],
            "--choose-load-rule validates on the trace's next 2 rows, but",
        ),
    ];
    for (extra, message) in cases {
        let mut args = base.clone();
        args.extend(strings(&extra));
        args.extend(strings(&["--out", &path(&other)]));
        let run = dolphinctl(&args).await?;
        assert_eq!(run.status.code(), Some(64), "{args:?}: {}", text(&run));
        assert!(stderr(&run).contains(message), "{args:?}: {}", text(&run));
        assert!(!other.exists() && !log.exists(), "{args:?} wrote files");
    }
    Ok(())
}

#[tokio::test]
async fn bad_input_fails_clearly_and_writes_nothing() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("table.json");
    let log = dir.path().join("rounds.jsonl");
    let missing = dir.path().join("missing.jsonl");
    // Bind then drop a listener to get a port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let nobody = format!("127.0.0.1:{port}");
    let base = [
        "learn",
        "--split",
        "1p1d",
        "--k",
        "2",
        "--requests",
        "20",
        "--sim-profile",
        "dynamo-mocker",
    ];
    let cases: [(Vec<String>, i32, String); 4] = [
        (
            strings(&[
                "--workload",
                "humaneval",
                "--load-rule-busy-threshold",
                "-1",
            ]),
            64,
            "expected a number of steps >= 0, got \"-1\"".to_owned(),
        ),
        (
            strings(&["--workload", &format!("mooncake:{}", missing.display())]),
            1,
            format!("reading {}", missing.display()),
        ),
        (
            strings(&["--workload", "humaneval", "--epsilon", "2"]),
            64,
            "--epsilon and --epsilon-decay must be in [0, 1]".to_owned(),
        ),
        (
            strings(&[
                "--workload",
                "humaneval",
                "--target",
                "live",
                "--router-grpc",
                &nobody,
                "--router-admin",
                &nobody,
            ]),
            1,
            format!("cannot connect to the router at http://{nobody}"),
        ),
    ];
    for (extra, code, message) in cases {
        let mut args = strings(&base);
        args.extend(extra);
        args.extend(strings(&["--out", &path(&out), "--log", &path(&log)]));
        let run = dolphinctl(&args).await?;
        assert_eq!(run.status.code(), Some(code), "{args:?}: {}", text(&run));
        assert!(
            stderr(&run).contains(&message),
            "{args:?}: want {message:?}: {}",
            text(&run)
        );
        assert!(run.stdout.is_empty(), "{args:?}: {}", text(&run));
        assert!(!out.exists() && !log.exists(), "{args:?} wrote files");
    }
    Ok(())
}

/// `dolphinctl learn --target live` for 1p1d with two clusters and periods of 10 requests.
fn live(url: &str, admin: &str, split: &str, extra: &[&str]) -> Vec<String> {
    let mut a = strings(&[
        "learn",
        "--target",
        "live",
        "--split",
        split,
        "--k",
        "2",
        "--workload",
        "humaneval",
        "--requests",
        "40",
        "--period-requests",
        "10",
        "--arrivals",
        "closed:4",
        "--router-grpc",
        url,
        "--router-admin",
        admin,
    ]);
    a.extend(strings(extra));
    a
}

/// The router's tables for 1p1d: (stored versions, active version), and its live version.
async fn tables_1p1d(cluster: &TestCluster) -> anyhow::Result<(Vec<String>, String, String)> {
    let l = cluster
        .admin()
        .await?
        .list_tables(ListTablesRequest {})
        .await?
        .into_inner();
    anyhow::ensure!(l.live_split == "1p1d", "{l:?}");
    let (versions, active) = l
        .splits
        .iter()
        .find(|s| s.split == "1p1d")
        .map(|s| (s.versions.clone(), s.active.clone()))
        .unwrap_or_default();
    Ok((versions, active, l.live_version))
}

/// Waits until the router decides with table `version` for the live split.
async fn wait_live(cluster: &TestCluster, version: &str) -> anyhow::Result<()> {
    wait::until(&format!("live table {version}"), GENEROUS, || async {
        let (_, _, live) = tables_1p1d(cluster).await.map_err(|e| format!("{e:#}"))?;
        if live == version { Ok(()) } else { Err(live) }
    })
    .await
}

/// The stored table `version` of 1p1d.
async fn stored(cluster: &TestCluster, version: &str) -> anyhow::Result<RoutingTable> {
    let doc = cluster
        .admin()
        .await?
        .get_table(GetTableRequest {
            split: "1p1d".into(),
            version: version.into(),
        })
        .await?
        .into_inner();
    Ok(RoutingTable::from_json(&doc.json)?)
}

#[tokio::test]
async fn learns_on_a_live_cluster_and_activates_the_table() -> anyhow::Result<()> {
    let cluster = TestCluster::start(ClusterConfig {
        etcd: true,
        router_args: strings(&["--policy", "dolphin"]),
        ..ClusterConfig::default()
    })
    .await?;
    let result = learn_live(&cluster).await;
    if result.is_ok() {
        cluster.passed();
    }
    result
}

async fn learn_live(cluster: &TestCluster) -> anyhow::Result<()> {
    let url = format!("http://{}", cluster.grpc_addr());
    let admin_url = format!("http://{}", cluster.admin_addr());
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("table.json");
    let log = dir.path().join("rounds.jsonl");
    let files = strings(&["--out", &path(&out), "--log", &path(&log)]);
    let files: Vec<&str> = files.iter().map(String::as_str).collect();

    // Another split than the live one: refused before anything is stored.
    let run = dolphinctl(&live(&url, &admin_url, "2p1d", &files)).await?;
    assert_eq!(run.status.code(), Some(1), "{}", text(&run));
    assert!(
        stderr(&run).contains("the live cluster is 1p1d, not 2p1d"),
        "{}",
        text(&run)
    );
    // A router whose policy reads no tables: refused, saying how to start it.
    let mut admin = cluster.admin().await?;
    let dolphin = admin.get_policy(GetPolicyRequest {}).await?.into_inner();
    assert_eq!(dolphin.name, "dolphin");
    admin
        .set_policy(PolicyConfig {
            name: "always-remote".into(),
            params_json: String::new(),
        })
        .await?;
    let run = dolphinctl(&live(&url, &admin_url, "1p1d", &files)).await?;
    assert_eq!(run.status.code(), Some(1), "{}", text(&run));
    let err = stderr(&run);
    assert!(
        err.contains("the router's policy is always-remote")
            && err.contains("start the router with --policy dolphin"),
        "{}",
        text(&run)
    );
    admin.set_policy(dolphin).await?;
    assert!(!out.exists() && !log.exists(), "a refused run wrote files");
    assert_eq!(
        tables_1p1d(cluster).await?,
        (Vec::new(), String::new(), String::new())
    );

    // Learning: gather one period under the fallback, then four rounds, each stored as
    // learn-<stamp>-r<N>; the learned table is stored and activated.
    let mut args = files.clone();
    args.extend(["--max-rounds", "4", "--activate"]);
    let run = dolphinctl(&live(&url, &admin_url, "1p1d", &args)).await?;
    anyhow::ensure!(run.status.success(), "live learn failed: {}", text(&run));
    let err = stderr(&run);
    assert!(
        err.contains("gathering features: one period of 10 requests"),
        "{}",
        text(&run)
    );
    assert_eq!(measured(&run), vec![0, 1, 2, 3], "{}", text(&run));
    let activated = err
        .lines()
        .find_map(|l| l.strip_prefix("stored and activated 1p1d/"))
        .with_context(|| text(&run))?
        .to_owned();
    wait_live(cluster, &activated).await?;
    let (versions, active, _) = tables_1p1d(cluster).await?;
    assert_eq!(active, activated);
    let probes: Vec<&String> = versions
        .iter()
        .filter(|v| v.starts_with("learn-"))
        .collect();
    assert_eq!(probes.len(), 4, "{versions:?}");
    let prefix = probes[0]
        .rsplit_once("-r")
        .with_context(|| format!("{versions:?}"))?
        .0;
    let mut want: Vec<String> = (1..=4).map(|r| format!("{prefix}-r{r}")).collect();
    want.push(activated.clone());
    want.sort();
    let mut got = versions.clone();
    got.sort();
    assert_eq!(got, want);

    // What was measured is what was stored: each round's bits are its version's, on the
    // fitted clusters; every request of a period was decided by the table and counted.
    let learned = load_table(&out)?;
    assert_eq!(learned.split.to_string(), "1p1d");
    assert_eq!(learned.k, 2);
    assert_eq!(stored(cluster, &activated).await?, learned);
    let (_, rounds) = read_log(&log)?;
    assert_eq!(rounds.len(), 4);
    assert_eq!(learned.provenance.rounds, 4);
    for (i, r) in rounds.iter().enumerate() {
        let probe = stored(cluster, &format!("{prefix}-r{}", i + 1)).await?;
        assert_eq!(serde_json::json!(probe.bits), r["bits"], "{r}");
        assert_eq!(probe.model, learned.model);
        let n: u64 = r["per_cluster"]
            .as_array()
            .context("per_cluster")?
            .iter()
            .filter_map(|c| c[0].as_u64())
            .sum();
        assert_eq!(n, 10, "{r}");
    }
    assert_eq!(
        serde_json::json!(learned.bits),
        rounds[3]["best_bits"],
        "{rounds:?}"
    );

    // Without --activate: the round's table is stored and measured, then the table active
    // before is active again, and the learned one goes to stdout only.
    let run = dolphinctl(&live(&url, &admin_url, "1p1d", &["--max-rounds", "1"])).await?;
    anyhow::ensure!(run.status.success(), "second learn failed: {}", text(&run));
    assert_eq!(measured(&run), vec![0], "{}", text(&run));
    assert!(
        stderr(&run).contains(&format!(
            "re-activated 1p1d/{activated}, the table active before learning"
        )),
        "{}",
        text(&run)
    );
    let printed = RoutingTable::from_json(&String::from_utf8(run.stdout.clone())?)?;
    assert_eq!(printed.split.to_string(), "1p1d");
    assert_eq!(printed.provenance.rounds, 1);
    wait_live(cluster, &activated).await?;
    let (after, active, _) = tables_1p1d(cluster).await?;
    assert_eq!(active, activated);
    assert_eq!(after.len(), versions.len() + 1, "{after:?}");
    Ok(())
}
