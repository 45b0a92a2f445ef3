//! End-to-end tests of Dolphin: real etcd, real binaries.
