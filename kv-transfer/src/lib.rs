//! Moving KV cache blocks between Dolphin workers over TCP.
