//! The layer's own CPU cost, without a network: an axum hello-world called in process, bare,
//! behind the layer on the memory backend (one key, and two policies under two keys), and behind
//! tower_governor keyed by the same header. `cargo run --release -p redlimit-bench --example
//! layer_overhead [NAME]` prints nanoseconds per request for each (or for those
//! whose name starts with NAME).

#[path = "../src/client_header.rs"]
mod client_header;

use client_header::ClientHeader;
use redlimit::GuardedLimiter;
use std::{
    convert::Infallible,
    time::{Duration, Instant},
};

use axum::{Router, body::Body, extract::Request, response::Response, routing::get};
use redlimit::{Algorithm, Limiter, MemoryBackend, Policy, PolicySet};
use tower::{Layer, Service, ServiceExt};
use tower_governor::{GovernorLayer, governor::GovernorConfigBuilder};
use tower_redlimit::{HeaderKey, HeaderStyle, RateLimitLayer};

const REQUESTS: u32 = 200_000;
const CLIENTS: u32 = 10_000;

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let policy = Policy::builder("p", Algorithm::FixedWindow)
            .limit(1_000_000)
            .window(Duration::from_secs(60))
            .build()
            .expect("a valid policy");
        // As `axum::serve` does: state resolved once, not per request.
        let hello = || {
            Router::new()
                .route("/", get(|| async { "hello" }))
                .with_state(())
        };
        let limit = |style| {
            RateLimitLayer::new(
                GuardedLimiter::builder(Limiter::new(MemoryBackend::default()), policy.clone())
                    .build(),
            )
            .key(HeaderKey::new("x-client").expect("a valid header"))
            .headers(style)
        };
        measure("bare", hello()).await;
        measure("layer, no headers", limit(HeaderStyle::None).layer(hello())).await;
        measure(
            "layer, IETF headers",
            limit(HeaderStyle::Ietf).layer(hello()),
        )
        .await;
        measure(
            "Router::layer, IETF",
            hello().layer(limit(HeaderStyle::Ietf)),
        )
        .await;
        let per_key = Policy::builder("per_key", Algorithm::FixedWindow)
            .limit(1_000_000)
            .window(Duration::from_secs(60))
            .build()
            .expect("a valid policy");
        let two_keys = RateLimitLayer::new(
            GuardedLimiter::builder(
                Limiter::new(MemoryBackend::default()),
                PolicySet::new([policy.clone(), per_key]).expect("a valid set"),
            )
            .build(),
        )
        .key(HeaderKey::new("x-client").expect("a valid header"))
        .key_for("per_key", HeaderKey::new("x-key").expect("a valid header"))
        .expect("a policy of the set");
        measure("layer, two keys, IETF", two_keys.layer(hello())).await;
        let governor = GovernorConfigBuilder::default()
            .per_millisecond(1)
            .burst_size(1_000_000)
            .key_extractor(ClientHeader)
            .use_headers()
            .finish()
            .expect("a valid governor config");
        measure(
            "tower_governor",
            GovernorLayer::new(governor).layer(hello()),
        )
        .await;
    });
}

/// Calls `app` as `axum::serve` does, once per request on a clone, and prints the mean time.
async fn measure<S>(name: &str, app: S)
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone,
{
    // A contender's name as the one argument runs that one alone (for a profiler).
    if std::env::args()
        .nth(1)
        .is_some_and(|only| !name.starts_with(&only))
    {
        return;
    }
    let started = Instant::now();
    for i in 0..REQUESTS {
        let request = http::Request::get("/")
            .header("x-client", format!("client-{}", i % CLIENTS))
            .header("x-key", format!("key-{}", i % CLIENTS))
            .body(Body::empty())
            .expect("a request");
        let response = app.clone().oneshot(request).await.expect("infallible");
        assert_eq!(response.status(), 200);
    }
    let per_request = started.elapsed().as_nanos() / u128::from(REQUESTS);
    println!("{name:<22} {per_request:>6} ns/request");
}
