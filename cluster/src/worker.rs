//! Who a worker is: its role, its id, and the record it publishes for the router.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

use dolphin_proto::v1;
use serde::{Deserialize, Serialize};

/// The job a worker does in a disaggregated cluster.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Computes prompts' KV and pushes it to decode workers.
    Prefill,
    /// Holds sequences' KV and generates tokens; may prefill locally.
    Decode,
}

impl Role {
    /// The role's name in keys, ids, flags and JSON: `"prefill"` or `"decode"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A protobuf role with no Dolphin counterpart (`ROLE_UNSPECIFIED` or an unknown number).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown or unspecified worker role {0}")]
pub struct UnknownRole(pub i32);

impl From<Role> for v1::Role {
    fn from(role: Role) -> Self {
        match role {
            Role::Prefill => v1::Role::Prefill,
            Role::Decode => v1::Role::Decode,
        }
    }
}

impl From<Role> for i32 {
    fn from(role: Role) -> Self {
        v1::Role::from(role) as i32
    }
}

impl TryFrom<v1::Role> for Role {
    type Error = UnknownRole;

    fn try_from(role: v1::Role) -> Result<Self, UnknownRole> {
        match role {
            v1::Role::Prefill => Ok(Role::Prefill),
            v1::Role::Decode => Ok(Role::Decode),
            v1::Role::Unspecified => Err(UnknownRole(role as i32)),
        }
    }
}

impl TryFrom<i32> for Role {
    type Error = UnknownRole;

    /// Converts a prost enum field (an `i32` on the wire).
    fn try_from(value: i32) -> Result<Self, UnknownRole> {
        v1::Role::try_from(value)
            .map_err(|_| UnknownRole(value))
            .and_then(Role::try_from)
    }
}

/// A worker's name in the cluster, unique among live workers (etcd refuses a duplicate).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WorkerId(pub String);

impl WorkerId {
    /// A fresh id such as `decode-1f3a9c07`: the role, then 8 random hex digits.
    pub fn generate(role: Role) -> WorkerId {
        WorkerId(format!("{}-{:08x}", role.as_str(), random_u32()))
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for WorkerId {
    fn from(id: &str) -> Self {
        WorkerId(id.to_owned())
    }
}

impl From<String> for WorkerId {
    fn from(id: String) -> Self {
        WorkerId(id)
    }
}

/// Random bits without an RNG dependency: std seeds every `RandomState` from the OS once per
/// process and varies it per instance; the counter and clock separate calls further.
fn random_u32() -> u32 {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let bits = RandomState::new().hash_one((nanos, CALLS.fetch_add(1, Ordering::Relaxed)));
    (bits ^ (bits >> 32)) as u32
}

/// What a worker publishes about itself: the value stored in etcd under
/// [`worker_key`](crate::worker_key), or one entry of a static workers file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerRecord {
    /// Unique name of the worker.
    pub id: WorkerId,
    /// Prefill or decode.
    pub role: Role,
    /// The worker's gRPC endpoint, `host:port` without a scheme.
    pub grpc_addr: String,
    /// Decode workers: the KV transfer listener (`host:port`) prefill workers push blocks to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_addr: Option<String>,
    /// The model the worker serves.
    pub model: String,
    /// Tokens per KV block; the router hashes prompts with the same size.
    pub block_size: u32,
    /// Build version of the worker binary ([`BUILD_VERSION`]); empty from workers that predate
    /// it (they pair only with each other).
    #[serde(default)]
    pub version: String,
    /// How the worker lays out KV blocks on the wire (engine, dtype, geometry): KV moves only
    /// between workers whose layouts are equal. Empty from workers that predate it.
    #[serde(default)]
    pub kv_layout: String,
    /// The longest sequence (prompt plus generated tokens) the worker's model takes; 0 from
    /// workers that predate it (unknown). The router refuses, before routing, a request that
    /// fits no worker's context.
    #[serde(default)]
    pub context_length: u32,
}

/// The build version every Dolphin binary publishes: `DOLPHIN_BUILD_VERSION` at compile time
/// (an image build stamps its git revision there), else the crate version.
pub const BUILD_VERSION: &str = match option_env!("DOLPHIN_BUILD_VERSION") {
    Some(v) => v,
    None => env!("CARGO_PKG_VERSION"),
};

/// Why a prefill worker's KV cannot go to a decode worker.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KvMismatch {
    /// Different builds (a rolling upgrade in progress): the KV format may differ.
    #[error("build version {prefill:?} (prefill) differs from {decode:?} (decode)")]
    Version {
        /// The prefill worker's.
        prefill: String,
        /// The decode worker's.
        decode: String,
    },
    /// Different models.
    #[error("model {prefill:?} (prefill) differs from {decode:?} (decode)")]
    Model {
        /// The prefill worker's.
        prefill: String,
        /// The decode worker's.
        decode: String,
    },
    /// Different block sizes.
    #[error("block size {prefill} (prefill) differs from {decode} (decode)")]
    BlockSize {
        /// The prefill worker's.
        prefill: u32,
        /// The decode worker's.
        decode: u32,
    },
    /// Different KV layouts (dtype, layers, heads).
    #[error("KV layout {prefill:?} (prefill) differs from {decode:?} (decode)")]
    KvLayout {
        /// The prefill worker's.
        prefill: String,
        /// The decode worker's.
        decode: String,
    },
}

impl KvMismatch {
    /// The metric label of the mismatch: `version`, `model`, `block_size` or `kv_layout`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Version { .. } => "version",
            Self::Model { .. } => "model",
            Self::BlockSize { .. } => "block_size",
            Self::KvLayout { .. } => "kv_layout",
        }
    }
}

