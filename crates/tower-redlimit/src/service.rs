use std::{
    sync::Arc,
    task::{Context, Poll},
};

use http::{Request, Response};
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
        // Borrowed apart: the key may borrow from the layer while the service is called.
        let Self { inner, layer } = self;
        let (parts, body) = request.into_parts();
        let key = match layer.key_of(&parts) {
            Ok(Some(key)) => key,
            // Unlimited: the service that is ready takes it now.
            Ok(None) => return ResponseFuture::pass(inner.call(Request::from_parts(parts, body))),
            Err(status) => {
                return ResponseFuture::ready(RateLimitLayer::missing_key_response(status));
            }
        };
        let cost = layer.cost_of(&parts);
        // Memory and locally blocked clients are decided at once: the ready service is called
        // (or not) now, with no clone, no boxed future and no copy of the key.
        let key = match layer.guard.check_now(&key, cost) {
            Some(checked) => {
                drop(key);
                let request = Request::from_parts(parts, body);
                return ResponseFuture::decided(checked, inner, request, layer);
            }
            None => key.into_owned(),
        };
        let request = Request::from_parts(parts, body);
        // The call waits for Redis. The clone may not be ready: keep the one that is for the
        // future, leave the clone in its place.
        let clone = inner.clone();
        let ready = std::mem::replace(inner, clone);
        let shared = Arc::clone(layer);
        let check = Box::pin(async move { shared.guard.check(&key, cost).await });
        ResponseFuture::checking(check, ready, request, Arc::clone(layer))
    }
}
