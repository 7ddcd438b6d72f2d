//! Certificates for TLS tests, made at run time.

use std::path::PathBuf;

use crate::{RedisServer, free_port};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
};

/// A certificate authority, a server certificate for 127.0.0.1 and a client certificate it
/// signed, as PEM files in a temporary directory (`ca.crt`, `server.crt`, `server.key`,
/// `client.crt`, `client.key`), removed on drop.
#[derive(Debug)]
pub struct Pki {
    dir: PathBuf,
    /// The authority's certificate, PEM.
    pub ca_pem: String,
}

impl Pki {
    /// A new authority and its certificates, in a directory named after `name`.
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("redlimit-tls-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        // Each certificate names itself: OpenSSL (the server's side of mutual TLS) takes a
        // certificate whose subject is its issuer's for self-signed.
        let named = |names: Vec<String>, common_name: &str| {
            let mut params = CertificateParams::new(names).expect("params");
            params.distinguished_name = DistinguishedName::new();
            params
                .distinguished_name
                .push(DnType::CommonName, common_name);
            params
        };
        let mut ca_params = named(Vec::new(), "redlimit test CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_key = KeyPair::generate().expect("a CA key");
        let ca_pem = ca_params.self_signed(&ca_key).expect("a CA").pem();
        let issuer = Issuer::new(ca_params, ca_key);
        let server_params = named(
            vec!["127.0.0.1".to_owned(), "localhost".to_owned()],
            "redlimit test server",
        );
        let server_key = KeyPair::generate().expect("a server key");
        let server_pem = server_params
            .signed_by(&server_key, &issuer)
            .expect("a server certificate")
            .pem();
        let client_key = KeyPair::generate().expect("a client key");
        let client_params = named(vec!["redlimit-client".to_owned()], "redlimit test client");
        let client_pem = client_params
            .signed_by(&client_key, &issuer)
            .expect("a client certificate")
            .pem();
        for (file, text) in [
            ("ca.crt", ca_pem.as_str()),
            ("server.crt", server_pem.as_str()),
            ("server.key", server_key.serialize_pem().as_str()),
            ("client.crt", client_pem.as_str()),
            ("client.key", client_key.serialize_pem().as_str()),
        ] {
            std::fs::write(dir.join(file), text).expect("writing a PEM file");
        }
        Self { dir, ca_pem }
    }

    /// A redis-server serving TLS with these certificates on a free port, asking clients for a
    /// certificate of this authority when `auth_clients`, and its `rediss://` URL.
    pub fn start_server(&self, auth_clients: bool) -> (RedisServer, String) {
        let tls_port = free_port().to_string();
        let settings = self.tls_settings(&tls_port, auth_clients);
        let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
        let server = RedisServer::start_with(&settings);
        (server, format!("rediss://127.0.0.1:{tls_port}"))
    }

    /// The settings of a redis-server serving TLS on `tls_port` with these certificates.
    pub(crate) fn tls_settings(&self, tls_port: &str, auth_clients: bool) -> Vec<String> {
        [
            "--tls-port",
            tls_port,
            "--tls-cert-file",
            &self.file("server.crt"),
            "--tls-key-file",
            &self.file("server.key"),
            "--tls-ca-cert-file",
            &self.file("ca.crt"),
            "--tls-auth-clients",
            if auth_clients { "yes" } else { "no" },
        ]
        .map(str::to_owned)
        .to_vec()
    }

    /// The path of one of its files.
    pub fn file(&self, name: &str) -> String {
        self.dir
            .join(name)
            .to_str()
            .expect("a UTF-8 path")
            .to_owned()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
