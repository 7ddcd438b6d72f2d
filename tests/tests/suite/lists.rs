//! Allow and deny lists: decided before any limit, with no Redis command.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use axum::{Router, routing::get};
use redlimit::{Algorithm, GuardedLimiter, Limiter, MemoryBackend};
use redlimit_tests::{RedisServer, command_calls, commands_sent, http_get, serve};
use tower_redlimit::{AccessList, HeaderKey, RateLimitLayer};

use crate::{
    observability::{recorded, value, values},
    support::policy,
};

/// An app limited to 5 an hour whose handler counts its calls.
async fn app(layer: RateLimitLayer, calls: &Arc<AtomicUsize>) -> std::net::SocketAddr {
    let calls = Arc::clone(calls);
    let handler = move || {
        let calls = Arc::clone(&calls);
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            "ok"
        }
    };
    serve(Router::new().route("/", get(handler)).layer(layer)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_network_sends_1000_requests_with_no_redis_command() {
    let server = RedisServer::start();
    let guard = GuardedLimiter::builder(
        server.limiter(),
        policy(Algorithm::Gcra, 5, 3_600_000, None),
    )
    .budget(crate::support::PATIENT)
    .build();
    let layer = RateLimitLayer::new(guard)
        .allow(AccessList::new(["127.0.0.0/8", "key:unused"]).expect("a valid list"));
    let calls = Arc::new(AtomicUsize::new(0));
    let address = app(layer, &calls).await;
    let before = command_calls(&mut server.connection());
    let mut requests = tokio::task::JoinSet::new();
    for _ in 0..8 {
        requests.spawn(async move {
            for _ in 0..125 {
                let response = http_get(address, "/", &[]).await;
                assert_eq!(response.status, 200, "{response:?}");
                assert!(
                    response.header("ratelimit").is_none(),
                    "no quota was checked"
                );
            }
        });
    }
    while let Some(done) = requests.join_next().await {
        done.expect("a request task");
    }
    let sent = commands_sent(&before, &command_calls(&mut server.connection()));
    assert_eq!(calls.load(Ordering::SeqCst), 1_000);
    assert_eq!(sent.commands, 0, "1,000 allowed requests, no Redis command");

    let memory = MemoryBackend::default();
    let guard = GuardedLimiter::builder(
        Limiter::new(memory.clone()),
        policy(Algorithm::Gcra, 5, 3_600_000, None),
    )
    .build();
    let layer = RateLimitLayer::new(guard).allow(AccessList::new(["127.0.0.1"]).expect("valid"));
    let address = app(layer, &calls).await;
    for _ in 0..20 {
        assert_eq!(http_get(address, "/", &[]).await.status, 200);
    }
    assert!(memory.is_empty(), "no state kept for an allowed client");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_key_gets_403_with_no_redis_command_and_no_service_call() {
    let server = RedisServer::start();
    // The layer counts the lists: built under the recorder.
    let (layer, snapshotter) = recorded(|| {
        let limit = policy(Algorithm::Gcra, 5, 3_600_000, None);
        RateLimitLayer::new(
            GuardedLimiter::builder(server.limiter(), limit)
                .budget(crate::support::PATIENT)
                .build(),
        )
        .key(HeaderKey::new("x-api-key").expect("a header"))
        .deny(AccessList::new(["key:stolen", "192.0.2.0/24"]).expect("a valid list"))
    });
    let calls = Arc::new(AtomicUsize::new(0));
    let address = app(layer, &calls).await;
    // The first check connects and loads the script: not what is measured.
    let warm = http_get(address, "/", &[("x-api-key", "warm")]).await;
    assert_eq!(warm.status, 200);
    calls.store(0, Ordering::SeqCst);
    let before = command_calls(&mut server.connection());
    for _ in 0..3 {
        let denied = http_get(address, "/", &[("x-api-key", "stolen")]).await;
        assert_eq!(denied.status, 403, "{denied:?}");
    }
    let sent = commands_sent(&before, &command_calls(&mut server.connection()));
    assert_eq!((sent.commands, calls.load(Ordering::SeqCst)), (0, 0));
    let fine = http_get(address, "/", &[("x-api-key", "good")]).await;
    assert_eq!(fine.status, 200, "{fine:?}");
    let sent = commands_sent(&before, &command_calls(&mut server.connection()));
    assert_eq!((sent.commands, calls.load(Ordering::SeqCst)), (1, 1));
    let all = values(&snapshotter);
    let listed = |list: &str| {
        value(
            &all,
            "redlimit_listed_total",
            &[("policy", "gcra"), ("list", list)],
        )
    };
    assert_eq!((listed("deny"), listed("allow")), (3.0, 0.0));
    assert!(AccessList::new(["not a network"]).is_err());
}
