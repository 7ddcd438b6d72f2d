use std::borrow::Cow;

use axum::extract::MatchedPath;
use http::request::Parts;

use super::KeyExtractor;

/// The axum route that matched, such as `/users/{id}`: one limit per route.
///
/// axum records the route only for middleware added with `Router::route_layer` or on a handler;
/// under `Router::layer` the request has not been routed yet and has no key.
#[derive(Debug, Clone, Copy, Default)]
pub struct MatchedRoute;

impl KeyExtractor for MatchedRoute {
    fn extract<'a>(&self, request: &'a Parts) -> Option<Cow<'a, str>> {
        request
            .extensions
            .get::<MatchedPath>()
            .map(|path| Cow::Borrowed(path.as_str()))
    }
}
