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
    assert_eq!(
        statuses_with(&router, "x-api-key", "partner", 3).await,
        [200; 3],
        "unlimited"
    );
    assert_eq!(
        statuses_with(&router, "x-api-key", "stolen", 3).await,
        [403; 3],
        "denied"
    );
    assert_eq!(
        statuses_with(&router, "x-api-key", "someone", 2).await,
        [200, 429],
        "everyone else is limited"
    );
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
    let gold = statuses_with(&router, "x-plan", "gold", 4).await;
    assert_eq!(gold, [200, 200, 200, 429]);
    let basic = statuses_with(&router, "x-plan", "basic", 2).await;
    assert_eq!(
        basic,
        [200, 429],
        "an unknown plan gets the route's own limit"
    );
}

/// A tier of a delay route waits for its slot as the route's own clients do, by its own numbers.
#[tokio::test]
async fn a_tier_of_a_delay_route_waits_too() {
    let text = "tier_header = \"x-plan\"\n[[route]]\npath = \"/api\"\nalgorithm = \"gcra\"\nlimit = 1\nwindow = \"1h\"\nkey = \"global\"\nmode = \"delay\"\nmax_delay = \"1s\"\nlimits = { gold = { limit = 36000 } }\n";
    let router = app(&Config::parse(text).expect("valid")).expect("a router");
    // Gold: one every 100 ms, a burst of 1; the second request waits its 100 ms, then passes.
    let gold = statuses_with(&router, "x-plan", "gold", 2).await;
    assert_eq!(
        gold,
        [200, 200],
        "the second gold request waited for its slot"
    );
    // The route's own: one an hour, so the next slot is past max_delay.
    let basic = statuses_with(&router, "x-plan", "basic", 2).await;
    assert_eq!(basic, [200, 429]);
}

#[tokio::test]
async fn a_login_route_counts_only_failed_logins() {
    let text = "[[route]]\npath = \"/api\"\nalgorithm = \"sliding_window_log\"\nlimit = 3\nwindow = \"15m\"\nkey = \"global\"\nhandler = \"login\"\ncount = \"failures\"\n";
    let router = app(&Config::parse(text).expect("valid")).expect("a router");
    let right = statuses_with(&router, "x-password", "demo", 10).await;
    assert_eq!(right, [200; 10], "successes do not count");
    let wrong = statuses_with(&router, "x-password", "guess", 4).await;
    assert_eq!(wrong, [401, 401, 401, 429]);
    let locked = statuses_with(&router, "x-password", "demo", 1).await;
    assert_eq!(locked, [429], "three failures used the limit");
    let delayed = text
        .replace("sliding_window_log", "gcra")
        .replace("count =", "mode = \"delay\"\nmax_delay = \"1s\"\ncount =");
    let error = Config::parse(&delayed).expect_err("refused");
    assert!(error.to_string().contains("count"), "{error}");
}

/// The statuses of `times` GETs of `/api` with header `name: value`.
async fn statuses_with(router: &Router, name: &str, value: &str, times: usize) -> Vec<u16> {
    let mut statuses = Vec::new();
    for _ in 0..times {
        let request = Request::get("/api")
            .header(name, value)
            .body(Body::empty())
            .expect("request");
        let response = router.clone().oneshot(request).await.expect("infallible");
        statuses.push(response.status().as_u16());
    }
    statuses
}

/// A route keyed by a header answers a request without it 400, naming the header, unless the
/// route opts into a shared anonymous bucket.
#[tokio::test]
async fn a_missing_key_header_is_refused_unless_the_route_shares_an_anonymous_bucket() {
    let route = |extra: &str| {
        format!(
            "[[route]]\npath = \"/api\"\nalgorithm = \"gcra\"\nlimit = 1\nwindow = \"1h\"\n\
             key = \"header:x-api-key\"\n{extra}"
        )
    };
    let refusing = app(&Config::parse(&route("")).expect("valid")).expect("a router");
    for _ in 0..2 {
        let response = refusing
            .clone()
            .oneshot(Request::get("/api").body(Body::empty()).expect("request"))
            .await
            .expect("infallible");
        assert_eq!(response.status(), 400);
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .expect("a body");
        let body = String::from_utf8_lossy(&body);
        assert!(body.contains("header x-api-key"), "{body}");
    }
    let sharing = route("anonymous = \"anonymous\"\n");
    let sharing = app(&Config::parse(&sharing).expect("valid")).expect("a router");
    assert_eq!(status(&sharing, Method::GET, "/api").await, 200);
    assert_eq!(
        status(&sharing, Method::GET, "/api").await,
        429,
        "one bucket"
    );

    let misplaced = "[[route]]\npath = \"/api\"\nalgorithm = \"gcra\"\nlimit = 1\nwindow = \"1h\"\n\
                     anonymous = \"anonymous\"\n";
    let error = Config::parse(misplaced).expect_err("only for a header key");
    assert!(error.to_string().contains("anonymous"), "{error}");
}

/// A route per IP with an `also` limit per API key (`key` in `[[route.also]]`): one check, so a
/// key's denied request spends none of its IP's quota, and both limits in the headers.
#[tokio::test]
async fn an_also_limit_with_a_key_of_its_own_is_checked_with_the_routes() {
    let text = "[[route]]\npath = \"/api\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1h\"\n\
                key = \"header:x-ip\"\n[[route.also]]\nname = \"per-key\"\nalgorithm = \"fixed_window\"\n\
                limit = 3\nwindow = \"1h\"\nkey = \"header:x-api-key\"\n";
    let router = app(&Config::parse(text).expect("valid")).expect("a router");
    let send = async |key: &str| {
        let request = Request::get("/api")
            .header("x-ip", "10.0.0.1")
            .header("x-api-key", key)
            .body(Body::empty())
            .expect("request");
        router.clone().oneshot(request).await.expect("infallible")
    };
    for _ in 0..3 {
        assert_eq!(send("k1").await.status(), 200);
    }
    let denied = send("k1").await;
    assert_eq!(denied.status(), 429);
    let state = denied.headers()["ratelimit"]
        .to_str()
        .expect("text")
        .to_owned();
    assert!(
        state.contains(";r=2;") && state.contains("\"per-key\";r=0;"),
        "{state}"
    );
    let other = send("k2").await;
    assert_eq!(other.status(), 200, "another key of the IP");
    let state = other.headers()["ratelimit"]
        .to_str()
        .expect("text")
        .to_owned();
    assert!(
        state.contains(";r=1;") && state.contains("\"per-key\";r=2;"),
        "{state}"
    );

    let unknown = text.replace("key = \"header:x-api-key\"", "key = \"cookie\"");
    let error = Config::parse(&unknown).expect_err("not a key");
    assert!(error.to_string().contains("key"), "{error}");
}
