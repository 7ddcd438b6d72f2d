use http::StatusCode;

/// What to do with a request the key extractor finds no key for.
///
/// ```
/// use tower_redlimit::{HeaderKey, MissingKey, RateLimitLayer};
/// # fn layer(layer: RateLimitLayer) -> Result<RateLimitLayer, redlimit::ConfigError> {
/// // Requests without an API key share one budget.
/// let layer = layer
///     .key(HeaderKey::new("x-api-key")?)
///     .missing_key(MissingKey::Shared("anonymous".to_owned()));
/// # Ok(layer) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKey {
    /// Answer with this status and a message, without calling the service.
    Reject(StatusCode),
    /// Let it through unlimited.
    Allow,
    /// Limit all such requests together under this key (such as `anonymous`).
    Shared(String),
}

impl Default for MissingKey {
    /// `Reject(500)`: a missing peer address is a server set-up mistake, not the client's.
    fn default() -> Self {
        Self::Reject(StatusCode::INTERNAL_SERVER_ERROR)
    }
}
