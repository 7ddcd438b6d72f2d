//! Redis standalone backend: one `EVALSHA` per check over a pooled multiplexed connection.

use std::{
    fmt,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use deadpool_redis::{
    Manager, Pool, Runtime,
    redis::{AsyncConnectionConfig, Script, aio::MultiplexedConnection},
};

use super::script::{self, Answer};
use crate::{ConfigError, Error, ErrorKind, Policy};

/// Redis standalone backend, through a deadpool-redis pool.
///
/// Every check is one `EVALSHA` of one script (loaded once, reloaded on `NOSCRIPT`), so a check of
/// several policies is still one round trip. A redis-rs multiplexed connection carries any number
/// of concurrent checks, so the backend keeps one checked out and shares it, instead of paying the
/// pool's health-check `PING` on every checkout; it goes back to the pool for a fresh one only when
/// a command fails or times out. Nothing connects until the first check, so an application starts
/// even while Redis is down.
///
/// ```no_run
/// use std::time::Duration;
/// use redlimit::{Limiter, RedisBackend};
///
/// let redis = RedisBackend::builder("redis://127.0.0.1:6379")
///     .timeout(Duration::from_millis(50))
///     .build()?;
/// let limiter = Limiter::new(redis);
/// # Ok::<(), redlimit::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    script: Script,
    timeout: Duration,
    shared: Mutex<Shared>,
}

/// The connection in use, and a generation so a late failure cannot discard its replacement.
#[derive(Default)]
struct Shared {
    connection: Option<deadpool_redis::Connection>,
    generation: u64,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("pool", &self.inner.pool.status())
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// Starts a backend for the Redis at `url` (`redis://[user:pass@]host:port[/db]`).
    pub fn builder(url: impl Into<String>) -> RedisBackendBuilder {
        RedisBackendBuilder {
            url: url.into(),
            timeout: Duration::from_millis(100),
            pool_size: 4,
        }
    }

    /// The time budget of one check.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    pub(crate) async fn check(
        &self,
        policies: &[Policy],
        keys: &[String],
        cost: u64,
        now_us: Option<u64>,
    ) -> Result<Vec<Answer>, Error> {
        let inner = &self.inner;
        let attempt = async {
            let (mut connection, generation) = self.connection().await?;
            let call = script::invocation(&inner.script, policies, keys, cost, now_us);
            match call.invoke_async::<Vec<i64>>(&mut connection).await {
                Ok(reply) => script::parse(&reply, policies.len()),
                Err(err) => {
                    if err.is_unrecoverable_error() || err.is_timeout() {
                        self.discard(generation);
                    }
                    Err(script::error(err))
                }
            }
        };
        match tokio::time::timeout(inner.timeout, attempt).await {
            Ok(result) => result,
            Err(_) => {
                // A check that hangs may be stuck behind a dead connection: take a fresh one next.
                let generation = self.lock().generation;
                self.discard(generation);
                Err(Error::new(
                    ErrorKind::Timeout,
                    format!("redis did not answer within {:?}", inner.timeout),
                ))
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.inner
            .shared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    async fn connection(&self) -> Result<(MultiplexedConnection, u64), Error> {
        {
            let shared = self.lock();
            if let Some(connection) = &shared.connection {
                return Ok(((**connection).clone(), shared.generation));
            }
        }
        let fresh = self.inner.pool.get().await.map_err(|err| {
            Error::new(ErrorKind::Backend, "no redis connection").with_source(err)
        })?;
        let mut shared = self.lock();
        let connection = shared.connection.get_or_insert(fresh);
        Ok(((**connection).clone(), shared.generation))
    }

    fn discard(&self, generation: u64) {
        let mut shared = self.lock();
        if shared.generation == generation {
            shared.generation += 1;
            // Taken out of the pool for good: a connection that failed is not recycled.
            if let Some(connection) = shared.connection.take() {
                drop(deadpool_redis::Connection::take(connection));
            }
        }
    }
}

/// Builds a [`RedisBackend`]; see [`RedisBackend::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisBackendBuilder {
    url: String,
    timeout: Duration,
    pool_size: usize,
}

impl RedisBackendBuilder {
    /// The time budget of one check: waiting for a connection, connecting, and the reply
    /// together. Defaults to 100 ms.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The most connections the pool opens. Defaults to 4; one multiplexed connection serves
    /// all concurrent checks, the rest stand by for reconnects.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size;
        self
    }

    /// Validates the settings and builds the backend, without connecting.
    ///
    /// # Errors
    /// A [`ConfigError`] for an unparsable URL, a zero timeout or a zero pool size.
    pub fn build(self) -> Result<RedisBackend, ConfigError> {
        if self.timeout.is_zero() {
            return Err(ConfigError::Zero { field: "timeout" });
        }
        if self.pool_size == 0 {
            return Err(ConfigError::Zero { field: "pool_size" });
        }
        let redis_url = |err: &dyn fmt::Display| ConfigError::Redis {
            field: "redis url",
            message: err.to_string(),
        };
        let connection = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        let manager =
            Manager::new_with_config(self.url.as_str(), connection).map_err(|e| redis_url(&e))?;
        let pool = Pool::builder(manager)
            .max_size(self.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(self.timeout))
            .create_timeout(Some(self.timeout))
            .recycle_timeout(Some(self.timeout))
            .build()
            .map_err(|e| redis_url(&e))?;
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                pool,
                script: script::script(),
                timeout: self.timeout,
                shared: Mutex::default(),
            }),
        })
    }
}
