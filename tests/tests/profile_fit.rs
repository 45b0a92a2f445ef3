//! `dolphinctl profile fit --worker`: a running decode worker measured over gRPC. The worker
//! runs the sim engine on the shipped `dynamo-mocker` profile at full time scale, so its steps
//! really take the profile's times; every measured shape must come out near what the profile
//! says of it (a wrong prompt length, a cache that did not hit, a batch that did not run
//! together or an occupancy computed differently would each be off by far more), and the fitted
//! profile must load. A refused call (a prefill worker) is an error that names the reason.

use anyhow::Context;
use dolphin_engine::SimProfile;
use dolphin_tests::binaries::dolphinctl;
use dolphin_tests::{ClusterConfig, TestCluster};
use serde_json::Value;

/// The decode worker's pool: small, so the occupancies below need short contexts.
const TOTAL_BLOCKS: u32 = 256;
const BLOCK_SIZE: u32 = 16;

#[tokio::test]
async fn a_live_decode_worker_is_measured_as_its_engine_runs() -> anyhow::Result<()> {
    let cluster = TestCluster::start(ClusterConfig {
        time_scale: 1.0,
        decode_args: vec!["--total-blocks".into(), TOTAL_BLOCKS.to_string()],
        ..ClusterConfig::default()
    })
    .await?;
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("live.json");
    let args: Vec<String> = [
        "profile",
        "fit",
        "--worker",
        cluster.decode[0].grpc_addr(),
        "--prefill-tokens",
        "64,512,1024,2048",
        "--prefill-context",
        "0,512,1024",
        "--batches",
        "1,4,8",
        "--occupancies",
        "0.1,0.3",
        "--reps",
        "2",
        "--decode-tokens",
        "8",
        "--max-prefix",
        "1024",
        "--out",
    ]
    .into_iter()
    .map(str::to_owned)
    .chain([out.display().to_string()])
    .collect();
    let run = dolphinctl(&args).await?;
    let stderr = String::from_utf8_lossy(&run.stderr);
    anyhow::ensure!(run.status.success(), "profile fit failed:\n{stderr}");

    let truth = SimProfile::builtin("dynamo-mocker").context("shipped")?;
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("live.fit.json"))?)?;
    assert_eq!(
        report["total_blocks"], TOTAL_BLOCKS,
        "the worker's own pool"
    );
    assert_eq!(report["block_size"], BLOCK_SIZE);
    let samples = report["samples"].as_array().context("samples")?;
    let (mut prefill, mut context, mut decode) = (0, 0, 0);
    for s in samples {
        let ms = s["ms"].as_f64().context("ms")?;
        let u = |k: &str| s[k].as_u64().map(|v| v as u32).context("field");
        let expected = match s["kind"].as_str() {
            Some("prefill") => {
                let (tokens, ctx) = (u("tokens")?, u("context")?);
                if ctx == 0 {
                    prefill += 1;
                } else {
                    context += 1;
                    // The context is what the worker found cached: the whole prefix asked for.
                    assert!(
                        ctx % 512 == 0,
                        "{s}: a cached prefix of whole blocks, as asked"
                    );
                    assert_eq!(tokens, 256, "{s}: the chunk after the prefix");
                }
                truth.prefill_ms(tokens)
            }
            Some("decode") => {
                decode += 1;
                let a = f64::from(u("blocks_read")?) / f64::from(TOTAL_BLOCKS);
                truth.decode_ms(u("batch")?, a)
            }
            other => anyhow::bail!("unexpected shape {other:?}: {s}"),
        };
        let err = (ms - expected) / expected;
        // The worker adds its own planning and streaming to each step; a shared, busy host
        // adds noise. Mistakes in what was measured are off by far more.
        assert!(
            (-0.15..0.6).contains(&err),
            "{s}: measured {ms:.2} ms, the profile says {expected:.2} ms\n{stderr}"
        );
    }
    assert_eq!(
        prefill, 4,
        "every size fits one step of the sim's 2048 tokens"
    );
    assert_eq!(
        context, 2,
        "contexts 512 and 1024 from the 1024-token prefix"
    );
    // Batch 1 at 0.3 of 256 blocks needs a 1,228-token context: past the prefix, skipped.
    assert_eq!(decode, 5, "{stderr}");
    let fitted = SimProfile::load(out.to_str().context("utf-8")?)?;
    assert!(fitted.notes[0].contains("--worker"), "{:?}", fitted.notes);
    assert_eq!(fitted.kv_bytes_per_token, truth_bytes(&cluster).await?);

    // A prefill worker runs no Decode: refused with the reason, exit code 64.
    let mut refused = args.clone();
    refused[3] = cluster.prefill[0].grpc_addr().to_owned();
    let run = dolphinctl(&refused).await?;
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("not a decode worker"), "{stderr}");
    cluster.passed();
    Ok(())
}

/// The decode worker's KV bytes per token, as its `Info` says.
async fn truth_bytes(cluster: &TestCluster) -> anyhow::Result<u64> {
    let channel = dolphin_tests::grpc::channel(cluster.decode[0].grpc_addr()).await?;
    let info = dolphin_proto::v1::worker_client::WorkerClient::new(channel)
        .info(dolphin_proto::v1::InfoRequest {})
        .await?
        .into_inner();
    Ok(info.kv_bytes_per_token)
}
