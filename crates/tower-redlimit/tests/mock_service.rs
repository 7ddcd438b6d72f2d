//! The layer's own logic against a mock inner service: no Redis needed.

mod support;

use support::policy;

use std::{convert::Infallible, future::Future, task::Poll, time::Duration};

use http::{Request, Response, StatusCode};
use redlimit::{FailurePolicy, GuardedLimiter, Limiter, MemoryBackend, Reason, RedisBackend};
use tower::{Layer, Service};
use tower_redlimit::{Global, HeaderKey, RateLimit, RateLimitLayer};
use tower_test::mock;

type Mock = mock::Mock<Request<()>, Response<String>>;
type Handle = mock::Handle<Request<()>, Response<String>>;

fn limited(layer: RateLimitLayer) -> (RateLimit<Mock>, Handle) {
    let (service, handle) = mock::pair();
    (layer.key(Global).layer(service), handle)
}

fn in_memory(limit: u64) -> RateLimitLayer {
    RateLimitLayer::new(
        GuardedLimiter::builder(Limiter::new(MemoryBackend::default()), policy(limit)).build(),
    )
}

/// A guard whose checks wait for a Redis that refuses connections (a closed loopback port), so
/// they take the waiting path and end with the failure policy: fail open.
fn waiting() -> RateLimitLayer {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let redis = RedisBackend::builder(format!("redis://{closed}"))
        .budget(Duration::from_secs(5))
        .build()
        .expect("valid");
    let guard = GuardedLimiter::builder(Limiter::new(redis), policy(10))
        .failure(FailurePolicy::Open)
        .budget(Duration::from_secs(5))
        .build();
    RateLimitLayer::new(guard)
}

fn poll_ready(
    service: &mut RateLimit<Mock>,
) -> Poll<Result<(), Box<dyn std::error::Error + Send + Sync>>> {
    let waker = std::task::Waker::noop();
    service.poll_ready(&mut std::task::Context::from_waker(waker))
}

async fn answer(handle: &mut Handle, body: &str) -> Request<()> {
    let (request, respond) = handle.next_request().await.expect("the service was called");
    respond.send_response(Response::new(body.to_owned()));
    request
}

fn body(response: Response<String>) -> String {
    response.into_body()
}

#[tokio::test]
async fn readiness_is_the_inner_services() {
    let (mut service, mut handle) = limited(in_memory(10));
    handle.allow(0);
    assert!(
        poll_ready(&mut service).is_pending(),
        "not ready while the inner one is not"
    );
    handle.allow(1);
    assert!(poll_ready(&mut service).is_ready());
    handle.send_error("broken");
    assert!(
        matches!(poll_ready(&mut service), Poll::Ready(Err(_))),
        "its errors too"
    );
}

#[tokio::test]
async fn header_keys_that_are_not_utf8_keep_separate_budgets() {
    let (service, mut handle) = mock::pair();
    let layer = in_memory(1).key(HeaderKey::new("x-api-key").expect("valid"));
    let mut service: RateLimit<Mock> = layer.layer(service);
    // Readiness for every call, the denied one too (the mock counts polls).
    handle.allow(3);
    let mut status = |key: &'static [u8]| {
        let request = Request::builder()
            .header(
                "x-api-key",
                http::HeaderValue::from_bytes(key).expect("valid"),
            )
            .body(())
            .expect("request");
        assert!(poll_ready(&mut service).is_ready());
        service.call(request)
    };
    let (first, second, again) = (status(b"k\xff"), status(b"k\xfe"), status(b"k\xff"));
    answer(&mut handle, "one").await;
    answer(&mut handle, "two").await;
    assert_eq!(first.await.expect("served").status(), StatusCode::OK);
    assert_eq!(second.await.expect("served").status(), StatusCode::OK);
    support::assert_denied(&again.await.expect("answered"));
}

#[tokio::test]
async fn a_denial_does_not_call_the_inner_service() {
    let (mut service, mut handle) = limited(in_memory(1));
    handle.allow(2);
    assert!(poll_ready(&mut service).is_ready());
    let first = service.call(Request::new(()));
    let request = answer(&mut handle, "hello").await;
    let decision = request
        .extensions()
        .get::<redlimit::Decisions>()
        .expect("in the extensions")
        .most_restrictive();
    assert_eq!((decision.reason, decision.remaining), (Reason::Memory, 0));
    let first = first.await.expect("served");
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(first.headers()["ratelimit"], "\"p\";r=0;t=600");
    assert_eq!(body(first), "hello");

    assert!(poll_ready(&mut service).is_ready());
    let second = service.call(Request::new(())).await.expect("answered");
    support::assert_denied(&second);
    assert!(body(second).contains("rate limit p exceeded"));
    assert!(
        futures_ready(handle.next_request()).is_none(),
        "the inner service never saw the denied request"
    );
}

