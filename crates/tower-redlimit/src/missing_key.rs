use http::StatusCode;

/// What to do with a request the key extractor finds no key for.
///
/// ```
/// use tower_redlimit::{HeaderKey, MissingKey, RateLimitLayer};
/// # fn layer(layer: RateLimitLayer) -> Result<RateLimitLayer, redlimit::ConfigError> {
/// // Requests without an API key share one budget instead of being refused.
/// let layer = layer
///     .key(HeaderKey::new("x-api-key")?)
///     .missing_key(MissingKey::Shared("anonymous".to_owned()));
/// # Ok(layer) }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKey {
    /// Answer, without calling the service, `400 Bad Request` when the client did not send
    /// what the key is read from (a header, an API key), `500 Internal Server Error` when the
    /// server should have provided it (the peer address not wired; see
    /// [`KeyExtractor::missing_by_client`](crate::KeyExtractor::missing_by_client)), with a
    /// body naming what was missing, in the format of a denial (`application/problem+json`
    /// when the layer answers so; gRPC: `INVALID_ARGUMENT` or `INTERNAL`). The default.
    ///
    /// 400 rather than 401: a 401 must carry a `WWW-Authenticate` challenge of the service's
    /// authentication scheme, which the limiter cannot know; an authentication layer in front
    /// answers 401 itself.
    #[default]
    Refuse,
    /// Answer with this status and the same body, without calling the service.
    Reject(StatusCode),
    /// Let it through unlimited.
    Allow,
    /// Limit all such requests together under this key (such as `anonymous`).
    Shared(String),
}
