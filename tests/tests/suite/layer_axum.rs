//! The layer fits axum everywhere a tower layer goes: the whole router, matched routes only, one
//! handler.

use std::time::Duration;

use axum::{Router, body::Body, handler::Handler, http::Request, routing::get};
use redlimit::{Algorithm, Limiter, MemoryBackend, Policy};
use tower::ServiceExt;
use tower_redlimit::{Global, MatchedRoute, RateLimitLayer};

fn layer() -> RateLimitLayer {
    let p = Policy::builder("p", Algorithm::FixedWindow)
        .limit(1)
        .window(Duration::from_secs(60))
        .build()
        .expect("valid");
    RateLimitLayer::new(Limiter::new(MemoryBackend::default()), [p])
        .expect("layer")
        .key(Global)
}

async fn statuses(app: Router, paths: &[&str]) -> Vec<u16> {
    let mut out = Vec::new();
    for path in paths {
        let request = Request::get(*path).body(Body::empty()).expect("request");
        out.push(
            app.clone()
                .oneshot(request)
                .await
                .expect("infallible")
                .status()
                .as_u16(),
        );
    }
    out
}

async fn ok() -> &'static str {
    "ok"
}

#[tokio::test]
async fn on_the_router_on_routes_and_on_one_handler() {
    let whole = Router::new()
        .route("/a", get(ok))
        .route("/b", get(ok))
        .layer(layer());
    assert_eq!(
        statuses(whole, &["/a", "/b", "/missing"]).await,
        [200, 429, 429]
    );

    let routed = Router::new().route("/a", get(ok)).route_layer(layer());
    assert_eq!(
        statuses(routed, &["/a", "/a", "/missing"]).await,
        [200, 429, 404]
    );

    let one = Router::new()
        .route("/a", get(ok.layer(layer())))
        .route("/b", get(ok));
    assert_eq!(
        statuses(one, &["/a", "/a", "/b", "/b"]).await,
        [200, 429, 200, 200]
    );

    // Per-route keys need the route: route_layer sees it.
    let per_route = Router::new()
        .route("/a", get(ok))
        .route("/b", get(ok))
        .route_layer(layer().key(MatchedRoute));
    assert_eq!(
        statuses(per_route, &["/a", "/b", "/a"]).await,
        [200, 200, 429]
    );
}
