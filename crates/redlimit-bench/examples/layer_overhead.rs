//! The layer's own CPU cost, without a network: an axum hello-world called in process, bare and
//! behind the layer on the memory backend. `cargo run --release -p redlimit-bench --example
//! layer_overhead` prints nanoseconds per request for each.

use redlimit::GuardedLimiter;
use std::{
    convert::Infallible,
    time::{Duration, Instant},
};

use axum::{Router, body::Body, extract::Request, response::Response, routing::get};
use redlimit::{Algorithm, Limiter, MemoryBackend, Policy};
use tower::{Layer, Service, ServiceExt};
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
    });
}

/// Calls `app` as `axum::serve` does, once per request on a clone, and prints the mean time.
async fn measure<S>(name: &str, app: S)
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone,
{
    let started = Instant::now();
    for i in 0..REQUESTS {
        let request = http::Request::get("/")
            .header("x-client", format!("client-{}", i % CLIENTS))
            .body(Body::empty())
            .expect("a request");
        let response = app.clone().oneshot(request).await.expect("infallible");
        assert_eq!(response.status(), 200);
    }
    let per_request = started.elapsed().as_nanos() / u128::from(REQUESTS);
    println!("{name:<22} {per_request:>6} ns/request");
}
