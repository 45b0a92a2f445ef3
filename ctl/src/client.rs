//! Connecting to the router's gRPC endpoint.

use std::time::Duration;

use dolphin_proto::v1::router_admin_client::RouterAdminClient;
use tonic::transport::{Channel, Endpoint};

use crate::error::CtlError;

/// Accepts "host:port" as well as "http://host:port" (the READY lines carry no scheme).
pub fn normalize_url(url: &str) -> String {
    if url.contains("://") {
        url.to_owned()
    } else {
        format!("http://{url}")
    }
}

/// Opens a channel to the router at `url`.
pub async fn connect(url: &str) -> Result<Channel, CtlError> {
    let url = normalize_url(url);
    let endpoint = Endpoint::from_shared(url.clone())
        .map_err(|source| CtlError::InvalidUrl {
            url: url.clone(),
            source,
        })?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true);
    endpoint
        .connect()
        .await
        .map_err(|source| CtlError::Connect { url, source })
}

/// A `RouterAdmin` client for the router at `url`.
pub async fn admin(url: &str) -> Result<RouterAdminClient<Channel>, CtlError> {
    Ok(RouterAdminClient::new(connect(url).await?))
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
