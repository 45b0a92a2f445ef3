//! Generates the dolphin.v1 tonic/prost code and the file descriptor set used by reflection.

use std::{env, path::PathBuf};

const PROTOS: &[&str] = &[
    "proto/dolphin/v1/common.proto",
    "proto/dolphin/v1/inference.proto",
    "proto/dolphin/v1/worker.proto",
    "proto/dolphin/v1/prefill.proto",
    "proto/dolphin/v1/decode.proto",
    "proto/dolphin/v1/admin.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("dolphin_descriptor.bin"))
        // prost with a small per-RPC buffer (src/codec.rs).
        .codec_path("crate::codec::DolphinCodec")
        // Rare, and large beside the rest of the request (a map and a list).
        .boxed("dolphin.v1.SamplingParams.logits")
        .boxed("dolphin.v1.SamplingParams.structured")
        .compile_protos(PROTOS, &["proto"])?;
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    Ok(())
}
