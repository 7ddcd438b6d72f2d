//! TLS settings beyond a `rediss://` URL: a private CA, a client certificate.

use std::fmt;

use deadpool_redis::redis::{self, ClientTlsConfig, ConnectionInfo, TlsCertificates};

use crate::ConfigError;

/// PEM-encoded certificates for `rediss://` servers (standalone or a Cluster's nodes). `Debug`
/// shows which are set, never the private key.
#[derive(Clone, Default)]
pub(super) struct Tls {
    pub(super) root_ca: Option<Vec<u8>>,
    pub(super) client: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("root_ca", &self.root_ca.is_some())
            .field("client_certificate", &self.client.is_some())
            .finish()
    }
}

impl Tls {
    pub(super) fn is_set(&self) -> bool {
        self.root_ca.is_some() || self.client.is_some()
    }

    /// These certificates for a client, or `None` when there are none.
    pub(super) fn certificates(&self) -> Option<TlsCertificates> {
        self.is_set().then(|| TlsCertificates {
            client_tls: self
                .client
                .clone()
                .map(|(client_cert, client_key)| ClientTlsConfig {
                    client_cert,
                    client_key,
                }),
            root_cert: self.root_ca.clone(),
        })
    }

    /// The connection settings of `url` with these certificates, or `None` when there are none
    /// (the URL alone then says everything: `rediss://` trusts the system's roots).
    pub(super) fn connection_info(&self, url: &str) -> Result<Option<ConnectionInfo>, ConfigError> {
        if self.is_set() && !url.starts_with("rediss://") {
            return Err(ConfigError::Redis {
                field: "tls",
                message: "certificates need a rediss:// URL".to_owned(),
            });
        }
        let Some(certificates) = self.certificates() else {
            return Ok(None);
        };
        let client =
            redis::Client::build_with_tls(url, certificates).map_err(|e| ConfigError::Redis {
                field: "tls",
                message: e.to_string(),
            })?;
        Ok(Some(client.get_connection_info().clone()))
    }
}

/// rustls needs one process-wide crypto provider; ring is the one this crate builds with. An
/// application that installed its own keeps it.
pub(super) fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
