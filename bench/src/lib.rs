//! Dolphin benchmarks: router overhead, KV transfer throughput, routing decision time.