#[tokio::test]
async fn a_waiting_check_calls_the_service_that_was_ready_and_leaves_a_clone() {
    let (mut service, mut handle) = limited(waiting());
    handle.allow(1);
    assert!(poll_ready(&mut service).is_ready());
    // The mock panics when a service is called before it is ready: the future must call the
    // one that was polled ready, not the clone left behind.
    let pending = service.call(Request::new(()));
    let responded = async {
        let request = answer(&mut handle, "ok").await;
        request
            .extensions()
            .get::<redlimit::Decisions>()
            .map(|d| d.most_restrictive().reason)
    };
    let (response, reason) = tokio::join!(pending, responded);
    assert_eq!(response.expect("served").status(), StatusCode::OK);
    assert_eq!(reason, Some(Reason::FailOpen), "Redis refused: fail open");
    handle.allow(0);
    assert!(
        poll_ready(&mut service).is_pending(),
        "the clone left in place must be polled ready on its own"
    );
}

/// The decisions join what the request's extensions already hold (a request without any gets
/// extensions made with room for them): nothing of the caller's is lost.
#[tokio::test]
async fn the_decisions_join_the_requests_own_extensions() {
    #[derive(Clone, Debug, PartialEq)]
    struct Caller(&'static str);
    let (mut service, mut handle) = limited(in_memory(5));
    handle.allow(2);
    let mut own = Request::new(());
    own.extensions_mut().insert(Caller("kept"));
    for (request, caller) in [(own, Some(Caller("kept"))), (Request::new(()), None)] {
        assert!(poll_ready(&mut service).is_ready());
        let pending = service.call(request);
        let seen = answer(&mut handle, "ok").await;
        pending.await.expect("served");
        assert_eq!(seen.extensions().get::<Caller>(), caller.as_ref());
        let decisions = seen.extensions().get::<redlimit::Decisions>();
        assert!(decisions.expect("the decisions").allowed());
        assert_eq!(seen.extensions().len(), 1 + usize::from(caller.is_some()));
    }
}

#[tokio::test]
async fn the_layers_headers_do_not_replace_the_services_own() {
    let layer = in_memory(5);
    let inner = tower::service_fn(|_: Request<()>| async {
        let mut response = Response::new(String::new());
        response
            .headers_mut()
            .insert("ratelimit", "\"inner\";r=1;t=1".parse().expect("valid"));
        Ok::<_, Infallible>(response)
    });
    let mut service = layer.key(Global).layer(inner);
    let response = service.call(Request::new(())).await.expect("served");
    assert_eq!(response.headers()["ratelimit"], "\"inner\";r=1;t=1");
    assert_eq!(response.headers()["ratelimit-policy"], "\"p\";q=5;w=600");
}

/// The output of `future` if it is ready at its first poll.
fn futures_ready<F: Future>(future: F) -> Option<F::Output> {
    let waker = std::task::Waker::noop();
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut std::task::Context::from_waker(waker))
    {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}

/// A request without its key is answered by the layer, never the service: a gRPC one with
/// `INVALID_ARGUMENT` when the client did not send the key, `INTERNAL` when the server did not
/// provide it; a key made of two parts is the client's to send only if each missing part is.
#[tokio::test]
async fn a_missing_key_is_refused_as_its_cause_says_over_grpc_too() {
    let grpc = || {
        Request::builder()
            .header("content-type", "application/grpc")
            .body(())
            .expect("request")
    };
    let status = |response: &Response<String>| {
        response
            .headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let cases: [(RateLimitLayer, &str); 3] = [
        (
            in_memory(10).key(HeaderKey::new("x-api-key").expect("valid")),
            "3",
        ),
        (in_memory(10).key(tower_redlimit::ClientIp::peer()), "13"),
        (
            in_memory(10).key(tower_redlimit::Both(
                tower_redlimit::ClientIp::peer(),
                HeaderKey::new("x-api-key").expect("valid"),
            )),
            "13",
        ),
    ];
    for (layer, code) in cases {
        let (service, mut handle) = mock::pair();
        let mut service: RateLimit<Mock> = layer.layer(service);
        handle.allow(1);
        assert!(poll_ready(&mut service).is_ready());
        let response = service.call(grpc()).await.expect("answered");
        assert_eq!(status(&response).as_deref(), Some(code));
        let message = response.headers()["grpc-message"].to_str().expect("text");
        assert!(message.contains("found nothing"), "{message}");
    }
}

/// A cost only the handler knows settles the reservation from the response's extensions,
/// never shown to the client: 250 of 1,000 reserved, so 750 are given back.
#[tokio::test]
async fn a_cost_in_the_responses_extensions_settles_the_reservation() {
    #[derive(Clone)]
    struct TokensUsed(u64);

    let layer = in_memory(10_000)
        .cost(|_| 1_000)
        .settle(|served| served.extensions.get::<TokensUsed>().map(|used| used.0));
    let (mut service, mut handle) = limited(layer);
    handle.allow(1);
    assert!(poll_ready(&mut service).is_ready());
    let served = service.call(Request::new(()));
    let (_, respond) = handle.next_request().await.expect("called");
    let mut response = Response::new("generated".to_owned());
    response.extensions_mut().insert(TokensUsed(250));
    respond.send_response(response);
    let served = served.await.expect("served");
    assert_eq!(served.status(), StatusCode::OK);
    assert_eq!(
        served.headers()["ratelimit"],
        "\"p\";r=9750;t=600",
        "settled numbers"
    );
    assert!(
        !served.headers().contains_key("x-tokens-used"),
        "the cost stays on the server"
    );
}
