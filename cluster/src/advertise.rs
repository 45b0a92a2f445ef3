//! Advertise addresses: what a process publishes for a listener so that other hosts can reach
//! it, as opposed to the address it bound.
//!
//! A process in a container binds `0.0.0.0:PORT`; publishing that would tell every peer to
//! connect to itself. So a listener bound to an unspecified address must be given an advertise
//! address (the pod IP, the host's address), and one bound to a concrete address publishes that
//! address unless told otherwise. An advertise value is a host (`10.0.0.7`, `decode-0.svc`,
//! `fd00::7`: the bound port is added) or a host and port (`10.0.0.7:7000`, `[fd00::7]:7000`:
//! for a port mapped in front of the process).

use std::net::{IpAddr, SocketAddr};

/// Why no address can be published for a listener.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AdvertiseError {
    /// Bound to an unspecified address (`0.0.0.0`, `[::]`) with no advertise address.
    #[error(
        "the {what} listener is bound to {bound}, which other hosts cannot connect to; \
         give an advertise address (--advertise-addr / DOLPHIN_ADVERTISE_ADDR, e.g. the pod or \
         host IP) or bind a concrete address"
    )]
    Unspecified {
        /// Which listener ("gRPC", "KV transfer").
        what: &'static str,
        /// The bound address.
        bound: SocketAddr,
    },
    /// The advertise value is not a host or host:port.
    #[error(
        "advertise address {value:?} for the {what} listener is not a host or host:port: {reason}"
    )]
    Malformed {
        /// Which listener.
        what: &'static str,
        /// The value as given.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// An advertise value parsed once: a host, with or without its own port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Advertise {
    host: String,
    port: Option<u16>,
}

impl Advertise {
    /// Parses `host`, `host:port`, `IPv6` or `[IPv6]:port`. `what` names the listener in errors.
    pub fn parse(value: &str, what: &'static str) -> Result<Self, AdvertiseError> {
        let bad = |reason| AdvertiseError::Malformed {
            what,
            value: value.to_string(),
            reason,
        };
        let value = value.trim();
        if value.is_empty() {
            return Err(bad("it is empty"));
        }
        if let Ok(addr) = value.parse::<SocketAddr>() {
            return Self::from_ip(addr.ip(), Some(addr.port()))
                .ok_or(bad("the host is unspecified"));
        }
        if let Ok(ip) = value.parse::<IpAddr>() {
            return Self::from_ip(ip, None).ok_or(bad("the host is unspecified"));
        }
        let (host, port) = match value.rsplit_once(':') {
            Some((host, port)) => (
                host,
                Some(port.parse::<u16>().map_err(|_| bad("bad port"))?),
            ),
            None => (value, None),
        };
        if port == Some(0) {
            return Err(bad("port 0 cannot be connected to"));
        }
        let valid_label = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if host.len() > 253 || !host.split('.').all(valid_label) {
            return Err(bad("the host is not a valid DNS name or IP address"));
        }
        Ok(Self {
            host: host.to_ascii_lowercase(),
            port,
        })
    }

    fn from_ip(ip: IpAddr, port: Option<u16>) -> Option<Self> {
        if ip.is_unspecified() || port == Some(0) {
            return None;
        }
        let host = match ip {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("[{v6}]"),
        };
        Some(Self { host, port })
    }

    /// The host part (IPv6 in brackets).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// `host:port`, the port being this value's own or else `bound_port`.
    pub fn with_port(&self, bound_port: u16) -> String {
        format!("{}:{}", self.host, self.port.unwrap_or(bound_port))
    }

    /// The same host without a port of its own (for a second listener of the same process).
    pub fn host_only(&self) -> Self {
        Self {
            host: self.host.clone(),
            port: None,
        }
    }
}

/// Whether binding `addr` needs an advertise address to be published.
fn needs_advertise(addr: SocketAddr) -> bool {
    addr.ip().is_unspecified()
}

/// The `host:port` to publish for a listener bound to `bound`: from `advertise` when given,
/// else the bound address itself, which must then be a concrete one.
pub fn advertised(
    bound: SocketAddr,
    advertise: Option<&Advertise>,
    what: &'static str,
) -> Result<String, AdvertiseError> {
    match advertise {
        Some(a) => Ok(a.with_port(bound.port())),
        None if needs_advertise(bound) => Err(AdvertiseError::Unspecified { what, bound }),
        None => Ok(bound.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().expect("socket address")
    }

    #[test]
    fn a_concrete_bind_publishes_itself() {
        assert_eq!(
            advertised(sa("127.0.0.1:7000"), None, "gRPC").as_deref(),
            Ok("127.0.0.1:7000")
        );
        assert_eq!(
            advertised(sa("[::1]:7000"), None, "gRPC").as_deref(),
            Ok("[::1]:7000")
        );
    }

    #[test]
    fn an_unspecified_bind_without_advertise_is_refused() {
        for bound in ["0.0.0.0:7000", "[::]:7000"] {
            let err = advertised(sa(bound), None, "KV transfer").expect_err("refused");
            assert!(matches!(
                err,
                AdvertiseError::Unspecified {
                    what: "KV transfer",
                    ..
                }
            ));
            assert!(err.to_string().contains("--advertise-addr"), "{err}");
        }
    }

    #[test]
    fn hosts_take_the_bound_port_and_host_ports_keep_theirs() {
        let bound = sa("0.0.0.0:7000");
        let cases = [
            ("10.1.2.3", "10.1.2.3:7000"),
            ("10.1.2.3:9000", "10.1.2.3:9000"),
            ("fd00::7", "[fd00::7]:7000"),
            ("[fd00::7]:9000", "[fd00::7]:9000"),
            ("Decode-0.dolphin.svc", "decode-0.dolphin.svc:7000"),
            ("decode-0:9000", "decode-0:9000"),
        ];
        for (value, want) in cases {
            let a = Advertise::parse(value, "gRPC").expect(value);
            assert_eq!(
                advertised(bound, Some(&a), "gRPC").as_deref(),
                Ok(want),
                "{value}"
            );
        }
        let a = Advertise::parse("10.1.2.3:9000", "gRPC").expect("parses");
        assert_eq!(a.host_only().with_port(7001), "10.1.2.3:7001");
    }

    #[test]
    fn malformed_values_are_refused() {
        for value in [
            "",
            " ",
            "0.0.0.0",
            "[::]:80",
            "10.0.0.1:0",
            "host:port",
            "a b",
            "-x",
            "x..y",
            "http://x",
            "h:99999",
        ] {
            assert!(
                matches!(
                    Advertise::parse(value, "gRPC"),
                    Err(AdvertiseError::Malformed { .. })
                ),
                "{value:?} should be refused"
            );
        }
    }
}
