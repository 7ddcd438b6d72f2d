//! How to reach the primary the sentinels name, with TLS certificates for it: for the node
//! pool and the operator-event listener.

use deadpool_redis::redis::{
    IntoConnectionInfo, RedisResult,
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
