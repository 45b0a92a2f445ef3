//! KV transfer throughput over loopback: `KvSender` -> `KvReceiver` against a plain TCP copy of
//! the same bytes in the same block sizes, in one run, interleaved repetitions.
//!
//! Default workload: Qwen2.5-72B's KV (320 KiB per token in bf16) scaled down 10x to 32 KiB per
//! token, so a 16-token block is 512 KiB and an 8k-token transfer is 512 blocks = 256 MiB;
//! 4 transfers move 1 GiB per repetition.
//!
//! `cargo run --release -p dolphin-bench --bin kv_transfer [-- --reps 5 --out PATH]`

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use bytes::Bytes;
use clap::Parser;
use dolphin_bench::proc_stat::CpuClock;
use dolphin_bench::stats::median;
use dolphin_kv_transfer::{KvReceiver, KvSender, TransferConfig, frame::block_checksum};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Issue 11's target: the KV transport at least 90% of a plain socket's throughput.
const TARGET_RATIO: f64 = 0.9;

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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Only {
    Kv,
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
    /// Process CPU time (both ends, all threads) per GiB moved: robust to other load on the
    /// machine, unlike GB/s.
    plain_cpu_s_per_gib: Vec<f64>,
    kv_cpu_s_per_gib: Vec<f64>,
    /// Median plain CPU per GiB / median kv CPU per GiB.
    cpu_efficiency_ratio: f64,
    load_average_before: String,
    crc32_checksum_gbps: f64,
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

    let load_average_before = std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    let clock = CpuClock::new(std::process::id());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let Some((plain, kv)) = rt.block_on(async {
        let cfg = TransferConfig {
            io_timeout: Duration::from_secs(60),
            max_block_bytes: u32::try_from(block_bytes)?.max(1 << 20),
            channel_blocks: args.channel_blocks,
            idle_timeout: Duration::from_secs(600),
        };
        let mut kv_path = KvPath::new(cfg).await?;
        let mut plain_path = PlainPath::new(block_bytes).await?;
        if let Some(only) = args.only {
            for rep in 0..args.reps {
                let d = match only {
                    Only::Kv => kv_path.run(&blocks, args.transfers).await?,
                    Only::Plain => plain_path.run(&blocks, args.transfers).await?,
                };
                println!("rep {rep}: {only:?} {:.2} GB/s", gbps(bytes_per_rep, d));
            }
            return anyhow::Ok(None);
        }
        // Warm-up: connections, allocator, buffer pool, the source blocks' pages.
        kv_path.run(&blocks, 1).await?;
        plain_path.run(&blocks, 1).await?;
        let (mut plain, mut kv) = (Samples::default(), Samples::default());
        for rep in 0..args.reps {
            // Interleave the two paths transfer by transfer (alternating which goes first), so
            // both see the same share of whatever else runs on the machine.
            let (mut p, mut k) = (
                (Duration::ZERO, Duration::ZERO),
                (Duration::ZERO, Duration::ZERO),
            );
            for t in 0..args.transfers {
                let add = |acc: &mut (Duration, Duration), s: (Duration, Duration)| {
                    acc.0 += s.0;
                    acc.1 += s.1;
                };
                if (rep + t).is_multiple_of(2) {
                    add(&mut p, measure(&clock, plain_path.run(&blocks, 1)).await?);
                    add(&mut k, measure(&clock, kv_path.run(&blocks, 1)).await?);
                } else {
                    add(&mut k, measure(&clock, kv_path.run(&blocks, 1)).await?);
                    add(&mut p, measure(&clock, plain_path.run(&blocks, 1)).await?);
                }
            }
            let (pg, kg) = (gbps(bytes_per_rep, p.0), gbps(bytes_per_rep, k.0));
            let (pc, kc) = (per_gib(bytes_per_rep, p.1), per_gib(bytes_per_rep, k.1));
            println!(
                "rep {rep}: plain {pg:.2} GB/s ({pc:.3} CPU s/GiB), kv {kg:.2} GB/s \
                 ({kc:.3} CPU s/GiB): {:.0}%",
                100.0 * kg / pg
            );
            plain.push(pg, pc);
            kv.push(kg, kc);
        }
        anyhow::Ok(Some((plain, kv)))
    })?
    else {
        return Ok(());
    };

    let crc = checksum_gbps(&blocks);
    let (pm, km) = (
        median(plain.gbps.iter().copied()),
        median(kv.gbps.iter().copied()),
    );
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
        load_average_before,
        crc32_checksum_gbps: crc,
        cpus: std::thread::available_parallelism().map_or(1, usize::from),
        notes: "loopback, one connection per path, transfers sequential and interleaved between \
                the paths, both ends in this process; plain = write_all / read_exact per block into a reused buffer plus an \
                8-byte ack per transfer; kv = KvSender/KvReceiver (CRC-32 per block, a buffer \
                per block, bounded channel to a consumer task); GB/s = 1e9 payload bytes per \
                second; CPU s/GiB from /proc/self/stat (10 ms ticks)",
    };
    println!(
        "median: plain {pm:.2} GB/s, kv {km:.2} GB/s, ratio {:.1}% (target >= {:.0}%); CPU per GiB: \
         plain {pcpu:.3} s, kv {kcpu:.3} s ({:.1}%); CRC-32 over cold blocks {crc:.1} GB/s",
        100.0 * report.ratio,
        100.0 * TARGET_RATIO,
        100.0 * report.cpu_efficiency_ratio
    );
    let out = args.out.unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("results/kv_transfer.json")
    });
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    std::fs::write(&out, serde_json::to_string_pretty(&report)? + "\n")
        .with_context(|| format!("write {}", out.display()))?;
    println!("wrote {}", out.display());
    Ok(())
}

