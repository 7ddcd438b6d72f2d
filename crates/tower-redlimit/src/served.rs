use http::{Extensions, HeaderMap, StatusCode};

/// What a settle reads of the service's response (see
/// [`RateLimitLayer::settle`](crate::RateLimitLayer::settle)): its status, its headers, and its
/// extensions, where a handler can put a cost only it knows without sending it to the client.
///
/// ```
/// use tower_redlimit::Served;
///
/// /// What the handler spent, put in its response's extensions.
/// #[derive(Clone)]
/// struct TokensUsed(u64);
///
/// let actual = |served: &Served<'_>| served.extensions.get::<TokensUsed>().map(|t| t.0);
/// let mut response = http::Response::new(());
/// response.extensions_mut().insert(TokensUsed(250));
/// assert_eq!(actual(&Served::of(&response)), Some(250));
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Served<'a> {
    /// The response's status.
    pub status: StatusCode,
    /// The response's headers.
    pub headers: &'a HeaderMap,
    /// The response's extensions.
    pub extensions: &'a Extensions,
}

impl<'a> Served<'a> {
    /// What a settle reads of `response`.
    pub fn of<B>(response: &'a http::Response<B>) -> Self {
        Self {
            status: response.status(),
            headers: response.headers(),
            extensions: response.extensions(),
        }
    }
}
