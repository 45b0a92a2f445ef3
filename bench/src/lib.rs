//! Dolphin benchmarks: router overhead, KV transfer throughput, routing decision time.
//!
//! The binaries in `src/bin/` are the benchmarks; this library holds what they share: latency
//! summaries ([`stats`]), JSON results under `bench/results/` ([`results`]), per-process CPU
//! time from `/proc` ([`proc_stat`]), starting the release binaries and killing them again
//! ([`process`]), the closed-loop load driver ([`load`]), a keep-alive HTTP/1.1 client
//! ([`http_client`]), the router-overhead benchmark's processes and clients
//! ([`overhead_cluster`], [`overhead_clients`]), and the routing benchmark's workload
//! ([`routing_workload`], [`fake_worker`]), a link of a given rate on one machine ([`link`]), the plain socket the KV benchmarks compare with ([`plain_socket`]), the real-model cluster benchmark's processes and
//! timed requests ([`candle_cluster`], [`timed_generate`]), and the simulator experiments of
//! `docs/results.md` ([`experiments`]). Benchmarks report numbers; nothing here asserts on
//! timing.

pub mod candle_cluster;
pub mod candle_measure;
pub mod error;
pub mod experiments;
pub mod fake_worker;
pub mod http_client;
pub mod link;
pub mod load;
/// What a result records about the machine (dolphinctl's, shared with `profile fit`).
pub use dolphinctl::machine;
pub mod overhead_clients;
pub mod overhead_cluster;
pub mod peers;
pub mod plain_socket;
pub mod proc_stat;
pub mod process;
pub mod results;
pub mod routing_workload;
pub mod stats;
pub mod timed_generate;

pub use error::BenchError;
