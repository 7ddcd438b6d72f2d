//! `rediss://` against a real redis-server with `--tls-port`, certificates made here.

use std::{path::PathBuf, time::Duration};

use deadpool_redis::redis;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use redlimit::{Algorithm, FailurePolicy, GuardedLimiter, Limiter, Reason, RedisBackend};
use redlimit_tests::{RedisServer, free_port};

use crate::support::{alone, policy};

/// A certificate authority and a server certificate for 127.0.0.1 it signed, as PEM files.
struct Pki {
    dir: PathBuf,
    ca_pem: String,
}

impl Pki {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("redlimit-tls-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_key = KeyPair::generate().expect("a CA key");
        let ca_pem = ca_params.self_signed(&ca_key).expect("a CA").pem();
        let issuer = Issuer::new(ca_params, ca_key);
        let server_params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
                .expect("params");
        let server_key = KeyPair::generate().expect("a server key");
        let server_pem = server_params
            .signed_by(&server_key, &issuer)
            .expect("a server certificate")
            .pem();
        for (file, text) in [
            ("ca.crt", ca_pem.as_str()),
            ("server.crt", server_pem.as_str()),
            ("server.key", server_key.serialize_pem().as_str()),
        ] {
            std::fs::write(dir.join(file), text).expect("writing a PEM file");
        }
        Self { dir, ca_pem }
    }

    fn file(&self, name: &str) -> String {
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

#[tokio::test]
async fn rediss_with_the_servers_ca_decides_and_a_wrong_ca_fails_through_the_failure_policy() {
    let pki = Pki::new("server");
    let tls_port = free_port().to_string();
    let server = RedisServer::start_with(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &pki.file("server.crt"),
        "--tls-key-file",
        &pki.file("server.key"),
        "--tls-ca-cert-file",
        &pki.file("ca.crt"),
        "--tls-auth-clients",
        "no",
    ]);
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let p = policy(Algorithm::Gcra, 2, 60_000, None);

    let trusted = RedisBackend::builder(&url)
        .tls_root_ca(pki.ca_pem.as_bytes())
        .budget(Duration::from_secs(5))
        .build()
        .expect("valid");
    let limiter = Limiter::new(trusted);
    let mut allowed = Vec::new();
    for _ in 0..3 {
        let decision = limiter
            .check(&alone(&p), "over-tls")
            .await
            .expect("decided over TLS")[0]
            .clone();
        assert_eq!(decision.reason, Reason::Redis);
        allowed.push(decision.allowed);
    }
    assert_eq!(allowed, [true, true, false]);
    // The state is on that server, seen through its plain port.
    let exists: bool = redis::cmd("EXISTS")
        .arg(limiter.keys().key(&p, "over-tls"))
        .query(&mut server.connection())
        .expect("EXISTS");
    assert!(exists);

    // A CA that did not sign the server's certificate: the failure policy answers, and the
    // error says why.
    let stranger = Pki::new("stranger");
    let untrusted = RedisBackend::builder(&url)
        .tls_root_ca(stranger.ca_pem.as_bytes())
        .budget(Duration::from_secs(5))
        .build()
        .expect("valid");
    let guard = GuardedLimiter::builder(Limiter::new(untrusted), p)
        .failure(FailurePolicy::Closed)
        .budget(Duration::from_secs(5))
        .build();
    let decisions = guard.check("over-tls").await;
    assert!(!decisions.allowed());
    assert_eq!(decisions[0].reason, Reason::FailClosed);
    let error = decisions.error().expect("the TLS error").to_string();
    assert!(
        error.to_lowercase().contains("certificate"),
        "the error names the certificate: {error}"
    );
}