/// Distinct pseudo-random blocks (cycled through by every transfer).
fn make_blocks(n: usize, len: usize) -> Vec<Bytes> {
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
            Bytes::from(v)
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
    async fn new(cfg: TransferConfig) -> anyhow::Result<Self> {
        let rx = KvReceiver::bind("127.0.0.1:0".parse()?, cfg.clone()).await?;
        let target = rx.local_addr().to_string();
        Ok(Self {
            rx,
            tx: KvSender::new(cfg),
            target,
            next_id: 0,
        })
    }

    async fn run(&mut self, blocks: &[Bytes], transfers: usize) -> anyhow::Result<Duration> {
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
                got == blocks.iter().map(Bytes::len).sum::<usize>(),
                "short transfer"
            );
        }
        Ok(start.elapsed())
    }
}

struct PlainPath {
    writer: TcpStream,
    reader: Option<TcpStream>,
    block_bytes: usize,
}

impl PlainPath {
    async fn new(block_bytes: usize) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let writer = TcpStream::connect(listener.local_addr()?).await?;
        let (reader, _) = listener.accept().await?;
        writer.set_nodelay(true)?;
        reader.set_nodelay(true)?;
        Ok(Self {
            writer,
            reader: Some(reader),
            block_bytes,
        })
    }

    async fn run(&mut self, blocks: &[Bytes], transfers: usize) -> anyhow::Result<Duration> {
        let mut reader = self.reader.take().context("reader in use")?;
        let n = blocks.len();
        let block_bytes = self.block_bytes;
        let start = Instant::now();
        let read = tokio::spawn(async move {
            let mut buf = vec![0u8; block_bytes];
            for _ in 0..transfers {
                for _ in 0..n {
                    reader.read_exact(&mut buf).await?;
                }
                reader.write_all(&[1u8; 8]).await?;
            }
            anyhow::Ok(reader)
        });
        for _ in 0..transfers {
            for block in blocks {
                self.writer.write_all(block).await?;
            }
            let mut ack = [0u8; 8];
            self.writer.read_exact(&mut ack).await?;
        }
        let elapsed = start.elapsed();
        self.reader = Some(read.await??);
        Ok(elapsed)
    }
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

fn checksum_gbps(blocks: &[Bytes]) -> f64 {
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

fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}
