use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, LazyLock},
    task::{Context, Poll, ready},
};

use bytes::Bytes;
use http::{Extensions, Request, Response};
use pin_project_lite::pin_project;
use redlimit::{Check, Decisions};
use tower_service::Service;

use crate::{
    lease_body::hold_lease,
    rejection_body::rejection_body,
    runtime::{Settle, Tier},
    waiting_room::Waiting,
};

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit): the check, then the inner call,
    /// or the limiter's answer, which may be ready at once.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use http::{Request, Response};
    /// use redlimit::{Algorithm, GuardedLimiter, Limiter, MemoryBackend, Policy};
    /// use tower::{Layer, Service, service_fn};
    /// use tower_redlimit::{Global, RateLimitLayer, ResponseFuture};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let policy = Policy::builder("p", Algorithm::Gcra)
    ///     .limit(1)
    ///     .window(std::time::Duration::from_secs(1))
    ///     .build()?;
    /// let layer = RateLimitLayer::new(GuardedLimiter::builder(Limiter::new(MemoryBackend::default()), policy).build())
    ///     .key(Global);
    /// let mut service = layer.layer(service_fn(|_: Request<()>| async {
    ///     Ok::<_, Infallible>(Response::new(String::new()))
    /// }));
    /// let future: ResponseFuture<_, ()> = service.call(Request::new(()));
    /// assert!(future.await?.status().is_success());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B>
    where
        S: Service<Request<B>>,
    {
        // The check waiting for Redis. Boxed: only such requests take this state, and the
        // others should not carry (and move) a whole request's room in their future.
        Admitting {
            admission: Check,
            pending: Option<Box<Pending<S, B>>>,
        },
        // Delay mode: the request waits for the slot its check reserved.
        Delaying {
            #[pin]
            sleep: tokio::time::Sleep,
            pending: Option<Box<Delayed<S, B>>>,
        },
        Calling {
            #[pin]
            future: S::Future,
            headers: Option<(Arc<Tier>, Decisions)>,
        },
        // Counting by response: the reservation is settled at the cost the response says
        // before it is sent, so the client's next request finds the quota as settled; the
        // response's headers then say what remains after the settle.
        Settling {
            settle: Settle,
            response: Option<S::Response>,
            headers: Option<(Arc<Tier>, Decisions)>,
        },
        Answered {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<S: Service<Request<B>>, B> std::fmt::Debug for ResponseFuture<S, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S: Service<Request<B>> + Clone, B> ResponseFuture<S, B> {
    /// A check already decided: call the service or answer.
    pub(crate) fn decided(
        decisions: Decisions,
        service: &mut S,
        request: Request<B>,
        tier: &Arc<Tier>,
    ) -> Self {
        Self {
            state: decide(decisions, service, request, tier),
        }
    }

    pub(crate) fn admitting(
        admission: Check,
        service: S,
        request: Request<B>,
        tier: Arc<Tier>,
    ) -> Self {
        Self {
            state: State::Admitting {
                admission,
                pending: Some(Box::new(Pending {
                    service,
                    request,
                    tier,
                })),
            },
        }
    }

    pub(crate) fn pass(future: S::Future) -> Self {
        Self {
            state: State::Calling {
                future,
                headers: None,
            },
        }
    }

    pub(crate) fn ready(response: Response<Bytes>) -> Self {
        Self {
            state: State::Answered {
                response: Some(response),
            },
        }
    }
}

/// What a check that waits for Redis keeps until it is decided.
struct Pending<S, B> {
    service: S,
    request: Request<B>,
    tier: Arc<Tier>,
}

/// What a request in delay mode keeps while it waits: its place among the waiters too, given
/// back when it is served or dropped (its client went away).
struct Delayed<S, B> {
    service: S,
    request: Request<B>,
    tier: Arc<Tier>,
    decisions: Decisions,
    _waiting: Waiting,
}

/// After the check: the service is called with the decision in the request's extensions, after
/// the wait for its slot in delay mode, or the request is answered without it.
fn decide<S: Service<Request<B>> + Clone, B>(
    decisions: Decisions,
    service: &mut S,
    request: Request<B>,
    tier: &Arc<Tier>,
) -> State<S, B> {
    if !decisions.allowed() {
        return State::Answered {
            response: Some(tier.reject(&decisions, request.headers())),
        };
    }
    let delay = decisions.delay();
    if delay.is_zero() {
        return call(decisions, service, request, tier);
    }
    let Some(waiting) = tier.wait() else {
        return State::Answered {
            response: Some(tier.waiters_full(&decisions)),
        };
    };
    // The service that was polled ready waits with the request; a clone takes its place.
    let clone = service.clone();
    State::Delaying {
        sleep: tokio::time::sleep(delay),
        pending: Some(Box::new(Delayed {
            service: std::mem::replace(service, clone),
            request,
            tier: Arc::clone(tier),
            decisions,
            _waiting: waiting,
        })),
    }
}

/// Extensions with no values and room for four: cloned into a request that has none, they hold
/// the decisions and the three values axum's router adds after them without growing, where a
/// map made by the first insert grows at the fourth. Instructions per request of the layer in
/// front of a router (callgrind over `cargo run --release -p redlimit-bench --example
/// layer_overhead "layer, IETF"`, the whole process over 200,000 requests): 14,797 -> 14,402,
/// where tower_governor's run reads 13,888 and the bare router's 9,632.
static ROOMY: LazyLock<Extensions> = LazyLock::new(|| {
    #[derive(Clone)]
    struct A;
    #[derive(Clone)]
    struct B;
    #[derive(Clone)]
    struct C;
    #[derive(Clone)]
    struct D;
    let mut roomy = Extensions::new();
    roomy.insert(A);
    roomy.insert(B);
    roomy.insert(C);
    roomy.insert(D);
    roomy.clear();
    roomy
});

/// Calls the service with the check's decisions in the request's extensions, one value: a
/// handler reads all of them (the daily quota while the per-second one is tighter), or the most
/// restrictive (`Decisions::most_restrictive`). One insert, not two, into extensions with room
/// for axum's router's three (ROOMY).
fn call<S: Service<Request<B>>, B>(
    decisions: Decisions,
    service: &mut S,
    mut request: Request<B>,
    tier: &Arc<Tier>,
) -> State<S, B> {
    // Renewed while the service runs and its body streams, until the last decisions drop.
    if let Some(lease) = decisions.lease() {
        lease.keep_alive();
    }
    if request.extensions().is_empty() {
        *request.extensions_mut() = ROOMY.clone();
    }
    request.extensions_mut().insert(decisions.clone());
    State::Calling {
        future: service.call(request),
        headers: Some((Arc::clone(tier), decisions)),
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
    ResBody: Default + 'static,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Admitting { admission, pending } => {
                    let decisions = ready!(Pin::new(admission).poll(cx));
                    let mut pending = *pending.take().expect("polled after completion");
                    let next = decide(
                        decisions,
                        &mut pending.service,
                        pending.request,
                        &pending.tier,
                    );
                    state.set(next);
                }
                StateProj::Delaying { sleep, pending } => {
                    ready!(sleep.poll(cx));
                    let delayed = *pending.take().expect("polled after completion");
                    let Delayed {
                        mut service,
                        request,
                        tier,
                        decisions,
                        ..
                    } = delayed;
                    state.set(call(decisions, &mut service, request, &tier));
                }
                StateProj::Calling { future, headers } => {
                    let mut response = ready!(future.poll(cx))?;
                    if let Some((tier, decisions)) = headers.take() {
                        // The lease, if the check holds one, goes with the body.
                        response = hold_lease(response, &decisions);
                        if response.status().is_server_error() {
                            tier.series.service_failed();
                        }
                        if let Some(settle) = tier.settle(&response, &decisions) {
                            state.set(State::Settling {
                                settle,
                                response: Some(response),
                                headers: Some((tier, decisions)),
                            });
                            continue;
                        }
                        tier.add_headers(response.headers_mut(), &decisions);
                    }
                    return Poll::Ready(Ok(response));
                }
                StateProj::Settling {
                    settle,
                    response,
                    headers,
                } => {
                    let settled = ready!(settle.as_mut().poll(cx));
                    let mut response = response.take().expect("polled after completion");
                    if let Some((tier, decisions)) = headers.take() {
                        let decisions = settled.unwrap_or(decisions);
                        tier.add_headers(response.headers_mut(), &decisions);
                    }
                    return Poll::Ready(Ok(response));
                }
                StateProj::Answered { response } => {
                    let response = response.take().expect("polled after completion");
                    return Poll::Ready(Ok(response.map(rejection_body)));
                }
            }
        }
    }
}
