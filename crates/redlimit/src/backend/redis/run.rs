//! Running a check within a budget: `FCALL` of its function, the library loaded where the node
//! lacks it, or (functions refused) `EVALSHA`, or `EVAL` where the node lacks the script; a refusal
//! sent again, corrupt state repaired when asked, a failed connection given up.

use std::{sync::atomic::Ordering, time::Duration};

use deadpool_redis::redis::{
    ErrorKind as RedisErrorKind, FromRedisValue, RedisError, ServerErrorKind, aio::ConnectionLike,
};

use super::{
    RedisBackend,
    protocol::{Call, Integers},
    refusal,
    scripts::{Script, Scripts},
};
use crate::Error;

impl RedisBackend {
    /// Runs the check `call` by `script` on the connection in use: its reply. Corrupt state is
    /// deleted and the check run again when the backend repairs; a connection that failed is
    /// given up for a fresh one.
    pub(super) async fn call_script(
        &self,
        call: &Call,
        script: &Script,
    ) -> Result<Vec<i64>, Error> {
        let inner = &self.inner;
        let (mut conn, generation) = self.connection().await?;
        let mut reply = self.integers(call, script, &mut conn).await;
        if inner.repair && matches!(&reply, Err(err) if call.is_repairable(err)) {
            // Opted in: what cannot be read is deleted, and the check starts over.
            let deleted: Result<(), _> = deadpool_redis::redis::cmd("DEL")
                .arg(call.keys.as_slice())
                .query_async(&mut conn)
                .await;
            if deleted.is_ok() {
                inner.repairs.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    target: "redlimit",
                    "deleted a client's corrupt limiter state and checked again"
                );
                reply = self.integers(call, script, &mut conn).await;
            }
        }
        reply.map_err(|err| {
            if refusal::closes_connection(&err) || err.is_timeout() {
                self.discard(generation, !refusal::closes_connection(&err));
            }
            call.error(err)
        })
    }

    /// Runs a script that is not a check (a lease's renewal, a settle) within the
    /// budget.
    pub(super) async fn script(
        &self,
        call: Call,
        script: impl Fn(&Scripts) -> &Script,
    ) -> Result<Vec<i64>, Error> {
        let script = script(&self.inner.scripts);
        self.within_budget(async {
            let (mut conn, _) = self.connection().await?;
            self.integers(&call, script, &mut conn)
                .await
                .map_err(|err| call.error(err))
        })
        .await
    }

    /// `attempt`, or a timeout once the budget is spent: for the operator's commands.
    pub(super) async fn within_budget<T>(
        &self,
        attempt: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        tokio::time::timeout(self.inner.budget, attempt)
            .await
            .unwrap_or_else(|_| Err(self.timed_out(self.inner.budget)))
    }

    /// The integers `script` answers `call` with, packed (a check's) or not.
    async fn integers(
        &self,
        call: &Call,
        script: &Script,
        conn: &mut (impl ConnectionLike + Send),
    ) -> Result<Vec<i64>, RedisError> {
        self.run::<Integers>(call, script, conn)
            .await
            .map(|integers| integers.0)
    }

    /// `script` for `call`: by `FCALL` of its library function, loaded first on a node that
    /// lacks it; else (no function, or functions refused) by `EVALSHA`, or by `EVAL` on a node
    /// that lacks the script.
    pub(super) async fn run<T: FromRedisValue>(
        &self,
        call: &Call,
        script: &Script,
        conn: &mut (impl ConnectionLike + Send),
    ) -> Result<T, RedisError> {
        let mut refusals = 0;
        loop {
            let reply = match script.function() {
                Some(function) if self.inner.functions.load(Ordering::Relaxed) => {
                    self.function(call, function, conn).await
                }
                _ => None,
            };
            let reply = match reply {
                Some(reply) => reply,
                None => self.evaluate(call, script, conn).await,
            };
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

    /// `call` by `FCALL function`, the library loaded first where the node lacks it; `None`
    /// where the server refuses functions (which are then not asked for again) or the library
    /// could not be loaded: the call then goes as a script, to its own node alone, where a
    /// Cluster's load goes to every primary and fails while any one is down.
    async fn function<T: FromRedisValue>(
        &self,
        call: &Call,
        function: &str,
        conn: &mut (impl ConnectionLike + Send),
    ) -> Option<Result<T, RedisError>> {
        let mut reply = call.command("FCALL", function).query_async::<T>(conn).await;
        if matches!(&reply, Err(err) if refusal::function_missing(err)) {
            // On a Cluster redis-rs sends it to every primary.
            let loaded: Result<(), RedisError> = deadpool_redis::redis::cmd("FUNCTION")
                .arg("LOAD")
                .arg("REPLACE")
                .arg(self.inner.scripts.library.source())
                .query_async(conn)
                .await;
            reply = match loaded {
                Ok(()) => call.command("FCALL", function).query_async(conn).await,
                Err(err) if refusal::refuses_functions(&err) => Err(err),
                Err(_) => return None,
            };
        }
        match reply {
            Err(err) if refusal::refuses_functions(&err) => {
                self.inner.functions.store(false, Ordering::Relaxed);
                // Not Redis's words: an unknown command's answer quotes the call's first
                // arguments, a client's key among them.
                tracing::info!(
                    target: "redlimit",
                    "the server refuses the limiter's function library (its ACL without FCALL or \
                     FUNCTION LOAD, or a proxy that does not know them): checks go as scripts"
                );
                None
            }
            reply => Some(reply),
        }
    }

    /// `call` by `EVALSHA`, or by `EVAL` on a node that lacks the script.
    async fn evaluate<T: FromRedisValue>(
        &self,
        call: &Call,
        script: &Script,
        conn: &mut (impl ConnectionLike + Send),
    ) -> Result<T, RedisError> {
        let reply = call.evalsha(script).query_async::<T>(conn).await;
        if matches!(&reply, Err(err) if err.kind() == RedisErrorKind::Server(ServerErrorKind::NoScript))
        {
            return call.eval(script).query_async(conn).await;
        }
        reply
    }
}
