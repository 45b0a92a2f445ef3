//! Dolphin's model runtime: scheduler with continuous batching and chunked prefill, paged KV pool with prefix cache, simulated and real backends.
