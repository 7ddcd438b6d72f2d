//! Denials for any response body: plain hyper-style services, boxed bodies, and tower-http's
//! compression on either side of the layer.

mod support;

use redlimit::GuardedLimiter;
use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body::Body;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use redlimit::{Limiter, MemoryBackend};
use tower::{ServiceBuilder, ServiceExt, service_fn};
use tower_http::compression::CompressionLayer;
use tower_redlimit::{Global, RateLimitLayer};

fn layer() -> RateLimitLayer {
    RateLimitLayer::new(
        GuardedLimiter::builder(Limiter::new(MemoryBackend::default()), support::policy(1)).build(),
    )
    .key(Global)
}

fn request() -> Request<Full<Bytes>> {
    Request::get("/")
        .header(header::ACCEPT_ENCODING, "gzip")
        .body(Full::new(Bytes::new()))
        .expect("request")
}

/// Two requests through `service`: the second must be a 429 with the limit headers, and with
/// the denial's text when the body type is one the limiter writes (`text`).
async fn second_is_denied<S, B>(service: S, text: bool)
where
    S: tower::Service<Request<Full<Bytes>>, Response = Response<B>, Error = Infallible> + Clone,
    B: Body,
    B::Error: std::fmt::Debug,
{
    let first = service.clone().oneshot(request()).await.expect("served");
    assert_eq!(first.status(), StatusCode::OK);
    assert!(first.headers().contains_key("ratelimit"));
    let second = service.oneshot(request()).await.expect("answered");
    support::assert_denied(&second);
    let body = second
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    // Compressed when the layer is inside compression: only its presence is compared.
    assert_eq!(!body.is_empty(), text, "{body:?}");
}

fn full() -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
+ Send {
    service_fn(|_: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"hello"))))
    })
}

#[tokio::test]
async fn a_service_with_full_bytes() {
    second_is_denied(ServiceBuilder::new().layer(layer()).service(full()), true).await;
}

#[tokio::test]
async fn a_service_with_a_boxed_body() {
    let boxed = service_fn(|_: Request<Full<Bytes>>| async {
        let body: BoxBody<Bytes, Infallible> = Full::new(Bytes::from_static(b"hi")).boxed();
        Ok::<_, Infallible>(Response::new(body))
    });
    // A boxed body is one the limiter cannot write into: the denial's body is empty, and its
    // status and headers say it all.
    second_is_denied(ServiceBuilder::new().layer(layer()).service(boxed), false).await;
}

#[tokio::test]
async fn a_service_with_string_bodies() {
    let text = service_fn(|_: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(String::from("hi")))
    });
    second_is_denied(ServiceBuilder::new().layer(layer()).service(text), true).await;
}

#[tokio::test]
async fn outside_compression() {
    let service = ServiceBuilder::new()
        .layer(layer())
        .layer(CompressionLayer::new())
        .service(full());
    // Compression's body type is not one the limiter knows: headers and status only.
    second_is_denied(service, false).await;
}

#[tokio::test]
async fn inside_compression() {
    let service = ServiceBuilder::new()
        .layer(CompressionLayer::new())
        .layer(layer())
        .service(full());
    second_is_denied(service, true).await;
}

#[tokio::test]
async fn served_by_hyper() {
    use hyper::service::Service as _;
    let service = hyper_util::service::TowerToHyperService::new(
        ServiceBuilder::new().layer(layer()).service(full()),
    );
    assert_eq!(
        service.call(request()).await.expect("served").status(),
        StatusCode::OK
    );
    let denied = service.call(request()).await.expect("answered");
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
}
