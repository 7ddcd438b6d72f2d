//! The Redis backend: one `EVALSHA` per check, or per batch of concurrent checks, over a pooled
//! multiplexed connection, on a standalone server, a Cluster, or a Sentinel-managed primary.

use std::{
    fmt,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use deadpool_redis::{
    Runtime,
    redis::{
        Cmd, ConnectionInfo, ErrorKind as RedisErrorKind, FromRedisValue, IntoConnectionInfo,
        RedisError, ServerErrorKind, aio::ConnectionLike,
    },
};

mod batch;
mod bounded;
#[cfg(feature = "cluster")]
mod cluster_pool;
mod connect;
mod connection;
mod events;
pub(crate) mod protocol;
mod refusal;
mod scripts;
#[cfg(feature = "sentinel")]
mod sentinel_pool;
mod standalone_pool;
#[cfg(feature = "tls")]
mod tls;
mod url;

use self::{
    batch::{Batcher, Member},
    connection::{Conn, Held, Pools},
    events::{Events, Subscriber},
    protocol::{Call, Request},
    scripts::{Script, Scripts},
    url::check_url,
};
pub(crate) use self::{
    events::{DEAF_BLOCK_US, Heard},
    scripts::CHECK,
};
use super::{Query, Started, decision, stamp};
use crate::{
    Algorithm, ConfigError, Decisions, Error, ErrorKind, KeyScheme, Reason, Timestamp,
    backend::answer::Inspected, check_request::Options, redacted_url,
};

/// The Redis backend, through a deadpool-redis pool: a standalone server
/// ([`builder`](Self::builder)), a Redis Cluster ([`cluster`](Self::cluster), feature `cluster`)
/// or a Sentinel-managed primary ([`sentinel`](Self::sentinel), feature `sentinel`).
///
/// Every check is one `EVALSHA`: of a small script per algorithm for one policy, of one script
/// with every algorithm for several, so a check of several policies is still one round trip; a
/// node that lacks the script (`NOSCRIPT`) gets it by `EVAL` in the same retry. Checks that
/// arrive while two calls are in flight wait and go together as one call when one returns,
/// each decided as it would be alone at that call's time (see [the algorithms
/// guide](crate::guide::algorithms)); a lone check goes at once. A redis-rs
/// multiplexed connection carries any number of concurrent checks, so the backend keeps one
/// checked out and shares it instead of paying the pool's health-check `PING` on every checkout;
/// it goes back to the pool for a fresh one only when a command fails or times out. Nothing
/// connects until the first check, so an application starts even while Redis is down.
///
/// ```no_run
/// use std::time::Duration;
/// use redlimit::{Limiter, RedisBackend};
///
/// let redis = RedisBackend::builder("redis://127.0.0.1:6379")
///     .budget(Duration::from_millis(50))
///     .build()?;
/// let limiter = Limiter::new(redis);
/// # Ok::<(), redlimit::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    pools: Pools,
    scripts: Scripts,
    budget: Duration,
    /// Whether corrupt state is deleted and the check run again, and how often it was.
    repair: bool,
    repairs: AtomicU64,
    shared: Mutex<Shared>,
    /// Lets one check at a time fetch a connection, so a burst of first checks does not check
    /// out (and then recycle, with a `PING` each) a connection apiece.
    connecting: tokio::sync::Mutex<()>,
    batcher: Batcher,
    /// Operator events heard, and where to listen for them.
    events: Events,
    subscriber: Subscriber,
}

/// The connection in use, and a generation so a late failure cannot discard its replacement.
#[derive(Default)]
struct Shared {
    held: Option<Held>,
    generation: u64,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("pool", &self.inner.pools.status())
            .field("budget", &self.inner.budget)
            .finish_non_exhaustive()
    }
}

/// Where the backend's Redis is. Its `Debug` shows URLs without their credentials.
#[derive(Clone)]
enum Topology {
    Standalone(String),
    /// A pool the application built: its own credentials, TLS and settings.
    Pool(deadpool_redis::Pool),
    #[cfg(feature = "cluster")]
    Cluster(Vec<String>),
    #[cfg(feature = "sentinel")]
    Sentinel {
        urls: Vec<String>,
        master: String,
    },
}

