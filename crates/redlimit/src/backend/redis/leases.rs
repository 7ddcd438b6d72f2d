//! Concurrency leases on Redis: a sorted set per limit, taken by a check (`lua/lease.lua`),
//! renewed by a script, given back by `ZREM`.

use super::{
    RedisBackend,
    protocol::{self, Call},
};
use crate::Error;

impl RedisBackend {
    /// Gives lease `id` in the set at `key` `ttl_ms` more; whether it was still held.
    pub(crate) async fn renew_lease(
        &self,
        key: &str,
        id: &str,
        ttl_ms: u64,
    ) -> Result<bool, Error> {
        let call = protocol::renewal(key.to_owned(), ttl_ms, id);
        let reply = self.script(call, |s| &s.renew).await?;
        Ok(reply.first() == Some(&1))
    }

    /// Removes lease `id` from the set at `key`.
    pub(crate) async fn release_lease(&self, key: &str, id: &str) -> Result<(), Error> {
        let call = Call::keys(vec![key.to_owned()]);
        let mut zrem = deadpool_redis::redis::cmd("ZREM");
        zrem.arg(call.keys.as_slice()).arg(id);
        let _: u64 = self.query(&call, &zrem).await?;
        Ok(())
    }
}
