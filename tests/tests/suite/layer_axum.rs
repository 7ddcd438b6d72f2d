//! The layer fits axum everywhere a tower layer goes: the whole router, matched routes only, one
//! handler.

use redlimit::PolicySet;
use std::time::Duration;

use axum::{Router, body::Body, handler::Handler, http::Request, routing::get};
use redlimit::{Algorithm, GuardedLimiter, Limiter, MemoryBackend, Policy};
use redlimit_tests::TestClock;
use tower::ServiceExt;
use tower_redlimit::{Global, MatchedRoute, RateLimitLayer};

use crate::support::T0;

fn layer() -> RateLimitLayer {
    let p = Policy::builder("p", Algorithm::FixedWindow)
        .limit(1)
        .window(Duration::from_secs(60))
        .build()
        .expect("valid");
    // Windows aligned to the clock: retry waits are exact.
    let guard = GuardedLimiter::builder(Limiter::new(MemoryBackend::default()), p)
        .clock(TestClock::at_millis(T0).clock())
        .build();
    RateLimitLayer::new(guard).key(Global)
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

async fn call(app: &Router, request: Request<Body>) -> axum::response::Response {
    app.clone().oneshot(request).await.expect("infallible")
}

async fn body_text(response: axum::response::Response) -> String {
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
        .await
        .expect("body");
    String::from_utf8(bytes.to_vec()).expect("utf-8")
}

#[tokio::test]
async fn denials_as_problem_json_grpc_status_or_a_custom_response() {
    let problem = Router::new()
        .route("/", get(ok))
        .layer(layer().problem_json(true));
    let _ = call(
        &problem,
        Request::get("/").body(Body::empty()).expect("request"),
    )
    .await;
    let denied = call(
        &problem,
        Request::get("/").body(Body::empty()).expect("request"),
    )
    .await;
    assert_eq!(denied.status(), 429);
    assert_eq!(denied.headers()["content-type"], "application/problem+json");
    assert_eq!(denied.headers()["retry-after"], "60");
    let body = body_text(denied).await;
    assert!(
        body.starts_with(
            "{\"type\":\"about:blank\",\"title\":\"Too Many Requests\",\"status\":429,"
        ),
        "{body}"
    );
    assert!(
        body.ends_with(",\"policy\":\"p\",\"retry_after\":60}"),
        "{body}"
    );

    let grpc = Router::new().route("/", get(ok)).layer(layer());
    let grpc_request = || {
        Request::get("/")
            .header("content-type", "application/grpc+proto")
            .body(Body::empty())
            .expect("request")
    };
    let _ = call(&grpc, grpc_request()).await;
    let denied = call(&grpc, grpc_request()).await;
    assert_eq!(denied.status(), 200, "gRPC carries its status in headers");
    assert_eq!(denied.headers()["grpc-status"], "8");
    assert_eq!(denied.headers()["content-type"], "application/grpc");

    let custom = Router::new()
        .route("/", get(ok))
        .layer(layer().rejection(|rejected| {
            let mut response = axum::http::Response::new(bytes::Bytes::from("slow down"));
            *response.status_mut() = axum::http::StatusCode::SERVICE_UNAVAILABLE;
            assert!(!rejected.decisions[0].allowed);
            response
        }));
    let _ = call(
        &custom,
        Request::get("/").body(Body::empty()).expect("request"),
    )
    .await;
    let denied = call(
        &custom,
        Request::get("/").body(Body::empty()).expect("request"),
    )
    .await;
    assert_eq!(denied.status(), 503);
    assert_eq!(
        denied.headers()["retry-after"],
        "60",
        "added to a custom response"
    );
    assert_eq!(body_text(denied).await, "slow down");
}

#[tokio::test]
async fn requests_without_a_key_follow_the_missing_key_rule() {
    let request = || Request::get("/").body(Body::empty()).expect("request");
    let by_header = || layer().key(tower_redlimit::HeaderKey::new("x-api-key").expect("valid"));

    // The client did not send its key: 400, naming the header, in a denial's format.
    let refuse = Router::new().route("/", get(ok)).layer(by_header());
    let refused = call(&refuse, request()).await;
    assert_eq!(refused.status(), 400);
    assert_eq!(
        body_text(refused).await,
        "no rate-limit key for this request: header x-api-key found nothing\n",
        "the answer names what found nothing"
    );
    let as_problem = Router::new()
        .route("/", get(ok))
        .layer(by_header().problem_json(true));
    let refused = call(&as_problem, request()).await;
    assert_eq!(refused.status(), 400);
    assert_eq!(
        refused.headers()["content-type"],
        "application/problem+json"
    );
    assert_eq!(
        body_text(refused).await,
        "{\"type\":\"about:blank\",\"title\":\"Bad Request\",\"status\":400,\"detail\":\
         \"no rate-limit key for this request: header x-api-key found nothing\"}"
    );
    // The server did not wire the peer address: its own mistake, 500 naming the cause.
    let by_peer = Router::new()
        .route("/", get(ok))
        .layer(layer().key(tower_redlimit::ClientIp::peer()));
    let unwired = call(&by_peer, request()).await;
    assert_eq!(unwired.status(), 500);
    let text = body_text(unwired).await;
    assert!(text.contains("the peer address"), "{text}");
    assert!(
        text.contains("into_make_service_with_connect_info"),
        "{text}"
    );
    // A status of the application's choosing.
    let reject = Router::new()
        .route("/", get(ok))
        .layer(by_header().missing_key(tower_redlimit::MissingKey::Reject(
            axum::http::StatusCode::UNAUTHORIZED,
        )));
    assert_eq!(call(&reject, request()).await.status(), 401);

    let allow = Router::new()
        .route("/", get(ok))
        .layer(by_header().missing_key(tower_redlimit::MissingKey::Allow));
    for _ in 0..3 {
        let response = call(&allow, request()).await;
        assert_eq!(response.status(), 200);
        assert!(response.headers().get("ratelimit").is_none(), "unlimited");
    }

    let shared = Router::new()
        .route("/", get(ok))
        .layer(by_header().missing_key(tower_redlimit::MissingKey::Shared("anonymous".to_owned())));
    assert_eq!(call(&shared, request()).await.status(), 200);
    assert_eq!(
        call(&shared, request()).await.status(),
        429,
        "one bucket for all"
    );
}

#[tokio::test]
async fn the_cost_of_a_request_comes_from_the_cost_closure() {
    let p = Policy::builder("p", Algorithm::FixedWindow)
        .limit(10)
        .window(Duration::from_secs(60))
        .build()
        .expect("valid");
    let guard = GuardedLimiter::builder(Limiter::new(MemoryBackend::default()), p)
        .clock(TestClock::at_millis(T0).clock())
        .build();
    let layer = RateLimitLayer::new(guard)
        .key(Global)
        // Bulk requests cost what they say; everything else costs 1.
        .cost(|parts| {
            parts
                .headers
                .get("x-batch")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        });
    let app = Router::new().route("/", get(ok)).layer(layer);
    let batch = |n: &str| {
        Request::get("/")
            .header("x-batch", n)
            .body(Body::empty())
            .expect("request")
    };
    let remaining =
        |r: &axum::response::Response| r.headers()["ratelimit"].to_str().expect("ascii").to_owned();
    let first = call(&app, batch("7")).await;
    assert_eq!(remaining(&first), "\"p\";r=3;t=60");
    let too_big = call(&app, batch("4")).await;
    assert_eq!(
        too_big.status(),
        429,
        "4 > 3 left: denied, and nothing consumed"
    );
    let peek = call(&app, batch("0")).await;
    assert_eq!(
        (peek.status().as_u16(), remaining(&peek)),
        (200, "\"p\";r=3;t=60".to_owned())
    );
    let never = call(&app, batch("11")).await;
    assert_eq!(never.status(), 429);
    assert!(
        never.headers().get("retry-after").is_none(),
        "no wait makes 11 > limit pass"
    );
}

#[test]
fn layer_configuration_mistakes_are_config_errors() {
    let err = PolicySet::new([]).expect_err("no policy");
    assert_eq!(err.to_string(), "policies is required");
    let p = Policy::builder("p", Algorithm::Gcra)
        .limit(1)
        .window(Duration::from_secs(1))
        .build()
        .expect("valid");
    let err = PolicySet::new([p.clone(), p]).expect_err("twice");
    assert_eq!(err.to_string(), "policies has \"p\" twice");
    assert!(tower_redlimit::ClientIp::behind_proxies(["10.0.0.0/40"]).is_err());
    assert!(tower_redlimit::HeaderKey::new("not a header").is_err());
}

/// A check made in a handler answers as the layer does, with its own policy's headers: an
/// outer layer (100 per minute for everyone) adds its own only where the handler's response
/// has none, so the client sees the handler's numbers, allowed or denied.
#[tokio::test]
async fn a_handler_check_answers_with_its_own_policys_headers() {
    use axum::{extract::State, response::IntoResponse};
    use tower_redlimit::Limited;

    let outer = Policy::builder("everyone", Algorithm::FixedWindow)
        .limit(100)
        .window(Duration::from_secs(60))
        .build()
        .expect("valid");
    let outer = RateLimitLayer::new(
        GuardedLimiter::builder(Limiter::new(MemoryBackend::default()), outer).build(),
    )
    .key(Global);
    let exports = Policy::builder("exports", Algorithm::FixedWindow)
        .limit(1)
        .window(Duration::from_secs(60))
        .build()
        .expect("valid");
    let guard = GuardedLimiter::builder(Limiter::new(MemoryBackend::default()), exports)
        .clock(TestClock::at_millis(T0).clock())
        .build();
    async fn export(State(guard): State<GuardedLimiter>) -> axum::response::Response {
        let limited = Limited::new(guard.policies(), guard.check("acme").await);
        if !limited.allowed() {
            return limited.into_response();
        }
        (limited, "exported").into_response()
    }
    let app = Router::new()
        .route("/export", get(export))
        .with_state(guard)
        .layer(outer);
    let request = || {
        Request::get("/export")
            .body(Body::empty())
            .expect("request")
    };

    let allowed = call(&app, request()).await;
    assert_eq!(allowed.status(), 200);
    assert_eq!(
        allowed.headers()["ratelimit-policy"],
        "\"exports\";q=1;w=60"
    );
    assert_eq!(allowed.headers()["ratelimit"], "\"exports\";r=0;t=60");
    assert_eq!(body_text(allowed).await, "exported");

    let denied = call(&app, request()).await;
    assert_eq!(denied.status(), 429);
    assert_eq!(denied.headers()["ratelimit-policy"], "\"exports\";q=1;w=60");
    assert_eq!(denied.headers()["ratelimit"], "\"exports\";r=0;t=60");
    assert_eq!(denied.headers()["retry-after"], "60");
    assert_eq!(
        body_text(denied).await,
        "rate limit exports exceeded; retry after 60 s\n"
    );
}

/// A key an earlier middleware put in the request's extensions (here an authenticated user):
/// limited per user, and a request the middleware left without one refused with 400.
#[tokio::test]
async fn a_key_from_an_earlier_middlewares_extension() {
    use axum::{extract::Request as AxumRequest, middleware::Next};
    use tower_redlimit::ExtensionKey;

    #[derive(Clone)]
    struct User(String);
    impl std::fmt::Display for User {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0)
        }
    }
    async fn authenticate(mut request: AxumRequest, next: Next) -> axum::response::Response {
        let user = request
            .headers()
            .get("x-user")
            .and_then(|v| v.to_str().ok());
        if let Some(user) = user.map(str::to_owned) {
            request.extensions_mut().insert(User(user));
        }
        next.run(request).await
    }
    let app = Router::new()
        .route("/", get(ok))
        .layer(layer().key(ExtensionKey::<User>::new()))
        .layer(axum::middleware::from_fn(authenticate));
    let as_user = |user: &str| {
        Request::get("/")
            .header("x-user", user)
            .body(Body::empty())
            .expect("request")
    };
    assert_eq!(call(&app, as_user("ann")).await.status(), 200);
    assert_eq!(call(&app, as_user("ann")).await.status(), 429);
    assert_eq!(call(&app, as_user("bob")).await.status(), 200, "per user");
    let anonymous = call(
        &app,
        Request::get("/").body(Body::empty()).expect("request"),
    )
    .await;
    assert_eq!(anonymous.status(), 400);
    let text = body_text(anonymous).await;
    assert!(text.contains("the request extension"), "{text}");
}
