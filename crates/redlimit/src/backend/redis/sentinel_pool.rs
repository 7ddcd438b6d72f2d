//! The pool of connections to the primary the sentinels name, with TLS certificates for it: the
//! sentinels are asked at every new connection, so after a failover new connections go to the
//! new primary.

use std::sync::atomic::AtomicUsize;

use deadpool::managed;
use deadpool_redis::redis::{
    IntoConnectionInfo, RedisError, RedisResult,
    aio::MultiplexedConnection,
    sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType},
};

/// How to reach the primary named `master` through the sentinels at `urls`: the sentinels as
/// their URLs say (`rediss://` for TLS, a password), the primary over TLS with `certificates`
/// when there are any. No `Debug`: its URLs may hold a password, its certificates a private key.
#[derive(Clone)]
pub(crate) struct Sentinels {
    pub(crate) urls: Vec<String>,
    pub(crate) master: String,
    #[cfg(feature = "tls")]
    pub(crate) certificates: Option<deadpool_redis::redis::TlsCertificates>,
}

impl Sentinels {
    /// A client asking the sentinels for the primary.
    pub(crate) fn client(&self) -> RedisResult<SentinelClient> {
        let infos = self
            .urls
            .iter()
            .map(|url| url.as_str().into_connection_info())
            .collect::<RedisResult<Vec<_>>>()?;
        let mut builder = SentinelClientBuilder::new(
            infos.iter().map(|info| info.addr().clone()),
            &self.master,
            SentinelServerType::Master,
        )?;
        // The sentinels' own credentials, from the first URL that has any.
        if let Some(settings) = infos
            .iter()
            .map(|info| info.redis_settings())
            .find(|s| s.username().is_some() || s.password().is_some())
        {
            if let Some(username) = settings.username() {
                builder = builder.set_client_to_sentinel_username(username);
            }
            if let Some(password) = settings.password() {
                builder = builder.set_client_to_sentinel_password(password);
            }
        }
        #[cfg(feature = "tls")]
        if let Some(certificates) = &self.certificates {
            builder = builder
                .set_client_to_redis_tls_mode(deadpool_redis::redis::TlsMode::Secure)
                .set_client_to_redis_certificates(certificates.clone());
        }
        builder.build()
    }
}

/// Makes connections to the primary the sentinels name, and checks a pooled one with a `PING`.
pub(crate) struct SentinelManager {
    client: tokio::sync::Mutex<SentinelClient>,
    pings: AtomicUsize,
}

impl SentinelManager {
    pub(crate) fn new(sentinels: &Sentinels) -> RedisResult<Self> {
        Ok(Self {
            client: tokio::sync::Mutex::new(sentinels.client()?),
            pings: AtomicUsize::new(0),
        })
    }
}

impl managed::Manager for SentinelManager {
    type Type = MultiplexedConnection;
    type Error = RedisError;

    async fn create(&self) -> Result<MultiplexedConnection, RedisError> {
        // Untimed and bounded to the primary (the caller's budget times it); redis-rs's
        // questions to the sentinels keep their own timers, 500 ms a sentinel before it asks
        // the next.
        let primary = self.client.lock().await.async_get_client().await?;
        super::connect::connect(primary.get_connection_info(), super::connect::untimed()).await
    }

    async fn recycle(
        &self,
        conn: &mut MultiplexedConnection,
        _: &managed::Metrics,
    ) -> managed::RecycleResult<RedisError> {
        super::connect::recycle_with_ping(conn, &self.pings).await
    }
}

/// The pool of [`SentinelManager`]'s connections.
pub(crate) type SentinelPool = managed::Pool<SentinelManager>;

/// A connection checked out of a [`SentinelPool`].
pub(crate) type SentinelObject = managed::Object<SentinelManager>;
