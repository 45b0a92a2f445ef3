//! KV transfer throughput over loopback: `KvSender` -> `KvReceiver` against a plain TCP copy of
//! the same bytes in the same block sizes, in one run, interleaved repetitions.
//!
//! Default workload: Qwen2.5-72B's KV (320 KiB per token in bf16) scaled down 10x to 32 KiB per
//! token, so a 16-token block is 512 KiB and an 8k-token transfer is 512 blocks = 256 MiB;
//! 4 transfers move 1 GiB per repetition.
//!
//! A third path runs the KV transport over mutual TLS (certificates made for the run with rcgen,
//! as a cluster with `--tls-cert/--tls-key/--tls-ca` has them), so the cost of TLS is a ratio
//! from the same run.
//!
//! With `--link-gbit 10,25` it runs itself once per rate inside a network namespace whose
//! loopback is shaped to that rate (`dolphin_bench::link`; root and iproute2), so the ratios
//! are those of a NIC of that speed rather than of memory-copy speed, and writes
//! `bench/results/kv_transfer_link.json`.
//!
//! `cargo run --release -p dolphin-bench --bin kv_transfer [-- --reps 5 --out PATH]`

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use clap::Parser;
use dolphin_bench::link::ShapedLoopback;
use dolphin_bench::plain_socket::PlainPath;
use dolphin_bench::proc_stat::CpuClock;
use dolphin_bench::stats::median;
use dolphin_kv_transfer::{KvBlock, KvReceiver, KvSender, TransferConfig, frame::block_checksum};
use serde::Serialize;
use tokio::net::TcpStream;

/// Issue 11's target: the KV transport at least 90% of a plain socket's throughput.
const TARGET_RATIO: f64 = 0.9;
/// Issue 12's target: the KV transport over mutual TLS at least 80% of it in plaintext.
const TLS_TARGET_RATIO: f64 = 0.8;

#[derive(Debug, Parser)]
#[command(about = "KV transfer vs plain TCP throughput over loopback")]
struct Args {
    /// KV bytes per token (default: 320 KiB / 10).
    #[arg(long, default_value_t = 32 * 1024)]
    bytes_per_token: usize,
    /// Tokens per block.
    #[arg(long, default_value_t = 16)]
    block_tokens: usize,
    /// Tokens per transfer.
    #[arg(long, default_value_t = 8192)]
    transfer_tokens: usize,
    /// Transfers per repetition.
    #[arg(long, default_value_t = 4)]
    transfers: usize,
    /// Receiver channel depth per transfer (`TransferConfig::channel_blocks`).
    #[arg(long, default_value_t = 16)]
    channel_blocks: usize,
    /// Repetitions of each path (interleaved).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Where to write the JSON result (default: bench/results/kv_transfer.json).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Run only one path, write no JSON (for profiling one side under perf).
    #[arg(long, value_enum)]
    only: Option<Only>,
    /// Link rates, Gbit/s: run the benchmark once per rate on a loopback shaped to it, in a
    /// network namespace of its own (root and iproute2), and write the rates' results
    /// together (default: bench/results/kv_transfer_link.json, or `--out`).
    #[arg(long, value_delimiter = ',')]
    link_gbit: Vec<f64>,
}

/// One link rate's run.
#[derive(Debug, Serialize)]
struct LinkRun {
    link_gbit: f64,
    /// The token bucket's depth, bytes.
    burst_bytes: u64,
    plain_median_gbps: f64,
    kv_median_gbps: f64,
    kv_tls_median_gbps: f64,
    /// kv_tls_median / kv_median at this rate.
    tls_ratio: f64,
    tls_target_ratio: f64,
    /// The whole report of the run inside the namespace.
    run: serde_json::Value,
}

#[derive(Debug, Serialize)]
struct LinkReport {
    cpu: String,
    cpu_flags: Vec<&'static str>,
    cpus: usize,
    runs: Vec<LinkRun>,
    notes: &'static str,
}