/// What must match for KV to move from a prefill worker to a decode worker.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct KvCompat {
    /// Build version.
    pub version: String,
    /// Model served.
    pub model: String,
    /// Tokens per block.
    pub block_size: u32,
    /// KV layout.
    pub kv_layout: String,
}

impl KvCompat {
    /// `Ok` when KV prefilled by `self` (a prefill worker) may be shipped to `decode`; else the
    /// first difference, checked in the order version, model, block size, layout.
    pub fn check(&self, decode: &KvCompat) -> Result<(), KvMismatch> {
        let (p, d) = (self, decode);
        if p.version != d.version {
            return Err(KvMismatch::Version {
                prefill: p.version.clone(),
                decode: d.version.clone(),
            });
        }
        if p.model != d.model {
            return Err(KvMismatch::Model {
                prefill: p.model.clone(),
                decode: d.model.clone(),
            });
        }
        if p.block_size != d.block_size {
            return Err(KvMismatch::BlockSize {
                prefill: p.block_size,
                decode: d.block_size,
            });
        }
        if p.kv_layout != d.kv_layout {
            return Err(KvMismatch::KvLayout {
                prefill: p.kv_layout.clone(),
                decode: d.kv_layout.clone(),
            });
        }
        Ok(())
    }
}

impl From<&KvCompat> for v1::KvCompat {
    fn from(c: &KvCompat) -> Self {
        v1::KvCompat {
            version: c.version.clone(),
            model: c.model.clone(),
            block_size: c.block_size,
            kv_layout: c.kv_layout.clone(),
        }
    }
}

impl From<&v1::KvCompat> for KvCompat {
    fn from(c: &v1::KvCompat) -> Self {
        KvCompat {
            version: c.version.clone(),
            model: c.model.clone(),
            block_size: c.block_size,
            kv_layout: c.kv_layout.clone(),
        }
    }
}

impl WorkerRecord {
    /// The fields that decide whether KV may move between this worker and another.
    pub fn kv_compat(&self) -> KvCompat {
        KvCompat {
            version: self.version.clone(),
            model: self.model.clone(),
            block_size: self.block_size,
            kv_layout: self.kv_layout.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_names_and_proto_round_trip() {
        for role in [Role::Prefill, Role::Decode] {
            let proto = v1::Role::from(role);
            assert_eq!(Role::try_from(proto), Ok(role));
            assert_eq!(Role::try_from(i32::from(role)), Ok(role));
            assert_eq!(serde_json::to_string(&role).unwrap(), format!("\"{role}\""));
        }
        assert_eq!(Role::Prefill.as_str(), "prefill");
        assert_eq!(Role::Decode.to_string(), "decode");
        assert_eq!(Role::try_from(v1::Role::Unspecified), Err(UnknownRole(0)));
        assert_eq!(Role::try_from(42), Err(UnknownRole(42)));
    }

    #[test]
    fn role_parses_as_a_flag() {
        use clap::ValueEnum;
        assert_eq!(Role::from_str("decode", false), Ok(Role::Decode));
        assert!(Role::from_str("router", false).is_err());
    }

    #[test]
    fn generated_ids_have_the_documented_shape_and_differ() {
        let a = WorkerId::generate(Role::Decode);
        let b = WorkerId::generate(Role::Decode);
        assert_ne!(a, b);
        let hex = a.as_str().strip_prefix("decode-").expect("role prefix");
        assert_eq!(hex.len(), 8);
        assert!(
            hex.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert!(WorkerId::generate(Role::Prefill).0.starts_with("prefill-"));
    }

    #[test]
    fn record_json_round_trips_and_omits_absent_kv_addr() {
        let record = WorkerRecord {
            id: WorkerId::from("prefill-00000001"),
            role: Role::Prefill,
            grpc_addr: "127.0.0.1:5000".into(),
            kv_addr: None,
            model: "sim-model".into(),
            block_size: 16,
            version: BUILD_VERSION.into(),
            kv_layout: "sim/bytes_per_token=128".into(),
            context_length: 4096,
        };
        let json = serde_json::to_string(&record).unwrap();
        assert!(!json.contains("kv_addr"), "{json}");
        assert!(json.contains(r#""id":"prefill-00000001""#), "{json}");
        assert_eq!(serde_json::from_str::<WorkerRecord>(&json).unwrap(), record);
    }

    #[test]
    fn records_without_version_or_layout_still_parse() {
        let old = r#"{"id":"d","role":"decode","grpc_addr":"h:1","model":"m","block_size":16}"#;
        let rec: WorkerRecord = serde_json::from_str(old).expect("parses");
        assert_eq!((rec.version.as_str(), rec.kv_layout.as_str()), ("", ""));
        assert_eq!(rec.context_length, 0, "unknown");
    }

    #[test]
    fn kv_compat_names_the_first_difference() {
        let base = KvCompat {
            version: "1.0".into(),
            model: "m".into(),
            block_size: 16,
            kv_layout: "candle/f32".into(),
        };
        assert_eq!(base.check(&base.clone()), Ok(()));
        let with = |f: fn(&mut KvCompat)| {
            let mut c = base.clone();
            f(&mut c);
            base.check(&c).expect_err("mismatch").as_str()
        };
        assert_eq!(with(|c| c.version = "1.1".into()), "version");
        assert_eq!(with(|c| c.model = "n".into()), "model");
        assert_eq!(with(|c| c.block_size = 32), "block_size");
        assert_eq!(with(|c| c.kv_layout = "candle/f16".into()), "kv_layout");
        let mut both = base.clone();
        both.version = "2".into();
        both.kv_layout = "x".into();
        assert!(matches!(base.check(&both), Err(KvMismatch::Version { .. })));
        assert!(!BUILD_VERSION.is_empty());
    }
}
