//! Several hosts on one machine: network namespaces joined by a bridge, one namespace per
//! "host", each with its own address on a private virtual network (`10.77.0.0/24`) that exists
//! only inside the namespaces this test made. Processes start inside a host with
//! `ip netns exec`; the test's own client calls run on a thread that entered a host's namespace
//! ([`VirtualNet::run_in`]). A host's cable is pulled with [`VirtualNet::link_down`] (its port
//! on the bridge goes down: the host keeps running, nothing reaches it, no RST is ever sent).
//!
//! Needs root (`ip netns add`). [`VirtualNet::available`] says whether namespaces work here;
//! with `DOLPHIN_REQUIRE_NETNS=1` (CI) a test must fail rather than skip when they do not.
//! Every namespace is deleted on drop, also when the test fails.

use std::ffi::OsString;
use std::future::Future;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, bail};
use dolphinctl::process::ProcessSpec;

/// The environment variable that turns a missing namespace facility into a test failure.
pub const REQUIRE_ENV: &str = "DOLPHIN_REQUIRE_NETNS";

/// The virtual network's first three octets; host `i` (0-based) is `.{i + 2}`.
const SUBNET: [u8; 3] = [10, 77, 0];

/// One "host": a network namespace with one interface on the virtual network.
#[derive(Clone, Debug)]
pub struct Host {
    /// The host's short name in the test ("router", "decode-1").
    pub name: String,
    /// The namespace's name (under /run/netns).
    pub netns: String,
    /// Its address on the virtual network.
    pub ip: Ipv4Addr,
    /// Its port on the bridge, in the switch namespace (what `link_down` turns off).
    port: String,
}

/// A virtual network of hosts around one bridge.
#[derive(Debug)]
pub struct VirtualNet {
    switch: String,
    hosts: Vec<Host>,
    /// Whether `/etc/netns/<host>/` directories were written ([`VirtualNet::set_hosts`]).
    etc_written: bool,
}

