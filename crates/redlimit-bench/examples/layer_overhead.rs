//! The layer's own CPU cost, without a network: an axum hello-world called in process, bare and
//! behind the layer on the memory backend. `cargo run --release -p redlimit-bench --example
//! layer_overhead` prints nanoseconds per request for each.

use std::time::{Duration, Instant};

use axum::{Router, body::Body, routing::get};
use redlimit::{Algorithm, Limiter, MemoryBackend, Policy};
use tower::ServiceExt;
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
        let bare = Router::new().route("/", get(|| async { "hello" }));
        let layered = |style| {
            let layer =
                RateLimitLayer::new(Limiter::new(MemoryBackend::default()), [policy.clone()])
                    .expect("a valid layer")
                    .key(HeaderKey::new("x-client").expect("a valid header"))
                    .headers(style);
            bare.clone().layer(layer)
        };
        let apps = [
            ("bare", bare.clone()),
            ("layer, no headers", layered(HeaderStyle::None)),
            ("layer, IETF headers", layered(HeaderStyle::Ietf)),
        ];
        for (name, app) in apps {
            // As `axum::serve` does: state resolved once, not per request.
            let app: Router = app.with_state(());
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
    });
}
