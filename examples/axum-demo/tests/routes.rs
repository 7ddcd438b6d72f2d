//! The demo's router as a client meets it: budgets per route, 405 free of charge.

use axum::{
    Router,
    body::Body,
    http::{Method, Request},
};
use axum_demo::{Config, app};
use tower::ServiceExt;

fn router(routes: &[&str]) -> Router {
    let text: String = routes
        .iter()
        .map(|path| {
            format!("[[route]]\npath = \"{path}\"\nalgorithm = \"fixed_window_anchored\"\nlimit = 1\nwindow = \"1h30m\"\nkey = \"global\"\n")
        })
        .collect();
    app(&Config::parse(&text).expect("valid")).expect("a router")
}

async fn status(router: &Router, method: Method, path: &str) -> u16 {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .body(Body::empty())
        .expect("request");
    let response = router.clone().oneshot(request).await.expect("infallible");
    response.status().as_u16()
}

#[tokio::test]
async fn paths_that_differ_only_in_punctuation_keep_separate_budgets() {
    let router = router(&["/a/b", "/a-b", "/a.b"]);
    for path in ["/a/b", "/a-b", "/a.b"] {
        assert_eq!(status(&router, Method::GET, path).await, 200, "{path}");
    }
    for path in ["/a/b", "/a-b", "/a.b"] {
        assert_eq!(status(&router, Method::GET, path).await, 429, "{path}");
    }
}

#[tokio::test]
async fn a_method_not_allowed_consumes_nothing() {
    let router = router(&["/only"]);
    for _ in 0..3 {
        assert_eq!(status(&router, Method::POST, "/only").await, 405);
    }
    assert_eq!(
        status(&router, Method::GET, "/only").await,
        200,
        "the whole limit is left"
    );
    assert_eq!(status(&router, Method::GET, "/only").await, 429);
}

#[tokio::test]
async fn listed_keys_are_served_unlimited_or_turned_away() {
    let text = "deny = [\"key:stolen\"]\n[[route]]\npath = \"/api\"\nalgorithm = \"gcra\"\nlimit = 1\nwindow = \"1h\"\nkey = \"header:x-api-key\"\nallow = [\"key:partner\"]\n";
    let router = app(&Config::parse(text).expect("valid")).expect("a router");
    let with_key = |key: &'static str| {
        let router = router.clone();
        async move {
            let request = Request::get("/api")
                .header("x-api-key", key)
                .body(Body::empty())
                .expect("request");
            router
                .oneshot(request)
                .await
                .expect("infallible")
                .status()
                .as_u16()
        }
    };
    for _ in 0..3 {
        assert_eq!(with_key("partner").await, 200, "allowed: unlimited");
        assert_eq!(with_key("stolen").await, 403, "denied everywhere");
    }
    assert_eq!(with_key("someone").await, 200);
    assert_eq!(with_key("someone").await, 429, "everyone else is limited");
}

#[tokio::test]
async fn methods_limits_only_those_and_handlers_can_answer_a_status() {
    let text = "[[route]]\npath = \"/login\"\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1h\"\nkey = \"global\"\nmethods = [\"post\"]\nhandler = \"status:401\"\n";
    let router = app(&Config::parse(text).expect("valid")).expect("a router");
    assert_eq!(status(&router, Method::POST, "/login").await, 401);
    assert_eq!(status(&router, Method::POST, "/login").await, 429);
    for method in [Method::GET, Method::PUT, Method::DELETE] {
        for _ in 0..3 {
            assert_eq!(
                status(&router, method.clone(), "/login").await,
                401,
                "{method} is not limited"
            );
        }
    }
}

#[tokio::test]
async fn a_route_can_fail_closed_while_the_others_fail_open() {
    // Nothing listens on port 1: every check fails at once.
    let text = "redis_url = \"redis://127.0.0.1:1\"\nbudget = \"2s\"\n[[route]]\npath = \"/login\"\nalgorithm = \"gcra\"\nlimit = 5\nwindow = \"1m\"\nkey = \"global\"\nfailure = \"closed\"\n[[route]]\npath = \"/browse\"\nalgorithm = \"gcra\"\nlimit = 5\nwindow = \"1m\"\nkey = \"global\"\n";
    let router = app(&Config::parse(text).expect("valid")).expect("a router");
    assert_eq!(status(&router, Method::GET, "/login").await, 503);
    assert_eq!(status(&router, Method::GET, "/browse").await, 200);
}

#[tokio::test]
async fn a_gateway_header_can_name_the_tier() {
    let text = "tier_header = \"x-plan\"\n[[route]]\npath = \"/api\"\nalgorithm = \"gcra\"\nlimit = 1\nwindow = \"1h\"\nkey = \"global\"\nlimits = { gold = { limit = 3 } }\n";
    let router = app(&Config::parse(text).expect("valid")).expect("a router");
    let with_plan = |plan: &'static str| {
        let router = router.clone();
        async move {
            let request = Request::get("/api")
                .header("x-plan", plan)
                .body(Body::empty())
                .expect("request");
            router
                .oneshot(request)
                .await
                .expect("infallible")
                .status()
                .as_u16()
        }
    };
    let gold: Vec<u16> = futures_statuses(&with_plan, "gold", 4).await;
    assert_eq!(gold, [200, 200, 200, 429]);
    let basic: Vec<u16> = futures_statuses(&with_plan, "basic", 2).await;
    assert_eq!(
        basic,
        [200, 429],
        "an unknown plan gets the route's own limit"
    );
}

async fn futures_statuses<F, Fut>(send: &F, plan: &'static str, times: usize) -> Vec<u16>
where
    F: Fn(&'static str) -> Fut,
    Fut: std::future::Future<Output = u16>,
{
    let mut statuses = Vec::new();
    for _ in 0..times {
        statuses.push(send(plan).await);
    }
    statuses
}