/// Whether to fail (rather than skip) when namespaces are unavailable.
pub fn required() -> bool {
    std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1")
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .with_context(|| format!("cannot run `ip {}`", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "`ip {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl VirtualNet {
    /// `Ok` when this machine can make network namespaces (root, iproute2); else why not.
    pub fn available() -> anyhow::Result<()> {
        let probe = format!("dolphin-probe-{}", std::process::id());
        ip(&["netns", "add", &probe]).context("network namespaces are unavailable")?;
        ip(&["netns", "del", &probe])
    }

    /// Creates one namespace per name in `hosts` (addresses 10.77.0.2, .3, ... in order) and
    /// the switch namespace with the bridge joining them.
    pub fn create(hosts: &[&str]) -> anyhow::Result<Self> {
        static NETS: AtomicU32 = AtomicU32::new(0);
        let tag = format!(
            "dl{}-{}",
            std::process::id(),
            NETS.fetch_add(1, Ordering::Relaxed)
        );
        let mut net = VirtualNet {
            switch: format!("{tag}-sw"),
            hosts: Vec::new(),
            etc_written: false,
        };
        // From here on, Drop removes whatever was made, also on an error below.
        ip(&["netns", "add", &net.switch])?;
        let sw = net.switch.clone();
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        ip(&["-n", &sw, "link", "set", "lo", "up"])?;
        for (i, name) in hosts.iter().enumerate() {
            let host = Host {
                name: (*name).to_owned(),
                netns: format!("{tag}-{i}"),
                ip: Ipv4Addr::new(SUBNET[0], SUBNET[1], SUBNET[2], (i + 2) as u8),
                port: format!("p{i}"),
            };
            ip(&["netns", "add", &host.netns])?;
            net.hosts.push(host.clone());
            let ns = host.netns.as_str();
            // The veth pair is made inside the switch namespace, its far end moved straight
            // into the host: no interface ever appears in the machine's own namespace.
            ip(&[
                "-n", &sw, "link", "add", &host.port, "type", "veth", "peer", "name", "eth0",
                "netns", ns,
            ])?;
            ip(&["-n", &sw, "link", "set", &host.port, "master", "br0"])?;
            ip(&["-n", &sw, "link", "set", &host.port, "up"])?;
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}/24", host.ip),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    /// The host called `name`.
    pub fn host(&self, name: &str) -> &Host {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("no host {name:?} in the virtual network"))
    }

    /// Every host, in creation order.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// Pulls the host's cable: its bridge port goes down. Processes there keep running; nothing
    /// gets in or out until [`VirtualNet::link_up`].
    pub fn link_down(&self, host: &str) -> anyhow::Result<()> {
        let port = self.host(host).port.clone();
        ip(&["-n", &self.switch, "link", "set", &port, "down"])
    }

    /// Plugs the host's cable back in.
    pub fn link_up(&self, host: &str) -> anyhow::Result<()> {
        let port = self.host(host).port.clone();
        ip(&["-n", &self.switch, "link", "set", &port, "up"])
    }

    /// A process spec that runs `program args` inside `host` (through `ip netns exec`, which
    /// execs the program: the pid, signals and parent-death signal are the program's own).
    pub fn spec<I, S>(&self, host: &str, name: &str, program: &Path, args: I) -> ProcessSpec
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        let ns = self.host(host).netns.clone();
        let mut spec = ProcessSpec::new(name, "ip");
        spec.args = ["netns", "exec", &ns]
            .iter()
            .map(OsString::from)
            .chain(std::iter::once(program.as_os_str().to_owned()))
            .chain(args.into_iter().map(Into::into))
            .collect();
        spec
    }

    /// Runs `f`'s future on a thread inside `host`'s network namespace (its own current-thread
    /// runtime), so every socket it opens belongs to that host; awaits it from the caller's
    /// runtime without blocking it.
    pub async fn run_in<F, Fut, T>(&self, host: &str, f: F) -> anyhow::Result<T>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = anyhow::Result<T>>,
        T: Send + 'static,
    {
        let path = format!("/run/netns/{}", self.host(host).netns);
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name(format!("netns-{host}"))
            .spawn(move || {
                let run = || -> anyhow::Result<T> {
                    let ns = std::fs::File::open(&path)
                        .with_context(|| format!("cannot open {path}"))?;
                    rustix::thread::move_into_link_name_space(
                        std::os::fd::AsFd::as_fd(&ns),
                        Some(rustix::thread::LinkNameSpaceType::Network),
                    )
                    .with_context(|| format!("cannot enter {path}"))?;
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .context("cannot build a runtime")?
                        .block_on(f())
                };
                let _ = tx.send(run());
            })
            .context("cannot spawn a namespace thread")?;
        rx.await.context("the namespace thread panicked")?
    }
}

impl VirtualNet {
    /// Gives every host the same `/etc/hosts`: localhost plus `names` (address, names), as a
    /// cluster's DNS would answer. `ip netns exec` bind-mounts `/etc/netns/<ns>/hosts` over
    /// `/etc/hosts` for the programs it starts; nothing outside the namespaces sees it.
    pub fn set_hosts(&mut self, names: &[(Ipv4Addr, Vec<String>)]) -> anyhow::Result<()> {
        let mut text = String::from("127.0.0.1 localhost\n::1 localhost\n");
        for (ip, names) in names {
            text.push_str(&format!("{ip} {}\n", names.join(" ")));
        }
        self.etc_written = true;
        for host in &self.hosts {
            let dir = Path::new("/etc/netns").join(&host.netns);
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            std::fs::write(dir.join("hosts"), &text)?;
        }
        Ok(())
    }
}

impl Drop for VirtualNet {
    fn drop(&mut self) {
        if self.etc_written {
            for host in &self.hosts {
                let _ = std::fs::remove_dir_all(Path::new("/etc/netns").join(&host.netns));
            }
            // Only when empty: another test's (or the machine's own) files stay.
            let _ = std::fs::remove_dir("/etc/netns");
        }
        // Deleting a namespace removes its interfaces (and so the veth pairs and the bridge).
        for host in &self.hosts {
            let _ = ip(&["netns", "del", &host.netns]);
        }
        let _ = ip(&["netns", "del", &self.switch]);
    }
}

/// Skips (returns `None`) or fails, as [`required`] says, when namespaces are unavailable.
pub fn create_or_skip(hosts: &[&str]) -> anyhow::Result<Option<VirtualNet>> {
    if let Err(why) = VirtualNet::available() {
        if required() {
            return Err(why.context(format!(
                "{REQUIRE_ENV}=1: the multi-host tests must run (as root, with iproute2)"
            )));
        }
        eprintln!("skipping: {why:#} (set {REQUIRE_ENV}=1 to make this a failure)");
        return Ok(None);
    }
    VirtualNet::create(hosts).map(Some)
}

/// A single-member etcd serving on `host`'s address (client port 2379), data in `data_dir`.
/// Returns its spec and client URL; start it, then [`VirtualNet::wait_etcd`].
pub fn etcd_spec(net: &VirtualNet, host: &str, data_dir: &Path) -> (ProcessSpec, String) {
    let ip = net.host(host).ip;
    let client = format!("http://{ip}:2379");
    let peer = format!("http://{ip}:2380");
    let bin = std::env::var_os("DOLPHIN_ETCD_BIN").unwrap_or_else(|| "/usr/bin/etcd".into());
    let spec = net.spec(
        host,
        "etcd",
        Path::new(&bin),
        [
            "--name".to_owned(),
            "n0".to_owned(),
            "--data-dir".to_owned(),
            data_dir.display().to_string(),
            "--listen-client-urls".to_owned(),
            client.clone(),
            "--advertise-client-urls".to_owned(),
            client.clone(),
            "--listen-peer-urls".to_owned(),
            peer.clone(),
            "--initial-advertise-peer-urls".to_owned(),
            peer.clone(),
            "--initial-cluster".to_owned(),
            format!("n0={peer}"),
        ],
    );
    (spec, client)
}

impl VirtualNet {
    /// Waits until the etcd at `endpoint` answers `etcdctl endpoint health` from `host`.
    pub async fn wait_etcd(&self, host: &str, endpoint: &str) -> anyhow::Result<()> {
        let ns = self.host(host).netns.clone();
        let endpoint = endpoint.to_owned();
        crate::wait::until("etcd to be healthy", crate::wait::GENEROUS, || {
            let (ns, endpoint) = (ns.clone(), endpoint.clone());
            async move {
                let out = tokio::task::spawn_blocking(move || {
                    Command::new("ip")
                        .args(["netns", "exec", &ns, "etcdctl", "--endpoints", &endpoint])
                        .args(["--dial-timeout", "1s", "endpoint", "health"])
                        .env("ETCDCTL_API", "3")
                        .output()
                })
                .await;
                match out {
                    Ok(Ok(o)) if o.status.success() => Ok(()),
                    Ok(Ok(o)) => Err(String::from_utf8_lossy(&o.stderr).trim().to_owned()),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(e) => Err(e.to_string()),
                }
            }
        })
        .await
    }
}
