//! `dolphinctl up`: start workers, then the router, as supervised children; wire them with static
//! discovery or etcd; print a summary; restart a child that dies (with backoff, on the addresses
//! it had, while the others keep serving: [`crate::supervise`]); stop everything on Ctrl-C /
//! SIGTERM / SIGHUP.
//!
//! Children run in their own process groups (a terminal's Ctrl-C reaches dolphinctl only, which
//! stops the router first so it stops admitting, then the workers) and, where `setpriv` exists,
//! with a parent-death SIGKILL so even `kill -9 dolphinctl` leaves nothing behind (see
//! [`crate::pdeathsig`] for the limits).

use std::path::{Path, PathBuf};
use std::time::Duration;

use dolphin_proto::v1::ListModelsRequest;
use dolphin_proto::v1::inference_client::InferenceClient;
use tokio::task::JoinSet;

use crate::cli::{Engine, UpArgs};
use crate::client;
use crate::error::CtlError;
use crate::launch::{
    DECODE_BIN, DEFAULT_MODEL, PREFILL_BIN, ROUTER_BIN, WorkerKind, router_args, worker_args,
};
use crate::process::{ManagedProcess, ProcessSpec};
use crate::ready::ReadyInfo;
use crate::summary::{ClusterSummary, MemberSummary};
use crate::supervise::{Supervised, supervise};
use crate::workers;
use dolphin_cluster::signal::StopSignals;

/// The directory holding dolphinctl itself, where `cargo build` puts the other binaries too.
pub fn default_bin_dir() -> Result<PathBuf, CtlError> {
    let exe = std::env::current_exe().map_err(|source| CtlError::Spawn {
        name: "dolphinctl".to_owned(),
        program: PathBuf::from("/proc/self/exe"),
        source,
    })?;
    Ok(exe
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf))
}

/// Where the workers look for their model without `--model-path`: SmolLM2 in the model
/// directory (`$DOLPHIN_MODEL_DIR`, else `~/.cache/dolphin/models`).
pub fn default_model_path() -> PathBuf {
    use dolphin_tokenizer::{SMOLLM2_FILE, find_model, model_dir};
    find_model(SMOLLM2_FILE).unwrap_or_else(|| {
        model_dir()
            .unwrap_or_else(|| PathBuf::from("."))
            .join(SMOLLM2_FILE)
    })
}

/// Runs `dolphinctl up` until a stop signal (`Ok`) or an unexpected child exit (`Err`).
pub async fn up(mut args: UpArgs) -> Result<(), CtlError> {
    if args.engine == Engine::Candle {
        // Resolved once here so the router and every worker load the same file.
        let path = args.model_path.clone().unwrap_or_else(default_model_path);
        if !path.is_file() {
            return Err(CtlError::ModelMissing { path });
        }
        args.model_path = Some(path);
    }
    let bin_dir = match &args.bin_dir {
        Some(dir) => dir.clone(),
        None => default_bin_dir()?,
    };
    for bin in [ROUTER_BIN, PREFILL_BIN, DECODE_BIN] {
        let path = bin_dir.join(bin);
        if !path.is_file() {
            return Err(CtlError::BinaryMissing { path });
        }
    }
    let log_dir = match &args.log_dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("dolphin-up-{}", std::process::id())),
    };
    std::fs::create_dir_all(&log_dir).map_err(|source| CtlError::Log {
        path: log_dir.clone(),
        source,
    })?;
    // Installed before the first child starts, so Ctrl-C during startup still cleans up.
    let mut signals = StopSignals::install_with_hangup().map_err(CtlError::Signal)?;
    let grace = Duration::from_secs(args.grace_secs);

    let mut members = Vec::new();
    let started = tokio::select! {
        res = start(&args, &bin_dir, &log_dir, &mut members) => res.map(Some),
        sig = signals.recv() => {
            eprintln!("dolphinctl: {sig} during startup; stopping");
            Ok(None)
        }
    };
    let summary = match started {
        Ok(Some(summary)) => summary,
        Ok(None) => {
            shutdown(members, grace).await;
            return Ok(());
        }
        Err(err) => {
            shutdown(members, grace).await;
            return Err(err);
        }
    };
    print!("{}", summary.render());
    println!("{}", summary.ready_line());

    // Restarted processes come back on the addresses they announced; with static discovery
    // the router knows workers by id and address, so the ids are kept too.
    for m in &mut members {
        m.pin_announced(args.etcd.is_none());
    }
    let sig = supervise(
        &mut members,
        &mut signals,
        Duration::from_secs(args.ready_timeout_secs),
    )
    .await;
    eprintln!("dolphinctl: {sig}; stopping the cluster");
    shutdown(members, grace).await;
    Ok(())
}

