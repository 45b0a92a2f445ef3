//! Certificates for tests (feature `test-util`): a CA made with rcgen, member certificates
//! signed by it, and the flags that point a process at them.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, Certificate, CertificateParams, IsCa, KeyPair, KeyUsagePurpose};

use crate::TlsArgs;

/// The name every test member's certificate carries (`--tls-server-name`).
pub const TEST_SERVER_NAME: &str = "dolphin.test";

/// A certificate authority.
pub struct Ca {
    cert: Certificate,
    key: KeyPair,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

impl Ca {
    /// A new self-signed CA called `name`.
    pub fn new(name: &str) -> Ca {
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("key");
        let cert = p.self_signed(&key).expect("self-signed");
        Ca { cert, key }
    }

    /// A leaf certificate and key (PEM) for `names`; `expired` puts its validity in the past.
    pub fn leaf(&self, names: &[&str], expired: bool) -> (String, String) {
        let mut p = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .expect("params");
        if expired {
            p.not_before = rcgen::date_time_ymd(2020, 1, 1);
            p.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let key = KeyPair::generate().expect("key");
        let cert = p.signed_by(&key, &self.cert, &self.key).expect("signed");
        (cert.pem(), key.serialize_pem())
    }

    /// The CA's certificate (PEM).
    pub fn pem(&self) -> String {
        self.cert.pem()
    }
}

/// Writes a certificate/key pair and a CA bundle into `dir` as `tag.crt`, `tag.key` and
/// `tag-ca.crt`; returns their paths.
pub fn write_files(
    dir: &Path,
    tag: &str,
    leaf: &(String, String),
    ca: &str,
) -> (PathBuf, PathBuf, PathBuf) {
    let (c, k, a) = (
        dir.join(format!("{tag}.crt")),
        dir.join(format!("{tag}.key")),
        dir.join(format!("{tag}-ca.crt")),
    );
    std::fs::write(&c, &leaf.0).expect("write");
    std::fs::write(&k, &leaf.1).expect("write");
    std::fs::write(&a, ca).expect("write");
    (c, k, a)
}

/// A cluster's certificates in a temporary directory: one CA, members signed by it, and
/// strangers who are not.
#[derive(Debug)]
pub struct TestPki {
    dir: tempfile::TempDir,
    ca: Ca,
}

impl Default for TestPki {
    fn default() -> Self {
        Self::new()
    }
}

impl TestPki {
    /// A fresh CA in a fresh directory.
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temp dir"),
            ca: Ca::new("dolphin test CA"),
        }
    }

    /// The directory the files are in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn args(&self, tag: &str, leaf: &(String, String), ca: &str, identity: bool) -> TlsArgs {
        let (cert, key, ca) = write_files(self.dir(), tag, leaf, ca);
        TlsArgs {
            tls_cert: identity.then_some(cert),
            tls_key: identity.then_some(key),
            tls_ca: Some(ca),
            tls_server_name: Some(TEST_SERVER_NAME.into()),
            ..TlsArgs::default()
        }
    }

    fn names() -> [&'static str; 3] {
        [TEST_SERVER_NAME, "localhost", "127.0.0.1"]
    }

    /// A member of the cluster: a certificate from the CA (for the test name, `localhost` and
    /// 127.0.0.1), trusting the CA.
    pub fn member(&self, tag: &str) -> TlsArgs {
        self.args(
            tag,
            &self.ca.leaf(&Self::names(), false),
            &self.ca.pem(),
            true,
        )
    }

    /// A client with no certificate of its own, trusting the CA.
    pub fn anonymous(&self, tag: &str) -> TlsArgs {
        self.args(
            tag,
            &self.ca.leaf(&Self::names(), false),
            &self.ca.pem(),
            false,
        )
    }

    /// A member whose certificate from the CA has expired.
    pub fn expired(&self, tag: &str) -> TlsArgs {
        self.args(
            tag,
            &self.ca.leaf(&Self::names(), true),
            &self.ca.pem(),
            true,
        )
    }

    /// A process with a certificate from another CA, trusting the cluster's CA.
    pub fn stranger(&self, tag: &str) -> TlsArgs {
        let other = Ca::new("another CA");
        self.args(
            tag,
            &other.leaf(&Self::names(), false),
            &self.ca.pem(),
            true,
        )
    }
}
