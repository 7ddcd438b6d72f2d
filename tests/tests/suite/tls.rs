//! `rediss://` against a real redis-server with `--tls-port`, certificates made here.

use std::time::Duration;

use deadpool_redis::redis;
use redlimit::{
    Algorithm, FailurePolicy, GuardedLimiter, Limiter, Reason, RedisBackend, RedisBackendBuilder,
};
use redlimit_tests::{Pki, RedisCluster, RedisSentinel};

use crate::support::{alone, policy};

#[tokio::test]
async fn rediss_with_the_servers_ca_decides_and_a_wrong_ca_fails_through_the_failure_policy() {
    let pki = Pki::new("server");
    let (server, url) = pki.start_server(false);
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

/// `builder` trusting `pki`'s authority and presenting its client certificate.
fn mutual(pki: &Pki, builder: RedisBackendBuilder) -> RedisBackend {
    let read = |name: &str| std::fs::read(pki.file(name)).expect("a PEM file");
    builder
        .tls_root_ca(pki.ca_pem.as_bytes())
        .tls_client_certificate(read("client.crt"), read("client.key"))
        .budget(Duration::from_secs(5))
        .build()
        .expect("valid")
}

/// Mutual TLS: a server that asks for a client certificate decides with the one its authority
/// signed, given to the builder.
#[tokio::test]
async fn a_client_certificate_signed_by_the_servers_ca_is_accepted() {
    let pki = Pki::new("mutual");
    let (_server, url) = pki.start_server(true);
    let backend = mutual(&pki, RedisBackend::builder(url));
    let p = policy(Algorithm::Gcra, 2, 60_000, None);
    let decided = Limiter::new(backend).check(&alone(&p), "mutual").await;
    assert_eq!(decided.expect("decided over mutual TLS")[0].remaining, 1);
}

/// A Cluster whose nodes serve TLS with a private CA: checks on keys of every primary decide
/// over TLS given the CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls_with_a_private_ca_decides() {
    let pki = Pki::new("cluster");
    let (_cluster, urls) = RedisCluster::start_tls(&pki);
    let backend = RedisBackend::cluster(urls)
        .tls_root_ca(pki.ca_pem.as_bytes())
        .budget(Duration::from_secs(5))
        .build()
        .expect("valid");
    let limiter = Limiter::new(backend);
    let p = policy(Algorithm::FixedWindow, 2, 60_000, None);
    for i in 0..12 {
        let client = format!("tls-client-{i}");
        let decided = limiter.check(&alone(&p), &client).await;
        assert_eq!(
            decided.expect("decided over TLS")[0].remaining,
            1,
            "{client}"
        );
    }
}

/// A primary that serves TLS only to clients with a certificate of its authority, named by
/// sentinels: decided given the CA and a client certificate, refused without the certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_named_by_sentinels_over_mutual_tls_decides() {
    let pki = Pki::new("sentinel");
    let sentinel = RedisSentinel::start_tls(&pki);
    let backend = mutual(
        &pki,
        RedisBackend::sentinel(sentinel.urls(), RedisSentinel::MASTER),
    );
    let p = policy(Algorithm::Gcra, 2, 60_000, None);
    let limiter = Limiter::new(backend);
    let decided = limiter.check(&alone(&p), "through-sentinel").await;
    assert_eq!(decided.expect("decided over mutual TLS")[0].remaining, 1);
    let key = limiter.keys().key(&p, "through-sentinel");
    let mut primary = sentinel.primary().connection();
    let exists: bool = redis::cmd("EXISTS")
        .arg(&key)
        .query(&mut primary)
        .expect("EXISTS");
    assert!(exists, "the state is on the primary");

    let without = RedisBackend::sentinel(sentinel.urls(), RedisSentinel::MASTER)
        .tls_root_ca(pki.ca_pem.as_bytes())
        .budget(Duration::from_secs(5))
        .build()
        .expect("valid");
    let refused = Limiter::new(without)
        .check(&alone(&p), "through-sentinel")
        .await;
    assert!(refused.is_err(), "no client certificate: {refused:?}");
}
