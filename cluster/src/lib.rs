//! Shared vocabulary of a Dolphin cluster: worker ids and roles, chained block hashing, etcd and static discovery, telemetry.
