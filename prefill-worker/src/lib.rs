//! Dolphin prefill worker: computes prompt KV and pushes it to decode workers.