/// Starts every worker, waits for them, then starts the router and waits for it.
async fn start(
    args: &UpArgs,
    bin_dir: &Path,
    log_dir: &Path,
    members: &mut Vec<Supervised>,
) -> Result<ClusterSummary, CtlError> {
    let ready_timeout = Duration::from_secs(args.ready_timeout_secs);
    // Spawn all workers first so they boot in parallel, then collect their READY lines. Each
    // process joins `members` as soon as it exists, so an interrupted startup still stops it.
    let kinds = std::iter::repeat_n(WorkerKind::Prefill, args.prefill as usize)
        .enumerate()
        .chain(std::iter::repeat_n(WorkerKind::Decode, args.decode as usize).enumerate());
    for (i, kind) in kinds {
        let name = format!("{}-{i}", kind.as_str());
        let spec = spec(
            &name,
            &bin_dir.join(kind.binary()),
            worker_args(args, kind),
            log_dir,
        );
        let process = ManagedProcess::spawn(spec.clone())?;
        members.push(Supervised::new(
            kind.as_str(),
            spec,
            process,
            ReadyInfo::default(),
        ));
    }
    let mut prefill_addrs = Vec::new();
    let mut decode_addrs = Vec::new();
    for m in members.iter_mut() {
        m.ready = m.process.wait_ready(ready_timeout).await?;
        let addr = required(m.process.name(), m.ready.grpc_addr.clone(), "grpc_addr")?;
        if m.role == WorkerKind::Prefill.as_str() {
            prefill_addrs.push(addr);
        } else {
            decode_addrs.push(addr);
        }
    }

    let router_spec = spec(
        "router",
        &bin_dir.join(ROUTER_BIN),
        router_args(args, &prefill_addrs, &decode_addrs),
        log_dir,
    );
    let mut router = ManagedProcess::spawn(router_spec.clone())?;
    let ready = router.wait_ready(ready_timeout).await;
    // The router goes first in the list (the summary shows it first; shutdown stops it first).
    members.insert(
        0,
        Supervised::new(
            "router",
            router_spec,
            router,
            ready.as_ref().cloned().unwrap_or_default(),
        ),
    );
    let ready = ready?;
    let http_addr = required("router", ready.http_addr.clone(), "http_addr")?;
    let grpc_addr = required("router", ready.grpc_addr.clone(), "grpc_addr")?;
    let admin_addr = required("router", ready.admin_addr.clone(), "admin_addr")?;
    let metrics_addr = required("router", ready.metrics_addr.clone(), "metrics_addr")?;
    // The router binds (and says READY) before it has reached the workers; "up" means serving.
    let expected = (args.prefill + args.decode) as usize;
    wait_for_workers(&admin_addr, expected, ready_timeout).await?;
    let model = match served_model(&grpc_addr).await {
        Some(model) => model,
        None => args
            .model
            .clone()
            .unwrap_or_else(|| DEFAULT_MODEL.to_owned()),
    };
    Ok(ClusterSummary {
        http_addr,
        grpc_addr,
        admin_addr,
        metrics_addr,
        model,
        discovery: match &args.etcd {
            Some(url) => format!("etcd {url}"),
            None => "static".to_owned(),
        },
        log_dir: log_dir.to_path_buf(),
        processes: members
            .iter()
            .map(|m| MemberSummary {
                name: m.process.name().to_owned(),
                role: m.role.to_owned(),
                id: m.ready.id.clone(),
                pid: m.process.pid(),
                grpc_addr: m.ready.grpc_addr.clone(),
                kv_addr: m.ready.kv_addr.clone(),
                http_addr: m.ready.http_addr.clone(),
                admin_addr: m.ready.admin_addr.clone(),
                metrics_addr: m.ready.metrics_addr.clone(),
                log: m.process.log_path().cloned(),
            })
            .collect(),
    })
}

