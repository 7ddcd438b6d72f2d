//! A real Redis Cluster: 3 primaries and 3 replicas on loopback.

use std::{net::TcpListener, process::Command, time::Duration};

use deadpool_redis::redis;

use crate::{Pki, RedisServer, free_port, server::settle};

/// How far below a TLS node's port its TLS port is: below the ephemeral range that free ports
/// come from, so no other test's server takes it meanwhile.
const TLS_BELOW: u16 = 10_000;

/// How long the cluster may take to form, or to promote a replica.
const SETTLE_WITHIN: Duration = Duration::from_secs(30);

/// A cluster of 6 `redis-server` processes (3 primaries, 3 replicas) made by
/// `redis-cli --cluster create`; every node is killed and reaped on drop.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
struct Node {
    port: u16,
    primary: bool,
    failed: bool,
    slots: Vec<(u16, u16)>,
}

impl RedisCluster {
    /// Starts the nodes, creates the cluster and waits until every slot is served and every
    /// replica is in sync.
    pub fn start() -> Self {
        Self::start_with(false, |_| Vec::new())
    }

    /// As [`start`](Self::start), each node with `settings` besides the cluster's (for
    /// example `["--cluster-require-full-coverage", "no"]`).
    pub fn start_configured(settings: &[&str]) -> Self {
        let settings: Vec<String> = settings.iter().map(|s| (*s).to_owned()).collect();
        Self::start_with(false, |_| settings.clone())
    }

    /// As [`start`](Self::start), every node also serving TLS with `pki`'s certificates (the
    /// cluster bus and replication too), and the `rediss://` seed URLs.
    pub fn start_tls(pki: &Pki) -> (Self, Vec<String>) {
        let mut tls_ports = Vec::new();
        let cluster = Self::start_with(true, |port| {
            let tls_port = (port - TLS_BELOW).to_string();
            let mut extra = pki.tls_settings(&tls_port, false);
            // The bus stays on port + 10,000, where bus_ports found it free (over TLS it
            // would default to the TLS port's + 10,000).
            let bus = (port + 10_000).to_string();
            extra.extend(
                [
                    "--tls-cluster",
                    "yes",
                    "--tls-replication",
                    "yes",
                    "--cluster-port",
                    &bus,
                ]
                .map(str::to_owned),
            );
            tls_ports.push(tls_port);
            extra
        });
        let urls = tls_ports
            .iter()
            .map(|port| format!("rediss://127.0.0.1:{port}"))
            .collect();
        (cluster, urls)
    }

    /// Starts the cluster, each node with `extra(port)` settings besides the cluster's; with
    /// `tls`, on ports whose TLS port (`TLS_BELOW` lower) is free too.
    fn start_with(tls: bool, mut extra: impl FnMut(u16) -> Vec<String>) -> Self {
        let settings = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            // Fail over within seconds, and let a replica take over whatever its lag.
            "--cluster-node-timeout",
            "1000",
            "--cluster-replica-validity-factor",
            "0",
        ];
        let nodes: Vec<RedisServer> = bus_ports(6, tls)
            .into_iter()
            .map(|port| {
                let own = extra(port);
                let all: Vec<&str> = settings
                    .iter()
                    .copied()
                    .chain(own.iter().map(String::as_str))
                    .collect();
                RedisServer::start_on_port_with(port, &all)
            })
            .collect();
        let cluster = Self { nodes };
        let addresses: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let output = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .unwrap_or_else(|err| panic!("running redis-cli (Debian package redis-tools): {err}"));
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        cluster.wait("the cluster to form", |c| c.is_healthy());
        cluster
    }

    /// A seed URL per node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The ports of the primaries serving slots now.
    pub fn primaries(&self) -> Vec<u16> {
        self.topology()
            .into_iter()
            .filter(|n| n.primary && !n.failed && !n.slots.is_empty())
            .map(|n| n.port)
            .collect()
    }

    /// The port of the primary serving `key` now.
    pub fn primary_of(&self, key: &str) -> Option<u16> {
        let mut connection = self.live_node()?.connection();
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut connection)
            .ok()?;
        self.topology()
            .into_iter()
            .find(|n| {
                n.primary && !n.failed && n.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
            })
            .map(|n| n.port)
    }

    /// A plain connection to the node on `port`.
    pub fn connection(&self, port: u16) -> redis::Connection {
        self.node(port).connection()
    }

    /// Kills the node on `port`, as a crash would.
    pub fn kill(&mut self, port: u16) {
        self.nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
            .kill();
    }

    /// Waits until `key` is served by a primary other than `old`, and returns it.
    pub fn wait_for_new_primary(&self, key: &str, old: u16) -> u16 {
        self.wait("a replica to be promoted", |c| {
            c.primary_of(key).is_some_and(|p| p != old)
        });
        self.primary_of(key).unwrap_or(old)
    }

    fn node(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }

    fn live_node(&self) -> Option<&RedisServer> {
        self.nodes.iter().find(|n| {
            redis::Client::open(n.url())
                .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
                .is_ok()
        })
    }

    fn topology(&self) -> Vec<Node> {
        let Some(node) = self.live_node() else {
            return Vec::new();
        };
        let text: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query(&mut node.connection())
            .unwrap_or_default();
        text.lines().filter_map(parse_node).collect()
    }

    fn is_healthy(&self) -> bool {
        self.nodes.iter().all(|node| {
            let mut connection = node.connection();
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut connection)
                .unwrap_or_default();
            let replication: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut connection)
                .unwrap_or_default();
            info.contains("cluster_state:ok")
                && info.contains("cluster_slots_ok:16384")
                && info.contains("cluster_known_nodes:6")
                && (replication.contains("role:master")
                    || replication.contains("master_link_status:up"))
        }) && self.primaries().len() == 3
    }

    fn wait(&self, what: &str, done: impl Fn(&Self) -> bool) {
        settle(what, SETTLE_WITHIN, &self.nodes, || done(self));
    }
}

fn parse_node(line: &str) -> Option<Node> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let port = fields
        .get(1)?
        .split('@')
        .next()?
        .rsplit(':')
        .next()?
        .parse()
        .ok()?;
    let flags = fields.get(2)?;
    let slots = fields
        .iter()
        .skip(8)
        .filter(|s| !s.starts_with('['))
        .filter_map(|s| match s.split_once('-') {
            Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
            None => s.parse().ok().map(|x| (x, x)),
        })
        .collect();
    Some(Node {
        port,
        primary: flags.contains("master"),
        failed: flags.contains("fail"),
        slots,
    })
}

/// `count` ports whose cluster bus ports (port + 10000) are free too.
fn bus_ports(count: usize, tls: bool) -> Vec<u16> {
    let free =
        |port: Option<u16>| port.is_some_and(|p| TcpListener::bind(("127.0.0.1", p)).is_ok());
    let mut ports = Vec::new();
    while ports.len() < count {
        let port = free_port();
        let bus_free = free(port.checked_add(10_000));
        let tls_free = !tls || free(port.checked_sub(TLS_BELOW));
        if bus_free && tls_free && !ports.contains(&port) {
            ports.push(port);
        }
    }
    ports
}
