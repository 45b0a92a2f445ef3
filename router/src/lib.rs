//! Dolphin's front router: OpenAI-compatible HTTP and gRPC APIs, prefix index, worker selection, prefill policies.
