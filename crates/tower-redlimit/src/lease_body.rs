//! A concurrency limit's lease held by the response body, so that it is given back when the
//! body is done or dropped (a client that went away mid-stream), not when the head is ready.
// Without a body type that can hold a lease, nothing does.
#![cfg_attr(not(any(feature = "axum", feature = "tonic")), allow(dead_code))]

use std::{
    any::Any,
    pin::Pin,
    task::{Context, Poll},
};

use http::Response;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use redlimit::Decisions;

/// `response` with its body holding the lease of `decisions` (renewed since the service was
/// called), where the body is a type that can hold one (axum's with the `axum` feature,
/// tonic's with `tonic`): the type is looked up at run time, as for a denial's body. Any other
/// body leaves the lease to be given back once the response head is ready, when the last of
/// the decisions is dropped.
pub(crate) fn hold_lease<B: Default + 'static>(
    response: Response<B>,
    decisions: &Decisions,
) -> Response<B> {
    if decisions.lease().is_none() {
        return response;
    }
    let (parts, body) = response.into_parts();
    let mut body = Some(body);
    let slot = &mut body as &mut dyn Any;
    #[cfg(feature = "axum")]
    if let Some(slot) = slot.downcast_mut::<Option<axum::body::Body>>()
        && let Some(inner) = slot.take()
    {
        *slot = Some(axum::body::Body::new(Holding::new(inner, decisions)));
    }
    #[cfg(feature = "tonic")]
    if let Some(slot) = slot.downcast_mut::<Option<tonic::body::Body>>()
        && let Some(inner) = slot.take()
    {
        *slot = Some(tonic::body::Body::new(Holding::new(inner, decisions)));
    }
    let _ = slot;
    Response::from_parts(parts, body.unwrap_or_default())
}

pin_project! {
    /// A body holding the decisions of its request, and so their lease, until it is dropped.
    struct Holding<B> {
        #[pin]
        body: B,
        _decisions: Decisions,
    }
}

impl<B> Holding<B> {
    fn new(body: B, decisions: &Decisions) -> Self {
        Self {
            body,
            _decisions: decisions.clone(),
        }
    }
}

impl<B: Body> Body for Holding<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