impl fmt::Debug for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Standalone(url) => f
                .debug_tuple("Standalone")
                .field(&redacted_url(url))
                .finish(),
            Self::Pool(pool) => f.debug_tuple("Pool").field(&pool.status()).finish(),
            #[cfg(feature = "cluster")]
            Self::Cluster(seeds) => f.debug_tuple("Cluster").field(&urls(seeds)).finish(),
            #[cfg(feature = "sentinel")]
            Self::Sentinel {
                urls: sentinels,
                master,
            } => f
                .debug_struct("Sentinel")
                .field("urls", &urls(sentinels))
                .field("master", master)
                .finish(),
        }
    }
}

#[cfg(any(feature = "cluster", feature = "sentinel"))]
fn urls(urls: &[String]) -> Vec<String> {
    urls.iter().map(|url| redacted_url(url)).collect()
}

impl RedisBackend {
    /// A standalone Redis at `url` (`redis://[user:pass@]host:port[/db]`, or `rediss://…` over
    /// TLS with the feature `tls`). User name and password are the ACL's; `Debug` never shows
    /// them.
    pub fn builder(url: impl Into<String>) -> RedisBackendBuilder {
        RedisBackendBuilder::new(Topology::Standalone(url.into()))
    }

    /// A standalone Redis through a deadpool-redis pool the application built, for settings
    /// the URL cannot carry: a credentials provider, its own TLS configuration, a connection
    /// hook. The builder's budget still bounds every check; its pool size does not apply.
    ///
    /// ```
    /// use redlimit::{RedisBackend, deadpool_redis};
    ///
    /// let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:6379")
    ///     .create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
    /// let redis = RedisBackend::from_pool(pool).build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_pool(pool: deadpool_redis::Pool) -> RedisBackendBuilder {
        RedisBackendBuilder::new(Topology::Pool(pool))
    }

    /// A Redis Cluster reached through any of `urls` (seed nodes; the rest is discovered).
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn cluster<I, S>(urls: I) -> RedisBackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisBackendBuilder::new(Topology::Cluster(
            urls.into_iter().map(Into::into).collect(),
        ))
    }

    /// The primary named `master` that the sentinels at `urls` (`redis://host:26379`) point to;
    /// after a failover, new connections go to the new primary.
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn sentinel<I, S>(urls: I, master: impl Into<String>) -> RedisBackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisBackendBuilder::new(Topology::Sentinel {
            urls: urls.into_iter().map(Into::into).collect(),
            master: master.into(),
        })
    }

    /// The time budget of one check; see [`RedisBackendBuilder::budget`].
    pub fn budget(&self) -> Duration {
        self.inner.budget
    }

    /// Whether this is a Redis Cluster, whose keys live on several primaries.
    pub fn is_cluster(&self) -> bool {
        self.inner.pools.is_cluster()
    }

    /// Begins `query`: sent when the returned future is first polled.
    pub(crate) fn start(&self, query: Query<'_>) -> Started {
        let (keys, client, options) = (query.keys, query.client, query.options);
        // Encoded here, so the future owns only what the reply needs.
        let request = Request {
            cost: options.cost,
            once: options.once,
            reserve: options.reserve,
            ..Request::new(query.set, client)
        };
        let now_us = options.at.map(Timestamp::as_micros);
        let budget = options.budget.unwrap_or(self.inner.budget);
        let member = Member {
            call: protocol::encode(keys, now_us, &[request]),
            lean: request.lean(),
            reply_len: request.reply_len(),
            slot: self.slot_of(keys, client),
            deadline: tokio::time::Instant::now() + budget,
        };
        let (redis, set) = (self.clone(), query.set.clone());
        let options = Options {
            once: None,
            ..*options
        };
        // Only a reservation keeps its client, for the settle.
        let client = if options.reserve {
            client.to_owned()
        } else {
            String::new()
        };
        Started::Waiting(Box::pin(async move {
            let request = Request {
                reserve: options.reserve,
                ..Request::new(&set, "")
            };
            // The check's one timer, over its wait in the queue and its call. Awaited here,
            // not in `within_budget`: a check's future holds redis-rs's large one, and one
            // more layer around it cost about 1 µs of CPU per check in the benchmark's HTTP
            // mode (moves and polls of the larger state).
            let reply = tokio::time::timeout(budget, redis.decide(member))
                .await
                .unwrap_or_else(|_| Err(redis.timed_out(budget)))?;
            let reply = protocol::decode(&reply, &[request])?
                .pop()
                .ok_or_else(|| Error::new(ErrorKind::Backend, "no reply to a check"))?;
            let mut limits = reply.limits.into_iter();
            let decisions = set
                .iter()
                .zip(reply.answers)
                .map(|(policy, answer)| {
                    let mut decision = decision(policy, answer, Reason::Redis);
                    if policy.takes_overrides() {
                        decision.limit = limits.next().unwrap_or(decision.limit);
                    }
                    decision
                })
                .collect();
            let decisions = Decisions::new(decisions);
            Ok(stamp(decisions, &options, &set, &client, reply.taken_at_us))
        }))
    }

    /// The Cluster slot of `client`'s keys, which batches are made of; 0 off a Cluster.
    fn slot_of(&self, keys: &KeyScheme, client: &str) -> u16 {
        #[cfg(feature = "cluster")]
        if self.is_cluster() {
            return keys.slot(client);
        }
        let _ = (keys, client);
        0
    }

    /// Runs the check `call` by `script` on the connection in use: its reply. Corrupt state is
    /// deleted and the check run again when the backend repairs; a connection that failed is
    /// given up for a fresh one.
    pub(crate) async fn call_script(
        &self,
        call: &Call,
        script: &Script,
    ) -> Result<Vec<i64>, Error> {
        let inner = &self.inner;
        let (mut conn, generation) = self.connection().await?;
        let mut reply = self.run::<Vec<i64>>(call, script, &mut conn).await;
        if inner.repair && matches!(&reply, Err(err) if call.is_repairable(err)) {
            // Opted in: what cannot be read is deleted, and the check starts over.
            let deleted: Result<(), _> = deadpool_redis::redis::cmd("DEL")
                .arg(&call.keys)
                .query_async(&mut conn)
                .await;
            if deleted.is_ok() {
                inner.repairs.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    target: "redlimit",
                    "deleted a client's corrupt limiter state and checked again"
                );
                reply = self.run(call, script, &mut conn).await;
            }
        }
        reply.map_err(|err| {
            if refusal::closes_connection(&err) || err.is_timeout() {
                self.discard(generation);
            }
            call.error(err)
        })
    }

    /// `attempt`, or a timeout once the budget is spent: for the operator's commands.
    async fn within_budget<T>(
        &self,
        attempt: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        tokio::time::timeout(self.inner.budget, attempt)
            .await
            .unwrap_or_else(|_| Err(self.timed_out(self.inner.budget)))
    }

    /// The error of a command that ran out of the budget. A command that hangs may be stuck
    /// behind a dead connection: the next one takes a fresh connection.
    fn timed_out(&self, budget: Duration) -> Error {
        let generation = self.lock().generation;
        self.discard(generation);
        Error::new(
            ErrorKind::Timeout,
            format!("redis did not answer within the budget of {budget:?}"),
        )
    }

    /// Runs one command of the operator's tools (inspect, reset, scan) within the budget.
    async fn query<T: FromRedisValue>(&self, what: &Call, cmd: &Cmd) -> Result<T, Error> {
        self.within_budget(async {
            let (mut conn, generation) = self.connection().await?;
            cmd.query_async(&mut conn).await.map_err(|err| {
                if refusal::closes_connection(&err) {
                    self.discard(generation);
                }
                what.error(err)
            })
        })
        .await
    }

    /// The state of `call`'s one key, of `algorithm`, and the decision of its cost, writing
    /// nothing.
    pub(crate) async fn inspect(
        &self,
        call: Call,
        algorithm: Algorithm,
    ) -> Result<Inspected, Error> {
        let script = &self.inner.scripts.inspect;
        let reply = self
            .within_budget(async {
                let (mut conn, _) = self.connection().await?;
                self.run(&call, script, &mut conn)
                    .await
                    .map_err(|err| call.error(err))
            })
            .await?;
        protocol::decode_inspected(reply, algorithm)
    }

    /// Publishes an operator event, `what` happened to `key`, on `channel`: every backend
    /// listening there drops its local blocks.
    pub(crate) async fn publish(&self, channel: &str, what: &str, key: &str) -> Result<(), Error> {
        let mut publish = deadpool_redis::redis::cmd("PUBLISH");
        publish.arg(channel).arg(format!("{what} {key}"));
        let call = Call::keys(vec![key.to_owned()]);
        match self.query::<u64>(&call, &publish).await {
            Ok(_) => Ok(()),
            // Done in Redis, yet unheard: say so, for local blocks last until they end.
            Err(error) => Err(Error::new(
                error.kind(),
                format!(
                    "{what} done, but its event was not published (instances keep their local \
                     blocks until they end): {error}"
                ),
            )),
        }
    }

    /// Listens for operator events on `channel` (see [`Heard`]).
    pub(crate) fn listen(&self, channel: &str) {
        events::listen(&self.inner, channel);
    }

    /// What this backend heard of operator events so far.
    pub(crate) fn heard(&self) -> Heard {
        events::start(&self.inner);
        self.inner.events.heard()
    }

    /// Whether this backend listens for operator events now (see
    /// [`GuardBuilder::block_cache`](crate::GuardBuilder::block_cache)): `false` before a
    /// guard with a block cache first checked, while Redis is unreachable, and always for a
    /// backend built [`from_pool`](Self::from_pool), which has no address to listen at.
    pub fn is_listening(&self) -> bool {
        self.inner.events.is_listening()
    }

    /// Sets `call`'s one key to `value` for `ttl_ms`.
    pub(crate) async fn set(&self, call: Call, value: &str, ttl_ms: u64) -> Result<(), Error> {
        let mut set = deadpool_redis::redis::cmd("SET");
        set.arg(&call.keys).arg(value).arg("PX").arg(ttl_ms);
        self.query(&call, &set).await
    }

    /// Runs a script that is not a check (a lease's acquire or renew, a settle) within the
    /// budget.
    pub(crate) async fn script(
        &self,
        call: Call,
        script: impl Fn(&Scripts) -> &Script,
    ) -> Result<Vec<i64>, Error> {
        let script = script(&self.inner.scripts);
        self.within_budget(async {
            let (mut conn, _) = self.connection().await?;
            self.run(&call, script, &mut conn)
                .await
                .map_err(|err| call.error(err))
        })
        .await
    }

    /// Removes lease `id` from the set at `key`.
    pub(crate) async fn release(&self, call: Call, id: &str) -> Result<(), Error> {
        let mut zrem = deadpool_redis::redis::cmd("ZREM");
        zrem.arg(&call.keys).arg(id);
        let _: u64 = self.query(&call, &zrem).await?;
        Ok(())
    }

    /// Deletes `call`'s keys; whether any existed.
    pub(crate) async fn delete(&self, call: Call) -> Result<bool, Error> {
        let mut del = deadpool_redis::redis::cmd("DEL");
        del.arg(&call.keys);
        let deleted: u64 = self.query(&call, &del).await?;
        Ok(deleted > 0)
    }

    /// The keys matching `pattern`, by `SCAN` on every primary, at most `max_calls` calls per
    /// primary; never `KEYS`. Returns the keys, the calls made, and whether every primary's
    /// scan went all the way round.
    pub(crate) async fn scan(
        &self,
        call: Call,
        pattern: &str,
        max_calls: u64,
    ) -> Result<(Vec<String>, u64, bool), Error> {
        let mut keys = Vec::new();
        let mut calls = 0;
        let mut complete = true;
        for node in self.primaries(&call).await? {
            let mut cursor = 0_u64;
            for _ in 0..max_calls {
                let mut scan = deadpool_redis::redis::cmd("SCAN");
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT);
                let (next, found): (u64, Vec<String>) = self.query_node(&call, &scan, node).await?;
                calls += 1;
                keys.extend(found);
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
            complete &= cursor == 0;
        }
        // SCAN may return a key twice (while the keyspace is rehashed).
        keys.sort_unstable();
        keys.dedup();
        Ok((keys, calls, complete))
    }

    /// A slot of each primary, to route a node's commands by; `[0]` (unused) off a Cluster.
    async fn primaries(&self, call: &Call) -> Result<Vec<u16>, Error> {
        #[cfg(feature = "cluster")]
        if self.is_cluster() {
            // CLUSTER SLOTS: per range, its first slot, last slot, then its primary's node
            // (an array beginning with host and port), then its replicas'.
            use deadpool_redis::redis::Value;
            let ranges: Vec<Vec<Value>> = self
                .query_node(call, deadpool_redis::redis::cmd("CLUSTER").arg("SLOTS"), 0)
                .await?;
            let mut seen = Vec::new();
            let mut firsts = Vec::new();
            for range in ranges {
                let (Some(first), Some(node)) = (range.first(), range.get(2)) else {
                    continue;
                };
                let first = u16::from_redis_value_ref(first).map_err(|e| call.error(e.into()))?;
                let primary: Vec<Value> =
                    FromRedisValue::from_redis_value_ref(node).map_err(|e| call.error(e.into()))?;
                let address: Vec<String> = primary
                    .iter()
                    .take(2)
                    .map(|v| String::from_redis_value_ref(v).unwrap_or_default())
                    .collect();
                if !seen.contains(&address) {
                    seen.push(address);
                    firsts.push(first);
                }
            }
            return Ok(firsts);
        }
        let _ = call;
        Ok(vec![0])
    }

    /// Runs `cmd` on the primary owning `slot` (a Cluster), or on the server.
    async fn query_node<T: FromRedisValue>(
        &self,
        call: &Call,
        cmd: &Cmd,
        slot: u16,
    ) -> Result<T, Error> {
        #[cfg(feature = "cluster")]
        if self.is_cluster() {
            use deadpool_redis::redis::cluster_routing::{
                Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
            };
            let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
                slot,
                SlotAddr::Master,
            )));
            return self
                .within_budget(async {
                    let (conn, _) = self.connection().await?;
                    let Conn::Cluster(mut conn) = conn else {
                        unreachable!("a cluster's connection")
                    };
                    let reply = conn
                        .route_command(cmd.clone(), routing)
                        .await
                        .map_err(|err| call.error(err))?;
                    T::from_redis_value(reply).map_err(|err| call.error(err.into()))
                })
                .await;
        }
        let _ = slot;
        self.query(call, cmd).await
    }

    /// How many times corrupt state was deleted; see [`RedisBackendBuilder::repair_corrupt_state`].
    pub fn repairs(&self) -> u64 {
        self.inner.repairs.load(Ordering::Relaxed)
    }

    /// `script` for `call` by `EVALSHA`, or by `EVAL` on a node that lacks it.
    async fn run<T: FromRedisValue>(
        &self,
        call: &Call,
        script: &Script,
        conn: &mut (impl ConnectionLike + Send),
    ) -> Result<T, RedisError> {
        let mut refusals = 0;
        loop {
            let mut reply = call.evalsha(script).query_async::<T>(conn).await;
            if matches!(&reply, Err(err) if err.kind() == RedisErrorKind::Server(ServerErrorKind::NoScript))
            {
                reply = call.eval(script).query_async(conn).await;
            }
            match &reply {
                Err(err)
                    if refusals < refusal::REFUSALS_RETRIED
                        && refusal::refused_before_running(err) =>
                {
                    tokio::time::sleep(Duration::from_millis(10 << refusals)).await;
                    refusals += 1;
                }
                _ => return reply,
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.inner
            .shared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    async fn connection(&self) -> Result<(Conn, u64), Error> {
        if let Some(held) = self.held() {
            return Ok(held);
        }
        let _only_one = self.inner.connecting.lock().await;
        if let Some(held) = self.held() {
            return Ok(held);
        }
        let fresh = self.inner.pools.get().await?;
        let mut shared = self.lock();
        let conn: Conn = shared.held.get_or_insert(fresh).conn();
        Ok((conn, shared.generation))
    }

    fn held(&self) -> Option<(Conn, u64)> {
        let shared = self.lock();
        shared
            .held
            .as_ref()
            .map(|held| (held.conn(), shared.generation))
    }

    /// Gives up the connection of `generation` for a fresh one, off a Cluster. A Cluster's
    /// client repairs each node's connection itself, and a dead node's failures must not cost
    /// the live nodes' checks a new connection (its slot map, a socket per node).
    fn discard(&self, generation: u64) {
        if self.is_cluster() {
            return;
        }
        let mut shared = self.lock();
        if shared.generation == generation {
            shared.generation += 1;
            if let Some(held) = shared.held.take() {
                held.discard();
            }
        }
    }
}

/// How many keys one `SCAN` call looks at: large enough that a million keys take a thousand
/// calls, small enough that one call never blocks Redis for long.
const SCAN_COUNT: u64 = 1_000;

/// Builds a [`RedisBackend`]; see [`RedisBackend::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisBackendBuilder {
    topology: Topology,
    budget: Duration,
    pool_size: usize,
    repair: bool,
    #[cfg(feature = "tls")]
    tls: tls::Tls,
}

impl RedisBackendBuilder {
    fn new(topology: Topology) -> Self {
        Self {
            topology,
            budget: Duration::from_millis(100),
            pool_size: 4,
            repair: false,
            #[cfg(feature = "tls")]
            tls: tls::Tls::default(),
        }
    }

    /// The time budget of a check made without a guard, and of the operator's commands
    /// (inspect, reset, overrides, leases): waiting for a connection, connecting and the reply
    /// together. Defaults to 100 ms. A [`GuardedLimiter`](crate::GuardedLimiter)'s checks are
    /// timed by [its budget](crate::GuardBuilder::budget) instead, on the same one timer, so
    /// a guarded check has exactly one budget; either way, running out of it is
    /// [`ErrorKind::Timeout`](crate::ErrorKind::Timeout).
    pub fn budget(mut self, budget: Duration) -> Self {
        self.budget = budget;
        self
    }

    /// The most connections the pool opens. Defaults to 4; one multiplexed connection serves
    /// all concurrent checks, the rest stand by for reconnects.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size;
        self
    }

    /// Trusts the certificate authority in `pem` (PEM-encoded) instead of the system's roots, for
    /// a standalone `rediss://` server, a Cluster's nodes or the primary sentinels name (reached
    /// over TLS when any certificate is given) with a private CA. Defaults to the system's
    /// roots.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_root_ca(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.root_ca = Some(pem.into());
        self
    }

    /// Presents this client certificate and key (both PEM-encoded) to a standalone `rediss://`
    /// server, a Cluster's nodes or the primary sentinels name, when they ask for one
    /// (`tls-auth-clients yes`). Defaults to none.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_client_certificate(
        mut self,
        certificate_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((certificate_pem.into(), key_pem.into()));
        self
    }

    /// Whether a key that cannot be read (the wrong type, a value redlimit never writes) is
    /// deleted and the check run again on fresh state, logged at `warn` and counted in
    /// [`RedisBackend::repairs`]. Defaults to `false`: corrupt state is an
    /// [`ErrorKind::CorruptState`] error, so that nothing someone else stored is deleted; with
    /// fail open that client is unlimited until the key is fixed, with fail closed locked out.
    pub fn repair_corrupt_state(mut self, repair: bool) -> Self {
        self.repair = repair;
        self
    }

    /// Validates the settings and builds the backend, without connecting.
    ///
    /// # Errors
    /// A [`ConfigError`] for an unparsable URL, no URL, a zero budget or a zero pool size.
    pub fn build(self) -> Result<RedisBackend, ConfigError> {
        if self.budget.is_zero() {
            return Err(ConfigError::Zero { field: "budget" });
        }
        if self.pool_size == 0 {
            return Err(ConfigError::Zero { field: "pool_size" });
        }
        #[cfg(feature = "tls")]
        tls::install_crypto_provider();
        let pools = self.pools()?;
        let batcher = Batcher::new(pools.is_cluster());
        // After the pools, whose errors name each setting first.
        let subscriber = self.subscriber()?;
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                pools,
                scripts: Scripts::new(),
                budget: self.budget,
                repair: self.repair,
                repairs: AtomicU64::new(0),
                shared: Mutex::default(),
                connecting: tokio::sync::Mutex::default(),
                batcher,
                events: Events::default(),
                subscriber,
            }),
        })
    }

    /// The sentinels at `urls` naming `master`, with this builder's certificates for it.
    #[cfg(feature = "sentinel")]
    fn sentinels(&self, urls: &[String], master: &str) -> sentinel_pool::Sentinels {
        sentinel_pool::Sentinels {
            urls: urls.to_vec(),
            master: master.to_owned(),
            #[cfg(feature = "tls")]
            certificates: self.tls.certificates(),
        }
    }

    /// Where the backend listens for operator events: the settings its connections use.
    fn subscriber(&self) -> Result<Subscriber, ConfigError> {
        let node = |url: &str| -> Result<ConnectionInfo, ConfigError> {
            #[cfg(feature = "tls")]
            if let Some(info) = self.tls.connection_info(url)? {
                return Ok(info);
            }
            url.into_connection_info().map_err(|e| ConfigError::Redis {
                field: "redis url",
                message: e.to_string(),
            })
        };
        Ok(match &self.topology {
            Topology::Pool(_) => Subscriber::None,
            Topology::Standalone(url) => Subscriber::Nodes(vec![node(url)?]),
            #[cfg(feature = "cluster")]
            Topology::Cluster(urls) => {
                Subscriber::Nodes(urls.iter().map(|url| node(url)).collect::<Result<_, _>>()?)
            }
            #[cfg(feature = "sentinel")]
            Topology::Sentinel { urls, master } => {
                Subscriber::Sentinel(self.sentinels(urls, master))
            }
        })
    }

    fn pools(&self) -> Result<Pools, ConfigError> {
        let invalid = |field: &'static str| {
            move |err: &dyn fmt::Display| ConfigError::Redis {
                field,
                message: err.to_string(),
            }
        };
        // No timer of the pool's or the connection's own (see `connection::untimed`): every
        // wait (for the pool, to connect, for a reply) happens inside the caller's one timer,
        // the check's budget or the backend's, so a check's budget is never cut short by another.
        macro_rules! pool {
            ($builder:expr, $field:literal) => {
                $builder
                    .max_size(self.pool_size)
                    .runtime(Runtime::Tokio1)
                    .build()
                    .map_err(|e| invalid($field)(&e))?
            };
        }
        Ok(match &self.topology {
            Topology::Pool(pool) => Pools::Application(pool.clone()),
            Topology::Standalone(url) => {
                check_url("redis url", url)?;
                #[cfg(feature = "tls")]
                let info = self.tls.connection_info(url)?;
                #[cfg(not(feature = "tls"))]
                let info = None;
                let info = match info {
                    Some(info) => info,
                    None => url
                        .as_str()
                        .into_connection_info()
                        .map_err(|e| invalid("redis url")(&e))?,
                };
                let manager = standalone_pool::StandaloneManager::new(info);
                Pools::Standalone(pool!(
                    standalone_pool::StandalonePool::builder(manager),
                    "redis url"
                ))
            }
            #[cfg(feature = "cluster")]
            Topology::Cluster(urls) => {
                if urls.is_empty() {
                    return Err(ConfigError::Missing {
                        field: "cluster urls",
                    });
                }
                for url in urls {
                    check_url("cluster urls", url)?;
                }
                #[cfg_attr(not(feature = "tls"), expect(unused_mut))]
                let mut client =
                    deadpool_redis::redis::cluster::ClusterClientBuilder::new(urls.clone());
                #[cfg(feature = "tls")]
                if let Some(certificates) = self.tls.certificates() {
                    client = client.certs(certificates);
                }
                // A connect timer is the one timer the cluster client insists on (1 s unless
                // set; its replies have none unless set): one so long that the caller's budget
                // always ends first.
                let client = client.connection_timeout(connect::NO_TIMER);
                let manager = cluster_pool::ClusterManager::new(client)
                    .map_err(|e| invalid("cluster urls")(&e))?;
                Pools::Cluster(pool!(
                    cluster_pool::ClusterPool::builder(manager),
                    "cluster urls"
                ))
            }
            #[cfg(feature = "sentinel")]
            Topology::Sentinel { urls, master } => {
                if urls.is_empty() {
                    return Err(ConfigError::Missing {
                        field: "sentinel urls",
                    });
                }
                for url in urls {
                    check_url("sentinel urls", url)?;
                }
                let manager = sentinel_pool::SentinelManager::new(&self.sentinels(urls, master))
                    .map_err(|e| invalid("sentinel urls")(&e))?;
                Pools::Sentinel(pool!(
                    sentinel_pool::SentinelPool::builder(manager),
                    "sentinel urls"
                ))
            }
        })
    }
}