/// `--link-gbit`: this benchmark again, once per rate, inside a shaped namespace.
fn run_on_links(args: &Args) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("this benchmark's path")?;
    let tmp = std::env::temp_dir().join(format!("dolphin-kv-link-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).with_context(|| format!("create {}", tmp.display()))?;
    let mut runs = Vec::new();
    for (i, &gbit) in args.link_gbit.iter().enumerate() {
        let link = ShapedLoopback::create(&format!("dolphin-kv-{}-{i}", std::process::id()), gbit)?;
        let out = tmp.join(format!("{i}.json"));
        println!("link {gbit} Gbit/s:");
        let status = link
            .command(&exe)
            .args(["--bytes-per-token", &args.bytes_per_token.to_string()])
            .args(["--block-tokens", &args.block_tokens.to_string()])
            .args(["--transfer-tokens", &args.transfer_tokens.to_string()])
            .args(["--transfers", &args.transfers.to_string()])
            .args(["--channel-blocks", &args.channel_blocks.to_string()])
            .args(["--reps", &args.reps.to_string()])
            .arg("--out")
            .arg(&out)
            .status()
            .context("run the benchmark in the namespace")?;
        ensure!(
            status.success(),
            "the run at {gbit} Gbit/s failed ({status})"
        );
        let text =
            std::fs::read_to_string(&out).with_context(|| format!("read {}", out.display()))?;
        let run: serde_json::Value = serde_json::from_str(&text)?;
        let num = |k: &str| {
            run[k]
                .as_f64()
                .with_context(|| format!("{k} in {}", out.display()))
        };
        runs.push(LinkRun {
            link_gbit: link.gbit(),
            burst_bytes: dolphin_bench::link::burst_bytes(gbit),
            plain_median_gbps: num("plain_median_gbps")?,
            kv_median_gbps: num("kv_median_gbps")?,
            kv_tls_median_gbps: num("kv_tls_median_gbps")?,
            tls_ratio: num("tls_ratio")?,
            tls_target_ratio: TLS_TARGET_RATIO,
            run,
        });
    }
    let _ = std::fs::remove_dir_all(&tmp);
    for r in &runs {
        println!(
            "link {} Gbit/s: plain {:.2} GB/s, kv {:.2} GB/s, kv over mTLS {:.2} GB/s: {:.1}% of kv \
             (target >= {:.0}%)",
            r.link_gbit,
            r.plain_median_gbps,
            r.kv_median_gbps,
            r.kv_tls_median_gbps,
            100.0 * r.tls_ratio,
            100.0 * TLS_TARGET_RATIO
        );
    }
    let report = LinkReport {
        cpu: dolphin_bench::machine::cpu_name(),
        cpu_flags: dolphin_bench::machine::cpu_flags(),
        cpus: std::thread::available_parallelism().map_or(1, usize::from),
        runs,
        notes: "each rate: a network namespace of its own whose loopback is shaped by a token \
                bucket (tc tbf, 2 ms of the rate deep, at least 1 MiB; 20 ms queue), both ends \
                of every path in one process inside it, on this machine's cores",
    };
    let out = dolphin_bench::results::write_json("kv_transfer_link", args.out.as_deref(), &report)?;
    println!("wrote {}", out.display());
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Only {
    Kv,
    KvTls,
    Plain,
}

#[derive(Debug, Serialize)]
struct Report {
    cpu: String,
    cpu_flags: Vec<&'static str>,
    workload: Workload,
    plain_gbps: Vec<f64>,
    kv_gbps: Vec<f64>,
    plain_median_gbps: f64,
    kv_median_gbps: f64,
    /// kv_median / plain_median.
    ratio: f64,
    target_ratio: f64,
    /// The KV transport over mutual TLS (TLS 1.3, ring's AES-GCM).
    kv_tls_gbps: Vec<f64>,
    kv_tls_median_gbps: f64,
    tls_cipher_suite: String,
    /// kv_tls_median / kv_median: what TLS costs the KV transport.
    tls_ratio: f64,
    tls_target_ratio: f64,
    /// ring's AES-128-GCM sealing 16 KiB records on one core.
    aes_128_gcm_gbps_one_core: f64,
    /// The best `tls_ratio` possible with both ends on this machine's cores, from CPU per GiB:
    /// kv's, against kv's plus one seal and one open of every byte at the speed above.
    tls_ratio_bound_shared_cores: f64,
    kv_tls_cpu_s_per_gib: Vec<f64>,
    /// Process CPU time (both ends, all threads) per GiB moved: robust to other load on the
    /// machine, unlike GB/s.
    plain_cpu_s_per_gib: Vec<f64>,
    kv_cpu_s_per_gib: Vec<f64>,
    /// Median plain CPU per GiB / median kv CPU per GiB.
    cpu_efficiency_ratio: f64,
    load_average_before: String,
    /// CRC-32 over the blocks where they lie in memory (what a sender pays when it checksums
    /// blocks it is handed; the KV path no longer does).
    crc32_checksum_gbps: f64,
    /// CRC-32 over each block right after it was copied into a buffer, as the engine's export
    /// takes it (`KvBlock::new` after the copy out of the KV memory): what the checksum costs
    /// where it is taken now, outside the transport.
    crc32_at_export_gbps: f64,
    cpus: usize,
    notes: &'static str,
}

#[derive(Debug, Serialize)]
struct Workload {
    bytes_per_token: usize,
    block_tokens: usize,
    block_bytes: usize,
    blocks_per_transfer: usize,
    transfers_per_rep: usize,
    bytes_per_rep: u64,
    reps: usize,
    channel_blocks: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !args.link_gbit.is_empty() {
        ensure!(
            args.only.is_none(),
            "--link-gbit runs every path: drop --only"
        );
        return run_on_links(&args);
    }
    let block_bytes = args.bytes_per_token * args.block_tokens;
    let n_blocks = args.transfer_tokens.div_ceil(args.block_tokens);
    ensure!(block_bytes > 0 && n_blocks > 0 && args.transfers > 0 && args.reps > 0);
    let blocks = make_blocks(n_blocks, block_bytes);
    let bytes_per_rep = (block_bytes * n_blocks * args.transfers) as u64;
    println!(
        "workload: {} transfers x {n_blocks} blocks x {} KiB = {:.2} GiB per repetition, {} reps",
        args.transfers,
        block_bytes / 1024,
        bytes_per_rep as f64 / (1u64 << 30) as f64,
        args.reps
    );

    let load_average_before = dolphin_bench::machine::load_average();
    let clock = CpuClock::new(std::process::id());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let pki = dolphin_tls::testing::TestPki::new();
    let tls = |tag: &str| -> anyhow::Result<dolphin_tls::Tls> {
        pki.member(tag).load()?.context("TLS is on")
    };
    let (decode_tls, prefill_tls) = (tls("decode")?, tls("prefill")?);
    let Some((plain, kv, kv_tls, suite)) = rt.block_on(async {
        let cfg = TransferConfig {
            io_timeout: Duration::from_secs(60),
            max_block_bytes: u32::try_from(block_bytes)?.max(1 << 20),
            channel_blocks: args.channel_blocks,
            idle_timeout: Duration::from_secs(600),
        };
        let mut kv_path = KvPath::new(cfg.clone(), None).await?;
        let mut tls_path = KvPath::new(cfg, Some((&decode_tls, &prefill_tls))).await?;
        let mut plain_path = PlainPath::new(block_bytes).await?;
        if let Some(only) = args.only {
            for rep in 0..args.reps {
                let d = match only {
                    Only::Kv => kv_path.run(&blocks, args.transfers).await?,
                    Only::KvTls => tls_path.run(&blocks, args.transfers).await?,
                    Only::Plain => plain_path.run(&blocks, args.transfers).await?,
                };
                println!("rep {rep}: {only:?} {:.2} GB/s", gbps(bytes_per_rep, d));
            }
            return anyhow::Ok(None);
        }
        // Warm-up: connections, allocator, buffer pool, the source blocks' pages.
        kv_path.run(&blocks, 1).await?;
        tls_path.run(&blocks, 1).await?;
        plain_path.run(&blocks, 1).await?;
        let (mut plain, mut kv, mut kv_tls) =
            (Samples::default(), Samples::default(), Samples::default());
        for rep in 0..args.reps {
            // Interleave the paths transfer by transfer (rotating which goes first), so all see
            // the same share of whatever else runs on the machine.
            let mut acc = [(Duration::ZERO, Duration::ZERO); 3];
            for t in 0..args.transfers {
                for k in 0..3 {
                    let path = (rep + t + k) % 3;
                    let s = match path {
                        0 => measure(&clock, plain_path.run(&blocks, 1)).await?,
                        1 => measure(&clock, kv_path.run(&blocks, 1)).await?,
                        _ => measure(&clock, tls_path.run(&blocks, 1)).await?,
                    };
                    acc[path].0 += s.0;
                    acc[path].1 += s.1;
                }
            }
            let g = acc.map(|a| gbps(bytes_per_rep, a.0));
            let c = acc.map(|a| per_gib(bytes_per_rep, a.1));
            println!(
                "rep {rep}: plain {:.2} GB/s ({:.3} CPU s/GiB), kv {:.2} GB/s ({:.3} CPU s/GiB): \
                 {:.0}%, kv over mTLS {:.2} GB/s ({:.3} CPU s/GiB): {:.0}% of kv",
                g[0],
                c[0],
                g[1],
                c[1],
                100.0 * g[1] / g[0],
                g[2],
                c[2],
                100.0 * g[2] / g[1]
            );
            plain.push(g[0], c[0]);
            kv.push(g[1], c[1]);
            kv_tls.push(g[2], c[2]);
        }
        let suite = negotiated(&tls_path.target, &prefill_tls).await?;
        anyhow::Ok(Some((plain, kv, kv_tls, suite)))
    })?
    else {
        return Ok(());
    };

    let crc = checksum_gbps(&blocks);
    let crc_export = export_checksum_gbps(&blocks);
    let (pm, km) = (
        median(plain.gbps.iter().copied()),
        median(kv.gbps.iter().copied()),
    );
    let tm = median(kv_tls.gbps.iter().copied());
    let aes = aes_gcm_gbps(&blocks)?;
    // CPU per GiB of the plaintext KV path plus one seal and one open of every byte (opening
    // costs what sealing does): the best TLS can do while both ends share these cores.
    let tls_cpu_floor = median(kv.cpu.iter().copied()) + 2.0 * (1u64 << 30) as f64 / (aes * 1e9);
    let tls_bound = median(kv.cpu.iter().copied()) / tls_cpu_floor;
    let (pcpu, kcpu) = (
        median(plain.cpu.iter().copied()),
        median(kv.cpu.iter().copied()),
    );
    let report = Report {
        cpu: dolphin_bench::machine::cpu_name(),
        cpu_flags: dolphin_bench::machine::cpu_flags(),
        workload: Workload {
            bytes_per_token: args.bytes_per_token,
            block_tokens: args.block_tokens,
            block_bytes,
            blocks_per_transfer: n_blocks,
            transfers_per_rep: args.transfers,
            bytes_per_rep,
            reps: args.reps,
            channel_blocks: args.channel_blocks,
        },
        plain_median_gbps: pm,
        kv_median_gbps: km,
        ratio: km / pm,
        target_ratio: TARGET_RATIO,
        plain_gbps: plain.gbps,
        kv_gbps: kv.gbps,
        plain_cpu_s_per_gib: plain.cpu,
        kv_cpu_s_per_gib: kv.cpu,
        cpu_efficiency_ratio: pcpu / kcpu,
        kv_tls_median_gbps: tm,
        tls_cipher_suite: suite,
        tls_ratio: tm / km,
        aes_128_gcm_gbps_one_core: aes,
        tls_ratio_bound_shared_cores: tls_bound,
        tls_target_ratio: TLS_TARGET_RATIO,
        kv_tls_gbps: kv_tls.gbps,
        kv_tls_cpu_s_per_gib: kv_tls.cpu,
        load_average_before,
        crc32_checksum_gbps: crc,
        crc32_at_export_gbps: crc_export,
        cpus: std::thread::available_parallelism().map_or(1, usize::from),
        notes: "loopback, one connection per path, transfers sequential and interleaved between \
                the paths, both ends in this process; plain = write_all / read_exact per block into a reused buffer plus an \
                8-byte ack per transfer; kv = KvSender/KvReceiver (CRC-32 per block: the \
                payload's taken when the blocks were made, as the engine's export takes it, \
                and folded with transfer id and index by the sender; the receiver checks \
                every byte; a buffer per block, bounded channel to a consumer task); GB/s = 1e9 payload bytes per \
                second; CPU s/GiB from /proc/self/stat (10 ms ticks)",
    };
    println!(
        "median: plain {pm:.2} GB/s, kv {km:.2} GB/s, ratio {:.1}% (target >= {:.0}%); CPU per GiB: \
         plain {pcpu:.3} s, kv {kcpu:.3} s ({:.1}%); CRC-32 over cold blocks {crc:.1} GB/s, \
         at export (after the copy) {crc_export:.1} GB/s",
        100.0 * report.ratio,
        100.0 * TARGET_RATIO,
        100.0 * report.cpu_efficiency_ratio
    );
    println!(
        "median over mutual TLS: kv {tm:.2} GB/s, {:.1}% of kv in plaintext (target >= {:.0}%); \
         AES-128-GCM {aes:.2} GB/s on one core, so at most {:.0}% with both ends on these cores",
        100.0 * report.tls_ratio,
        100.0 * TLS_TARGET_RATIO,
        100.0 * tls_bound
    );
    let out = dolphin_bench::results::write_json("kv_transfer", args.out.as_deref(), &report)?;
    println!("wrote {}", out.display());
    Ok(())
}

/// Distinct pseudo-random blocks (cycled through by every transfer).
fn make_blocks(n: usize, len: usize) -> Vec<KvBlock> {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    (0..n)
        .map(|_| {
            let mut v = Vec::with_capacity(len);
            while v.len() < len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                v.extend_from_slice(&x.to_le_bytes()[..8.min(len - v.len())]);
            }
            KvBlock::from(v)
        })
        .collect()
}

struct KvPath {
    rx: KvReceiver,
    tx: KvSender,
    target: String,
    next_id: u64,
}

impl KvPath {
    /// With `tls` (the receiver's and the sender's), the path runs over mutual TLS.
    async fn new(
        cfg: TransferConfig,
        tls: Option<(&dolphin_tls::Tls, &dolphin_tls::Tls)>,
    ) -> anyhow::Result<Self> {
        let addr = "127.0.0.1:0".parse()?;
        let rx = KvReceiver::bind_with_tls(addr, cfg.clone(), tls.map(|t| t.0)).await?;
        let target = rx.local_addr().to_string();
        Ok(Self {
            rx,
            tx: KvSender::with_tls(cfg, tls.map(|t| t.1))?,
            target,
            next_id: 0,
        })
    }

    async fn run(&mut self, blocks: &[KvBlock], transfers: usize) -> anyhow::Result<Duration> {
        let start = Instant::now();
        for _ in 0..transfers {
            let id = self.next_id;
            self.next_id += 1;
            let mut slot = self.rx.expect(id, u32::try_from(blocks.len())?);
            let consumer = tokio::spawn(async move {
                let mut bytes = 0usize;
                while let Some(block) = slot.recv().await {
                    bytes += block?.1.len();
                }
                anyhow::Ok(bytes)
            });
            self.tx.send(&self.target, id, blocks).await?;
            let got = consumer.await??;
            ensure!(
                got == blocks.iter().map(|b| b.len()).sum::<usize>(),
                "short transfer"
            );
        }
        Ok(start.elapsed())
    }
}

/// The protocol version and cipher suite a sender negotiates with the receiver at `target`
/// (one extra handshake, not a transfer).
async fn negotiated(target: &str, tls: &dolphin_tls::Tls) -> anyhow::Result<String> {
    let config = tls.client_config(&[b"dolphin-kv"])?;
    let tcp = TcpStream::connect(target).await?;
    let stream = tls.connect(config, tcp, "127.0.0.1").await?;
    let conn = stream.get_ref().1;
    Ok(format!(
        "{:?} {:?}, mutual TLS, ECDSA P-256 certificates (rcgen)",
        conn.protocol_version().context("no version")?,
        conn.negotiated_cipher_suite().context("no suite")?.suite()
    ))
}

/// Per-repetition results of one path.
#[derive(Debug, Default)]
struct Samples {
    gbps: Vec<f64>,
    cpu: Vec<f64>,
}

impl Samples {
    fn push(&mut self, gbps: f64, cpu_per_gib: f64) {
        self.gbps.push(gbps);
        self.cpu.push(cpu_per_gib);
    }
}

/// Wall and process CPU time of one run.
async fn measure(
    clock: &CpuClock,
    run: impl Future<Output = anyhow::Result<Duration>>,
) -> anyhow::Result<(Duration, Duration)> {
    let cpu0 = clock.cpu_time()?;
    let wall = run.await?;
    Ok((wall, clock.cpu_time()?.saturating_sub(cpu0)))
}

fn per_gib(bytes: u64, cpu: Duration) -> f64 {
    cpu.as_secs_f64() / (bytes as f64 / (1u64 << 30) as f64)
}

fn checksum_gbps(blocks: &[KvBlock]) -> f64 {
    let start = Instant::now();
    let mut acc = 0u32;
    let mut bytes = 0u64;
    for _ in 0..4 {
        for (i, b) in blocks.iter().enumerate() {
            acc ^= block_checksum(7, i as u32, b);
            bytes += b.len() as u64;
        }
    }
    std::hint::black_box(acc);
    gbps(bytes, start.elapsed())
}

/// CRC-32 of each block taken right after the block is copied into a reused buffer (the
/// export's copy out of the KV memory); only the checksum is timed.
fn export_checksum_gbps(blocks: &[KvBlock]) -> f64 {
    let mut out: Vec<u8> = Vec::new();
    let mut spent = Duration::ZERO;
    let mut acc = 0u32;
    let mut bytes = 0u64;
    for _ in 0..4 {
        for b in blocks {
            out.clear();
            out.extend_from_slice(b);
            let start = Instant::now();
            acc ^= block_checksum(7, 0, std::hint::black_box(&out));
            spent += start.elapsed();
            bytes += b.len() as u64;
        }
    }
    std::hint::black_box(acc);
    gbps(bytes, spent)
}

/// AES-128-GCM sealing speed on one core (ring, 16 KiB records as TLS sends them): with both
/// ends on this machine's cores, every byte is sealed once and opened once.
fn aes_gcm_gbps(blocks: &[KvBlock]) -> anyhow::Result<f64> {
    use ring::aead::{AES_128_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
    let key = LessSafeKey::new(
        UnboundKey::new(&AES_128_GCM, &[7u8; 16]).map_err(|_| anyhow::anyhow!("AES key"))?,
    );
    let mut record = vec![0u8; 16 << 10];
    let mut bytes = 0u64;
    let start = Instant::now();
    for (i, b) in blocks.iter().enumerate() {
        for chunk in b.chunks(record.len()) {
            let rec = &mut record[..chunk.len()];
            rec.copy_from_slice(chunk);
            let mut nonce = [0u8; 12];
            nonce[..8].copy_from_slice(&(i as u64).to_le_bytes());
            let tag = key
                .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::empty(), rec)
                .map_err(|_| anyhow::anyhow!("seal"))?;
            let _ = std::hint::black_box(tag);
            bytes += chunk.len() as u64;
        }
    }
    Ok(gbps(bytes, start.elapsed()))
}

fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}