fn spec(name: &str, program: &Path, args: Vec<String>, log_dir: &Path) -> ProcessSpec {
    let mut spec = ProcessSpec::new(name, program).args(args);
    spec.log_path = Some(log_dir.join(format!("{name}.log")));
    spec
}

fn required(name: &str, value: Option<String>, field: &'static str) -> Result<String, CtlError> {
    value.ok_or_else(|| CtlError::ReadyMissingField {
        name: name.to_owned(),
        field,
    })
}

/// Polls the router's worker list (on its admin listener) until it shows `expected` workers
/// with live event streams.
async fn wait_for_workers(
    admin_addr: &str,
    expected: usize,
    timeout: Duration,
) -> Result<(), CtlError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let seen = match workers::list_workers(admin_addr).await {
            Ok(rows) => {
                let live = rows.iter().filter(|w| w.events_live).count();
                if rows.len() == expected && live == expected {
                    return Ok(());
                }
                format!("{} listed, {live} live", rows.len())
            }
            Err(err) => err.to_string(),
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(CtlError::WorkersNotSeen {
                expected,
                timeout,
                seen,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The first model the router lists, for the summary's examples (best effort).
async fn served_model(grpc_addr: &str) -> Option<String> {
    let ask = async {
        let mut inference = InferenceClient::new(client::connect(grpc_addr).await.ok()?);
        let models = inference
            .list_models(ListModelsRequest {})
            .await
            .ok()?
            .into_inner();
        models.models.into_iter().next().map(|m| m.id)
    };
    tokio::time::timeout(Duration::from_secs(5), ask)
        .await
        .ok()
        .flatten()
}

/// Stops the router first (so it stops admitting), then every worker at once.
async fn shutdown(mut members: Vec<Supervised>, grace: Duration) {
    if let Some(pos) = members.iter().position(|m| m.role == "router") {
        let mut router = members.remove(pos);
        let status = router.process.stop(grace).await;
        eprintln!("dolphinctl: router stopped ({status})");
    }
    let mut stopping = JoinSet::new();
    for mut m in members {
        stopping.spawn(async move {
            let status = m.process.stop(grace).await;
            (m.process.name().to_owned(), status)
        });
    }
    while let Some(res) = stopping.join_next().await {
        match res {
            Ok((name, status)) => eprintln!("dolphinctl: {name} stopped ({status})"),
            // The task panicked; its ManagedProcess was dropped, which SIGKILLs the child.
            Err(err) => eprintln!("dolphinctl: stopping a worker failed: {err}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::up_args;

    #[tokio::test]
    async fn missing_binaries_are_reported_before_anything_starts() {
        let dir = tempfile::tempdir().unwrap();
        let mut args = up_args(&[]);
        args.bin_dir = Some(dir.path().to_path_buf());
        let err = up(args).await.unwrap_err();
        assert!(matches!(err, CtlError::BinaryMissing { .. }), "{err}");
        assert!(err.to_string().contains("dolphin-router"), "{err}");
    }

    #[tokio::test]
    async fn a_missing_model_file_is_reported_before_anything_starts() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none.gguf");
        let mut args = up_args(&["--engine", "candle"]);
        args.model_path = Some(missing.clone());
        args.bin_dir = Some(dir.path().to_path_buf());
        let err = up(args).await.unwrap_err();
        assert!(
            matches!(&err, CtlError::ModelMissing { path } if *path == missing),
            "{err}"
        );
        assert!(err.to_string().contains("fetch-model.sh"), "{err}");
    }
}
