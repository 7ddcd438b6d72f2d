//! The limiter's own answers in the service's own body type.

use std::any::Any;

use bytes::Bytes;
use http_body_util::Full;

/// A body of type `B` holding `bytes` (a denial's text or JSON): written in full where `B` is a
/// type the limiter knows how to fill (axum's body with the `axum` feature, `Full<Bytes>`,
/// `String`, `Bytes`), else `B`'s default, empty body.
///
/// The type is looked up at run time, as axum's `Body::new` does, because a trait the user
/// would implement for a body type they do not own (a boxed body, tower-http's compression
/// body) is refused by the orphan rule; the status and headers of a denial say everything in
/// any case.
pub(crate) fn rejection_body<B: Default + 'static>(bytes: Bytes) -> B {
    let mut body: Option<B> = None;
    let slot = &mut body as &mut dyn Any;
    if let Some(slot) = slot.downcast_mut::<Option<Bytes>>() {
        *slot = Some(bytes);
    } else if let Some(slot) = slot.downcast_mut::<Option<Full<Bytes>>>() {
        *slot = Some(Full::new(bytes));
    } else if let Some(slot) = slot.downcast_mut::<Option<String>>() {
        *slot = Some(String::from_utf8_lossy(&bytes).into_owned());
    } else {
        #[cfg(feature = "axum")]
        if let Some(slot) = slot.downcast_mut::<Option<axum::body::Body>>() {
            *slot = Some(axum::body::Body::from(bytes));
        }
    }
    body.unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use http_body_util::combinators::BoxBody;

    use super::*;

    #[test]
    fn known_bodies_get_the_text_and_others_their_default() {
        let text = || Bytes::from_static(b"slow down");
        assert_eq!(rejection_body::<Bytes>(text()), "slow down");
        assert_eq!(rejection_body::<String>(text()), "slow down");
        let full: Full<Bytes> = rejection_body(text());
        assert_eq!(http_body::Body::size_hint(&full).exact(), Some(9));
        let boxed: BoxBody<Bytes, std::convert::Infallible> = rejection_body(text());
        assert_eq!(http_body::Body::size_hint(&boxed).exact(), Some(0));
    }
}
