use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use redlimit::{Checked, Decision};
use tower_service::Service;

use crate::{RateLimitLayer, RejectionBody, headers};

type CheckFuture = Pin<Box<dyn Future<Output = Checked> + Send>>;

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit): the check, then the inner call.
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
        // Boxed: only checks that wait for Redis take this state, and the others should not
        // carry (and move) a whole request's room in their future.
        Checking {
            check: CheckFuture,
            pending: Option<Box<Pending<S, B>>>,
        },
        Calling {
            #[pin]
            future: S::Future,
            headers: Option<(Arc<RateLimitLayer>, Vec<Decision>)>,
        },
        Answered {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<S: Service<Request<B>>, B> ResponseFuture<S, B> {
    /// A check already decided: call the service or answer.
    pub(crate) fn decided(
        checked: Checked,
        service: &mut S,
        request: Request<B>,
        layer: &Arc<RateLimitLayer>,
    ) -> Self {
        Self {
            state: decide(checked, service, request, layer),
        }
    }

    pub(crate) fn checking(
        check: CheckFuture,
        service: S,
        request: Request<B>,
        layer: Arc<RateLimitLayer>,
    ) -> Self {
        Self {
            state: State::Checking {
                check,
                pending: Some(Box::new(Pending {
                    service,
                    request,
                    layer,
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
    layer: Arc<RateLimitLayer>,
}

/// After the check: the service is called with the decision in the request's extensions, or
/// the request is answered without it.
fn decide<S: Service<Request<B>>, B>(
    checked: Checked,
    service: &mut S,
    mut request: Request<B>,
    layer: &Arc<RateLimitLayer>,
) -> State<S, B> {
    if !checked.allowed() {
        return State::Answered {
            response: Some(layer.reject(&checked.decisions, request.headers())),
        };
    }
    if let Some(decision) = headers::most_restrictive(&checked.decisions) {
        request.extensions_mut().insert(decision.clone());
    }
    State::Calling {
        future: service.call(request),
        headers: Some((Arc::clone(layer), checked.decisions)),
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    ResBody: RejectionBody,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Checking { check, pending } => {
                    let checked = ready!(check.as_mut().poll(cx));
                    let mut pending = *pending.take().expect("polled after completion");
                    let next = decide(
                        checked,
                        &mut pending.service,
                        pending.request,
                        &pending.layer,
                    );
                    state.set(next);
                }
                StateProj::Calling { future, headers } => {
                    let mut response = ready!(future.poll(cx))?;
                    if let Some((layer, decisions)) = headers.take() {
                        headers::insert(
                            response.headers_mut(),
                            layer.headers,
                            &layer.policy_header,
                            &decisions,
                        );
                    }
                    return Poll::Ready(Ok(response));
                }
                StateProj::Answered { response } => {
                    let response = response.take().expect("polled after completion");
                    return Poll::Ready(Ok(response.map(ResBody::from_bytes)));
                }
            }
        }
    }
}
