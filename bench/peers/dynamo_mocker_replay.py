#!/usr/bin/env python3
"""Replays request sets on NVIDIA Dynamo's mocker (its simulated vLLM engine), offline.

Driven by `mocker_crosscheck` (bench/src/bin/mocker_crosscheck.rs), which runs the same requests
on Dolphin's simulator. Uses Dynamo's own virtual-clock replay (`dynamo.replay.run_trace_replay`,
the engine and scheduler of `python -m dynamo.mocker`), so no runtime, etcd or NATS is needed.

Input (stdin): {"cases": [{"name", "prefill", "decode", "engine": {...}, "requests": [...]}]}
- prefill = 0: one aggregated worker per decode slot (`decode` workers), every prompt local.
- prefill > 0: disaggregated, every prompt prefilled on a prefill worker and its KV shipped.
- engine: the mocker's engine settings (block_size, num_gpu_blocks, max_num_batched_tokens,
  kv_transfer_bytes_per_token, kv_transfer_bandwidth, ...), shared by every worker.
- requests: {"arrival_ms", "input_length", "output_length", "hash_ids"}, hash ids one per
  `engine.block_size` tokens (the trace's block size is the engine's).

Output (stdout): {"dynamo_version", "cases": [{"name", "requests": [{"arrival_ms",
"input_length", "ttft_ms", "tpot_ms", "e2e_ms", "output_length"}], "wall_ms"}]}, one record per
request, ordered by arrival then input length (the replay reports them in completion order).
Exit status 2 when Dynamo cannot be imported (the caller reports the peer as missing).
"""

import json
import os
import sys
import tempfile
import time


def main() -> int:
    try:
        from dynamo.replay.api import run_trace_replay
        from dynamo.mocker import __version__ as dynamo_version
    except Exception as e:  # noqa: BLE001 - any import failure means the peer is missing
        print(f"dynamo mocker not importable: {e}", file=sys.stderr)
        return 2

    spec = json.load(sys.stdin)
    out = {"dynamo_version": dynamo_version, "cases": []}
    for case in spec["cases"]:
        out["cases"].append(run_case(run_trace_replay, case))
    json.dump(out, sys.stdout)
    return 0


def run_case(run_trace_replay, case: dict) -> dict:
    engine = dict(case["engine"])
    block_size = engine["block_size"]
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for r in case["requests"]:
            row = {
                "timestamp": r["arrival_ms"],
                "input_length": r["input_length"],
                "output_length": r["output_length"],
                "hash_ids": r["hash_ids"],
            }
            f.write(json.dumps(row) + "\n")
        trace = f.name
    try:
        common = dict(
            capture_per_request=True,
            trace_block_size=block_size,
            router_mode="kv_router",
        )
        started = time.monotonic()
        if case["prefill"] == 0:
            report = run_trace_replay(
                [trace],
                extra_engine_args={"engine": engine},
                num_workers=case["decode"],
                **common,
            )
        else:
            report = run_trace_replay(
                [trace],
                prefill_engine_args={"engine": {**engine, "worker_type": "prefill"}},
                decode_engine_args={"engine": {**engine, "worker_type": "decode"}},
                num_prefill_workers=case["prefill"],
                num_decode_workers=case["decode"],
                **common,
            )
        wall_ms = (time.monotonic() - started) * 1e3
    finally:
        os.unlink(trace)

    records = []
    for p in report.per_request:
        if p.get("terminal_status") != "completed":
            raise RuntimeError(f"{case['name']}: a request did not complete: {p}")
        records.append(
            {
                "arrival_ms": p["arrival_time_ms"],
                "input_length": p["input_length"],
                "output_length": p["output_length"],
                "ttft_ms": p["ttft_ms"],
                "tpot_ms": p["itl_ms"] or 0.0,
                "e2e_ms": p["e2e_latency_ms"],
            }
        )
    if len(records) != len(case["requests"]):
        raise RuntimeError(
            f"{case['name']}: {len(records)} records for {len(case['requests'])} requests"
        )
    records.sort(key=lambda r: (r["arrival_ms"], r["input_length"]))
    return {"name": case["name"], "requests": records, "wall_ms": wall_ms}


if __name__ == "__main__":
    sys.exit(main())
