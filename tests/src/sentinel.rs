//! A real Sentinel set-up: a primary, its replica and 3 sentinels on loopback.

use std::time::Duration;

use deadpool_redis::redis;

use crate::{Pki, RedisServer, free_port, server::settle};

/// How long the set-up may take to settle, or to fail over.
const SETTLE_WITHIN: Duration = Duration::from_secs(30);

/// A primary, one replica and 3 sentinels (quorum 2) watching them as `mymaster`; every process
/// is killed and reaped on drop.
#[derive(Debug)]
pub struct RedisSentinel {
    primary: RedisServer,
    replica: RedisServer,
    sentinels: Vec<RedisServer>,
}

impl RedisSentinel {
    /// The name the sentinels know the primary by.
    pub const MASTER: &'static str = "mymaster";

    /// Starts everything and waits until the sentinels know the replica and each other.
    pub fn start() -> Self {
        let primary = RedisServer::start();
        let port = primary.port().to_string();
        let replica =
            RedisServer::start_on_port_with(free_port(), &["--replicaof", "127.0.0.1", &port]);
        Self::watched(primary, replica, &port, "")
    }

    /// As [`start`](Self::start), the primary and replica serving TLS with `pki`'s certificates
    /// (asking clients for one of its authority's) and replicating over it, the sentinels
    /// watching the primary's TLS port over TLS: a client reaches the primary they name only
    /// with the authority's certificates. The sentinels themselves answer in plain text.
    pub fn start_tls(pki: &Pki) -> Self {
        let tls = |tls_port: &str| {
            let mut settings = pki.tls_settings(tls_port, true);
            settings.extend(["--tls-replication", "yes"].map(str::to_owned));
            settings
        };
        let primary_tls = free_port().to_string();
        let settings = tls(&primary_tls);
        let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
        let primary = RedisServer::start_with(&settings);
        let replica_tls = free_port().to_string();
        let mut settings = tls(&replica_tls);
        settings.extend(["--replicaof", "127.0.0.1", &primary_tls].map(str::to_owned));
        // Announced over TLS, so that the sentinels reach the replica where it serves TLS.
        settings.extend(["--replica-announce-port", &replica_tls].map(str::to_owned));
        let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
        let replica = RedisServer::start_on_port_with(free_port(), &settings);
        let tls_config = format!(
            "tls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\ntls-replication yes\n",
            pki.file("client.crt"),
            pki.file("client.key"),
            pki.file("ca.crt")
        );
        Self::watched(primary, replica, &primary_tls, &tls_config)
    }

    /// 3 sentinels watching `primary` at `port` (with `config` besides the watch), once they
    /// know `replica` and each other.
    fn watched(primary: RedisServer, replica: RedisServer, port: &str, config: &str) -> Self {
        let config = format!(
            "{config}sentinel monitor {master} 127.0.0.1 {port} 2\n\
             sentinel down-after-milliseconds {master} 1000\n\
             sentinel failover-timeout {master} 5000\n\
             sentinel parallel-syncs {master} 1\n",
            master = Self::MASTER
        );
        let sentinels = (0..3)
            .map(|_| RedisServer::start_sentinel(free_port(), &config))
            .collect();
        let setup = Self {
            primary,
            replica,
            sentinels,
        };
        setup.wait("the sentinels to find the replica and each other", |s| {
            s.is_settled()
        });
        setup
    }

    /// The sentinels' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// The primary.
    pub fn primary(&self) -> &RedisServer {
        &self.primary
    }

    /// The replica.
    pub fn replica(&self) -> &RedisServer {
        &self.replica
    }

    /// Kills the primary, as a crash would.
    pub fn kill_primary(&mut self) {
        self.primary.kill();
    }

    /// Waits until the sentinels name the replica as the primary.
    pub fn wait_for_failover(&self) {
        let replica = self.replica.port();
        self.wait("the sentinels to promote the replica", |s| {
            s.master_port() == Some(replica)
                && redis::cmd("ROLE")
                    .query::<Vec<redis::Value>>(&mut s.replica.connection())
                    .ok()
                    .and_then(|role| role.first().cloned())
                    == Some(redis::Value::BulkString(b"master".to_vec()))
        });
    }

    fn master_port(&self) -> Option<u16> {
        let sentinel = self.sentinels.first()?;
        let (_, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(Self::MASTER)
            .query(&mut sentinel.connection())
            .ok()?;
        Some(port)
    }

    fn is_settled(&self) -> bool {
        let replication: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut self.replica.connection())
            .unwrap_or_default();
        replication.contains("master_link_status:up")
            && self.sentinels.iter().all(|sentinel| {
                let mut connection = sentinel.connection();
                let replicas: Vec<redis::Value> = redis::cmd("SENTINEL")
                    .arg("REPLICAS")
                    .arg(Self::MASTER)
                    .query(&mut connection)
                    .unwrap_or_default();
                let others: Vec<redis::Value> = redis::cmd("SENTINEL")
                    .arg("SENTINELS")
                    .arg(Self::MASTER)
                    .query(&mut connection)
                    .unwrap_or_default();
                replicas.len() == 1 && others.len() == 2
            })
    }

    fn wait(&self, what: &str, done: impl Fn(&Self) -> bool) {
        settle(what, SETTLE_WITHIN, &self.sentinels, || done(self));
    }
}
