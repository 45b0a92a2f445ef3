//! Reading certificates, keys and CA bundles from PEM files.

use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

use crate::TlsError;

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

fn certs(
    what: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .collect();
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// The certificate chain and key of `cert` / `key`, checked to belong together.
pub(crate) fn certified_key(
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = certs("certificate", cert, &read("certificate", cert)?)?;
    let key_pem = read("key", key)?;
    let der = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| TlsError::Empty {
        what: "private key",
        path: key.to_path_buf(),
    })?;
    let certified =
        CertifiedKey::from_der(chain, der, provider).map_err(|source| TlsError::Rustls {
            what: "the certificate and key",
            path: key.to_path_buf(),
            source,
        })?;
    Ok(Arc::new(certified))
}

/// The CA certificates of `path`.
pub(crate) fn roots(path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut store = RootCertStore::empty();
    for cert in certs("CA certificate", path, &read("CA bundle", path)?)? {
        store.add(cert).map_err(|source| TlsError::Rustls {
            what: "a CA certificate",
            path: path.to_path_buf(),
            source,
        })?;
    }
    Ok(Arc::new(store))
}

/// A fingerprint of the files' contents (to notice a change; not a security measure).
pub(crate) fn fingerprint(paths: &[&Path]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for p in paths {
        std::fs::read(p).ok().hash(&mut h);
    }
    h.finish()
}
