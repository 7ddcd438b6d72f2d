//! The response body: the service's own, or the limiter's answer.

use std::{
    convert::Infallible,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project_lite::pin_project;

pin_project! {
    /// The response body of [`RateLimit`](crate::RateLimit): the wrapped service's own body,
    /// passed through untouched, or the limiter's own answer (a denial's text or JSON, nothing
    /// for gRPC).
    ///
    /// Works with any body whose data is [`Bytes`]: axum's and tonic's bodies, `String`,
    /// `http_body_util::Full<Bytes>` and its boxed bodies, tower-http's compression body.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http_body_util::{BodyExt, Full};
    /// use tower_redlimit::ResponseBody;
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let body = ResponseBody::new(Full::new(Bytes::from_static(b"hello")));
    /// assert!(!body.is_rejection());
    /// assert_eq!(body.collect().await.unwrap().to_bytes(), "hello");
    /// # });
    /// ```
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Service { #[pin] body: B },
        Rejection { body: Full<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    /// The service's own `body`.
    pub fn new(body: B) -> Self {
        Self {
            kind: Kind::Service { body },
        }
    }

    /// The limiter's answer, holding `bytes`.
    pub(crate) fn rejection(bytes: Bytes) -> Self {
        Self {
            kind: Kind::Rejection {
                body: Full::new(bytes),
            },
        }
    }

    /// Whether this is the limiter's answer rather than the service's body.
    pub fn is_rejection(&self) -> bool {
        matches!(self.kind, Kind::Rejection { .. })
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.is_rejection() {
            "rejection"
        } else {
            "service"
        };
        f.debug_struct("ResponseBody").field("kind", &kind).finish()
    }
}

impl<B: Body<Data = Bytes>> Body for ResponseBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Service { body } => body.poll_frame(cx),
            KindProj::Rejection { body } => Pin::new(body)
                .poll_frame(cx)
                .map_err(|never: Infallible| match never {}),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Service { body } => body.is_end_stream(),
            Kind::Rejection { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Service { body } => body.size_hint(),
            Kind::Rejection { body } => body.size_hint(),
        }
    }
}
