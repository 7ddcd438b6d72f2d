//! Bodies of the limiter's own responses.

use std::{
    convert::Infallible,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

/// A response body the limiter can write its own answers in (a denial's text or JSON, or
/// nothing for gRPC).
///
/// The layer returns the wrapped service's own response type, untouched on the way through: no
/// wrapper body, no extra boxing. Implemented for axum's and tonic's bodies (features `axum` and
/// `tonic`) and for [`Bytes`] and `String`; implement it for another body type to use the layer
/// with it.
pub trait RejectionBody: Sized {
    /// A body holding `bytes`.
    fn from_bytes(bytes: Bytes) -> Self;
}

#[cfg(feature = "axum")]
impl RejectionBody for axum::body::Body {
    fn from_bytes(bytes: Bytes) -> Self {
        Self::from(bytes)
    }
}

#[cfg(feature = "tonic")]
impl RejectionBody for tonic::body::Body {
    fn from_bytes(bytes: Bytes) -> Self {
        Self::new(Full(Some(bytes).filter(|b| !b.is_empty())))
    }
}

impl RejectionBody for Bytes {
    fn from_bytes(bytes: Bytes) -> Self {
        bytes
    }
}

impl RejectionBody for String {
    fn from_bytes(bytes: Bytes) -> Self {
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// All its data in one frame.
#[derive(Debug)]
#[cfg_attr(not(feature = "tonic"), allow(dead_code))]
struct Full(Option<Bytes>);

impl Body for Full {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.take().map(|data| Ok(Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.as_ref().map_or(0, |d| d.len() as u64))
    }
}
