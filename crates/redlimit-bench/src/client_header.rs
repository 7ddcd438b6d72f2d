//! tower_governor's key for the bench: the `x-client` header, as redlimit's contenders use.
//! Shared by the HTTP mode and `examples/layer_overhead.rs` (which includes this file).

use axum::http::Request;
use tower_governor::{GovernorError, key_extractor::KeyExtractor};

/// The `x-client` header's value.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClientHeader;

impl KeyExtractor for ClientHeader {
    type Key = String;

    fn extract<T>(&self, req: &Request<T>) -> Result<Self::Key, GovernorError> {
        req.headers()
            .get("x-client")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
            .ok_or(GovernorError::UnableToExtractKey)
    }
}
