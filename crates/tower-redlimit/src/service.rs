use std::{
    sync::Arc,
    task::{Context, Poll},
};

use http::{Request, Response};
use tower_service::Service;

use crate::{
    future::ResponseFuture,
    runtime::{Admit, Runtime},
};

/// A service limited by a [`RateLimitLayer`](crate::RateLimitLayer). (Not to be confused with
/// the `RateLimit` response header, which [`HeaderStyle`](crate::HeaderStyle) controls.)
///
/// Its responses keep the wrapped service's own type, untouched on the way through: no wrapper
/// body, no boxing, so it serves wherever the service did (`axum::serve`, tonic, hyper). The
/// body type needs only a `Default`; the limiter's denials are written in it (see
/// [`RateLimitLayer::rejection`](crate::RateLimitLayer::rejection)).
///
/// ```
/// use std::{convert::Infallible, time::Duration};
/// use http::{Request, Response, StatusCode};
/// use redlimit::{Algorithm, GuardedLimiter, Limiter, MemoryBackend, Policy};
/// use tower::{Layer, ServiceExt, service_fn};
/// use tower_redlimit::{Global, RateLimitLayer};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let policy = Policy::builder("p", Algorithm::FixedWindow)
///     .limit(1)
///     .window(Duration::from_secs(60))
///     .build()?;
/// let layer = RateLimitLayer::new(GuardedLimiter::builder(Limiter::new(MemoryBackend::default()), policy).build())
///     .key(Global);
/// let service = layer.layer(service_fn(|_: Request<()>| async {
///     Ok::<_, Infallible>(Response::new(String::from("hello")))
/// }));
/// let first = service.clone().oneshot(Request::new(())).await?;
/// assert_eq!(first.status(), StatusCode::OK);
/// let second = service.oneshot(Request::new(())).await?;
/// assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    runtime: Arc<Runtime>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S> RateLimit<S> {
    pub(crate) fn new(inner: S, runtime: Arc<Runtime>) -> Self {
        Self { inner, runtime }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The wrapped service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    ResBody: Default + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (parts, body) = request.into_parts();
        let (admission, tier) = match self.runtime.admit(&parts) {
            Admit::Pass => {
                let request = Request::from_parts(parts, body);
                return ResponseFuture::pass(self.inner.call(request));
            }
            Admit::Answer(response) => return ResponseFuture::ready(response),
            Admit::Check(admission, tier) => (admission, tier),
        };
        let request = Request::from_parts(parts, body);
        match admission.into_ready() {
            // Memory, a local block, an open circuit: the ready service is called (or not) now,
            // with no clone and no future kept.
            Ok(decisions) => ResponseFuture::decided(decisions, &mut self.inner, request, tier),
            Err(waiting) => {
                // The call waits for Redis. The clone may not be ready: keep the one that is
                // for the future, leave the clone in its place.
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::admitting(waiting, ready, request, Arc::clone(tier))
            }
        }
    }
}
