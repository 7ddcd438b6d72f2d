use std::{borrow::Cow, fmt, marker::PhantomData};

use http::request::Parts;

use super::KeyExtractor;

/// The value of type `T` that an earlier middleware put in the request's extensions (an
/// authenticated user's id, a tenant), as its `Display` text. A request without it has no key:
/// by default answered 400 (the client did not authenticate; see
/// [`MissingKey`](crate::MissingKey)).
///
/// ```
/// use tower_redlimit::{ExtensionKey, KeyExtractor};
///
/// /// What an authentication middleware inserts.
/// #[derive(Clone)]
/// struct UserId(u64);
///
/// impl std::fmt::Display for UserId {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         write!(f, "user-{}", self.0)
///     }
/// }
///
/// let key = ExtensionKey::<UserId>::new();
/// let (mut parts, ()) = http::Request::get("/").body(()).unwrap().into_parts();
/// assert_eq!(key.extract(&parts), None);
/// parts.extensions.insert(UserId(42));
/// assert_eq!(key.extract(&parts).as_deref(), Some("user-42"));
/// ```
pub struct ExtensionKey<T> {
    of: PhantomData<fn() -> T>,
}

impl<T> ExtensionKey<T> {
    /// Keys requests by their extension of type `T`.
    pub const fn new() -> Self {
        Self { of: PhantomData }
    }
}

impl<T> Default for ExtensionKey<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for ExtensionKey<T> {
    fn clone(&self) -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for ExtensionKey<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ExtensionKey")
            .field(&std::any::type_name::<T>())
            .finish()
    }
}

impl<T: fmt::Display + Send + Sync + 'static> KeyExtractor for ExtensionKey<T> {
    fn extract<'a>(&self, request: &'a Parts) -> Option<Cow<'a, str>> {
        let text = request.extensions.get::<T>()?.to_string();
        (!text.is_empty()).then_some(Cow::Owned(text))
    }

    fn describe(&self) -> String {
        format!("the request extension {}", std::any::type_name::<T>())
    }
}
