//! Connecting to the router's gRPC endpoint.

use std::sync::OnceLock;
use std::time::Duration;

use dolphin_proto::v1::router_admin_client::RouterAdminClient;
use dolphin_tls::{GrpcConnector, Tls, TlsArgs};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::{Interceptor, interceptor::InterceptedService};
use tonic::transport::{Channel, Endpoint};

use crate::error::CtlError;

/// TLS of this process's connections, set once from the command line.
static TLS: OnceLock<Option<Tls>> = OnceLock::new();
/// The API key and the admin key, set once from the command line.
static KEYS: OnceLock<(Option<String>, Option<String>)> = OnceLock::new();

/// Keys sent with every later call: `api` on the public API ([`connect`]), `admin` on the admin
/// listener ([`admin`]). First call wins.
pub fn init_keys(api: Option<&str>, admin: Option<&str>) {
    let _ = KEYS.set((api.map(str::to_owned), admin.map(str::to_owned)));
}

/// A channel that sends `authorization: Bearer KEY` with every call (nothing without a key).
pub type AuthChannel = InterceptedService<Channel, Bearer>;

/// Adds the bearer key to each call's metadata.
#[derive(Clone, Debug, Default)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl Bearer {
    fn new(key: Option<&str>) -> Result<Self, CtlError> {
        key.map(|k| {
            format!("Bearer {}", k.trim())
                .parse()
                .map_err(|_| CtlError::Tls("the key is not a valid header value".into()))
        })
        .transpose()
        .map(Self)
    }
}

impl Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            req.metadata_mut().insert("authorization", value.clone());
        }
        Ok(req)
    }
}

/// Reads the TLS files named by `args` for every later [`connect`] (first call wins).
pub fn init_tls(args: &TlsArgs) -> Result<(), CtlError> {
    let tls = args.load().map_err(|e| CtlError::Tls(e.to_string()))?;
    let _ = TLS.set(tls);
    Ok(())
}

fn tls() -> Option<&'static Tls> {
    TLS.get().and_then(Option::as_ref)
}

/// Accepts "host:port" as well as "http://host:port" (the READY lines carry no scheme).
pub fn normalize_url(url: &str) -> String {
    if url.contains("://") {
        url.to_owned()
    } else {
        format!("http://{url}")
    }
}

/// Opens a channel to the router's public API at `url`, with the API key if one was given.
pub async fn connect(url: &str) -> Result<AuthChannel, CtlError> {
    let key = KEYS.get().and_then(|k| k.0.as_deref());
    Ok(InterceptedService::new(
        channel(url).await?,
        Bearer::new(key)?,
    ))
}

/// Opens a channel to the router (or a worker) at `url`: TLS when `--tls-ca` was given
/// ([`init_tls`]); an `https://` URL without it is an error, not a plaintext attempt.
pub async fn channel(url: &str) -> Result<Channel, CtlError> {
    let tls = tls();
    // The connector does TLS itself; tonic wants `http://` for a custom connector.
    let (url, https) = match url.strip_prefix("https://") {
        Some(rest) => (format!("http://{rest}"), true),
        None => (normalize_url(url), false),
    };
    if https && tls.is_none() {
        return Err(CtlError::Tls(format!(
            "{url} is https://: give --tls-ca (the CA the router's certificate chains to)"
        )));
    }
    let connector = GrpcConnector::new(tls, Duration::from_secs(5))
        .map_err(|e| CtlError::Tls(e.to_string()))?;
    let endpoint = Endpoint::from_shared(url.clone()).map_err(|source| CtlError::InvalidUrl {
        url: url.clone(),
        source,
    })?;
    endpoint
        .connect_with_connector(connector)
        .await
        .map_err(|source| CtlError::Connect { url, source })
}

/// A `RouterAdmin` client for the router's admin listener at `url`, with the admin key if one
/// was given.
pub async fn admin(url: &str) -> Result<RouterAdminClient<AuthChannel>, CtlError> {
    let key = KEYS.get().and_then(|k| k.1.as_deref());
    let channel = InterceptedService::new(channel(url).await?, Bearer::new(key)?);
    Ok(RouterAdminClient::new(channel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_a_scheme_only_when_missing() {
        assert_eq!(normalize_url("127.0.0.1:1"), "http://127.0.0.1:1");
        assert_eq!(normalize_url("http://h:2"), "http://h:2");
        assert_eq!(normalize_url("https://h:3"), "https://h:3");
    }

    #[tokio::test]
    async fn refused_connection_names_the_url() {
        // Bind then drop a listener to get a port nobody listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let err = connect(&format!("127.0.0.1:{port}")).await.unwrap_err();
        assert!(err.to_string().contains(&port.to_string()), "{err}");
    }
}
