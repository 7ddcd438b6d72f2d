//! An operator's commands on Redis: read and reset a client's state, set and clear its
//! overrides, scan a policy's keys on every primary; each done action published, so that every
//! instance drops its local blocks.

use std::time::Duration;

use deadpool_redis::redis::{Cmd, FromRedisValue};

#[cfg(feature = "cluster")]
use super::connection::Conn;
use super::{
    RedisBackend,
    protocol::{self, Call, Keys, Request},
    refusal,
};
use crate::{
    Algorithm, Decision, Error, KeyScheme, Policy, Reason,
    backend::{answer::Inspected, query::Target},
};

/// How many keys one `SCAN` call looks at: large enough that a million keys take a thousand
/// calls, small enough that one call never blocks Redis for long.
const SCAN_COUNT: u64 = 1_000;

impl RedisBackend {
    /// Checks `client` of `policy` by `overridden` (the policy with the override's numbers)
    /// until `ttl` from now, for every instance.
    pub(crate) async fn set_override(
        &self,
        keys: &KeyScheme,
        (policy, client): (&Policy, &str),
        overridden: Policy,
        ttl: Duration,
    ) -> Result<(), Error> {
        let key = keys.override_key(policy, client);
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let value = protocol::override_value(&overridden, &keys.key(&overridden, client));
        self.set(Call::keys(vec![key.clone()]), &value, ttl_ms)
            .await?;
        self.publish(&keys.events_channel(), "override", &key).await
    }

    /// Ends `client`'s override of `policy`; whether one was in force.
    pub(crate) async fn clear_override(
        &self,
        keys: &KeyScheme,
        policy: &Policy,
        client: &str,
    ) -> Result<bool, Error> {
        let key = keys.override_key(policy, client);
        let cleared = self.delete(Call::keys(vec![key.clone()])).await?;
        self.publish(&keys.events_channel(), "clear-override", &key)
            .await?;
        Ok(cleared)
    }

    /// What `policy` holds for `target` and the decision a request of cost 1 would get, writing
    /// nothing; with the key it lives under.
    pub(crate) async fn inspect(
        &self,
        keys: &KeyScheme,
        policy: &Policy,
        target: Target<'_>,
    ) -> Result<(String, Decision, Inspected), Error> {
        let one = std::slice::from_ref(policy);
        let call = match &target {
            // A client's override, if it has one, names the key and numbers in force.
            Target::Client(client) => protocol::encode(keys, None, &[Request::new(one, client)]),
            // The key a scan found: no client, so no override to read.
            Target::Key(key) => {
                let request = Request {
                    marks: false,
                    ..Request::new(one, "")
                };
                let mut call = protocol::encode(keys, None, &[request]);
                call.keys = Keys::from_buf([key.clone()]);
                call
            }
        };
        let inspected = self.inspect_call(call, policy.algorithm()).await?;
        Ok(inspected.seen(keys, policy, &target, Reason::Redis))
    }

    /// Deletes what `policy` holds for `client`; whether it held anything.
    pub(crate) async fn reset(
        &self,
        keys: &KeyScheme,
        policy: &Policy,
        client: &str,
    ) -> Result<bool, Error> {
        let mut names = vec![keys.key(policy, client)];
        if policy.takes_overrides() {
            // And the key of the client's override, if one is in force: in the same slot, so
            // one DEL takes both.
            let (in_force, _, _) = self.inspect(keys, policy, Target::Client(client)).await?;
            if in_force != names[0] {
                names.push(in_force);
            }
        }
        let deleted = self.delete(Call::keys(names.clone())).await?;
        self.publish(&keys.events_channel(), "reset", &names[0])
            .await?;
        Ok(deleted)
    }

    /// The Redis keys of `policy`, by a `SCAN` of at most `max_calls` calls per primary: the
    /// keys, the calls made, and whether the scan went through every key.
    pub(crate) async fn scan(
        &self,
        keys: &KeyScheme,
        policy: &Policy,
        max_calls: u64,
    ) -> Result<(Vec<String>, u64, bool), Error> {
        let pattern = keys.pattern(policy);
        self.scan_pattern(Call::keys(vec![pattern.clone()]), &pattern, max_calls)
            .await
    }

    /// Runs one command of the operator's tools (inspect, reset, scan) within the budget.
    pub(super) async fn query<T: FromRedisValue>(
        &self,
        what: &Call,
        cmd: &Cmd,
    ) -> Result<T, Error> {
        self.within_budget(async {
            let (mut conn, generation) = self.connection().await?;
            cmd.query_async(&mut conn).await.map_err(|err| {
                if refusal::closes_connection(&err) {
                    self.discard(generation, false);
                }
                what.error(err)
            })
        })
        .await
    }

    /// The state of `call`'s one key, of `algorithm`, and the decision of its cost, writing
    /// nothing.
    async fn inspect_call(&self, call: Call, algorithm: Algorithm) -> Result<Inspected, Error> {
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
    pub(super) async fn publish(&self, channel: &str, what: &str, key: &str) -> Result<(), Error> {
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

    /// Sets `call`'s one key to `value` for `ttl_ms`.
    async fn set(&self, call: Call, value: &str, ttl_ms: u64) -> Result<(), Error> {
        let mut set = deadpool_redis::redis::cmd("SET");
        set.arg(call.keys.as_slice())
            .arg(value)
            .arg("PX")
            .arg(ttl_ms);
        self.query(&call, &set).await
    }

    /// Deletes `call`'s keys; whether any existed.
    async fn delete(&self, call: Call) -> Result<bool, Error> {
        let mut del = deadpool_redis::redis::cmd("DEL");
        del.arg(call.keys.as_slice());
        let deleted: u64 = self.query(&call, &del).await?;
        Ok(deleted > 0)
    }

    /// The keys matching `pattern`, by `SCAN` on every primary, at most `max_calls` calls per
    /// primary; never `KEYS`. Returns the keys, the calls made, and whether every primary's
    /// scan went all the way round.
    async fn scan_pattern(
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
}
