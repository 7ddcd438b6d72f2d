use std::{
    sync::Arc,
    task::{Context, Poll},
};

use http::{Request, Response, header};
use tower_service::Service;

use crate::{RateLimitLayer, RejectionBody, future::ResponseFuture};

/// A service limited by a [`RateLimitLayer`].
#[derive(Debug, Clone)]
pub struct RateLimit<S> {
    inner: S,
    layer: Arc<RateLimitLayer>,
}

impl<S> RateLimit<S> {
    pub(crate) fn new(inner: S, layer: Arc<RateLimitLayer>) -> Self {
        Self { inner, layer }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    ResBody: RejectionBody,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (parts, body) = request.into_parts();
        let key = match self.layer.key_of(&parts) {
            Ok(Some(key)) => key,
            // Unlimited: the service that is ready takes it now.
            Ok(None) => {
                return ResponseFuture::pass(self.inner.call(Request::from_parts(parts, body)));
            }
            Err(status) => {
                return ResponseFuture::ready(RateLimitLayer::missing_key_response(status));
            }
        };
        let cost = self.layer.cost_of(&parts);
        let grpc = parts
            .headers
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
        let request = Request::from_parts(parts, body);
        // Memory and locally blocked clients are decided at once: the ready service is called
        // (or not) now, with no clone and no boxed future.
        if let Some(checked) = self.layer.guard.check_now(&key, cost) {
            return ResponseFuture::decided(checked, &mut self.inner, request, grpc, &self.layer);
        }
        // The call waits for Redis. The clone may not be ready: keep the one that is for the
        // future, leave the clone in its place.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let layer = Arc::clone(&self.layer);
        let check = Box::pin(async move { layer.guard.check(&key, cost).await });
        ResponseFuture::checking(check, inner, request, grpc, Arc::clone(&self.layer))
    }
}
