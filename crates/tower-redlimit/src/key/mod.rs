//! Who is limited: key extractors turn a request into the client key.

mod client_ip_header;
mod extension;
mod ip;
#[cfg(feature = "axum")]
mod route;

use std::borrow::Cow;

use http::{HeaderName, request::Parts};
use redlimit::ConfigError;

#[cfg(feature = "axum")]
pub use self::route::MatchedRoute;
pub use self::{client_ip_header::ClientIpHeader, extension::ExtensionKey, ip::ClientIp};

/// Turns a request into the key that is limited, or `None` when it has none (see
/// [`MissingKey`](crate::MissingKey)). The key may borrow from the request, so a header value is
/// not copied.
///
/// Any `Fn(&http::request::Parts) -> Option<String>` is an extractor.
///
/// ```
/// use tower_redlimit::KeyExtractor;
///
/// let by_tenant = |parts: &http::request::Parts| {
///     parts.uri.path().split('/').nth(2).map(str::to_owned)
/// };
/// let (parts, ()) = http::Request::get("/t/acme/items").body(()).unwrap().into_parts();
/// assert_eq!(by_tenant.extract(&parts).as_deref(), Some("acme"));
/// ```
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key of this request.
    fn extract<'a>(&self, request: &'a Parts) -> Option<Cow<'a, str>>;

    /// What the extractor reads, for the answer to a request it finds no key in (such as
    /// `header x-api-key`). Defaults to `the key extractor`.
    fn describe(&self) -> String {
        "the key extractor".to_owned()
    }

    /// Whether `request`, in which this extractor finds no key, lacks it by the client's doing
    /// (it did not send the header or API key the key is read from) rather than by the
    /// server's set-up (the peer address not wired, the layer where no route is matched).
    /// [`MissingKey::Refuse`](crate::MissingKey::Refuse), the default, answers the first 400
    /// and the second 500. Defaults to `true`.
    fn missing_by_client(&self, request: &Parts) -> bool {
        let _ = request;
        true
    }
}

impl<F> KeyExtractor for F
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    fn extract<'a>(&self, request: &'a Parts) -> Option<Cow<'a, str>> {
        self(request).map(Cow::Owned)
    }
}

/// A shared extractor, such as one chosen at run time from a configuration file.
impl<K: KeyExtractor + ?Sized> KeyExtractor for std::sync::Arc<K> {
    fn extract<'a>(&self, request: &'a Parts) -> Option<Cow<'a, str>> {
        (**self).extract(request)
    }

    fn describe(&self) -> String {
        (**self).describe()
    }

    fn missing_by_client(&self, request: &Parts) -> bool {
        (**self).missing_by_client(request)
    }
}

/// One key for every request: a global limit.
///
/// ```
/// use tower_redlimit::{Global, KeyExtractor};
///
/// let (parts, ()) = http::Request::get("/").body(()).unwrap().into_parts();
/// assert_eq!(Global.extract(&parts).as_deref(), Some("global"));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Global;

impl KeyExtractor for Global {
    fn extract<'a>(&self, _: &'a Parts) -> Option<Cow<'a, str>> {
        Some(Cow::Borrowed("global"))
    }
}

/// The value of a request header, such as an API key. A missing or empty header has no key.
///
/// ```
/// use tower_redlimit::{HeaderKey, KeyExtractor};
///
/// let key = HeaderKey::new("x-api-key")?;
/// let (parts, ()) = http::Request::get("/").header("x-api-key", "k-42").body(()).unwrap().into_parts();
/// assert_eq!(key.extract(&parts).as_deref(), Some("k-42"));
/// # Ok::<(), redlimit::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// Keys requests by the header `name`.
    ///
    /// # Errors
    /// [`ConfigError::InvalidName`] when `name` is not a valid header name.
    pub fn new(name: &str) -> Result<Self, ConfigError> {
        let name = HeaderName::try_from(name).map_err(|_| ConfigError::InvalidName {
            field: "key header",
            value: name.to_owned(),
        })?;
        Ok(Self { name })
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl KeyExtractor for HeaderKey {
    fn describe(&self) -> String {
        format!("header {}", self.name)
    }

    fn extract<'a>(&self, request: &'a Parts) -> Option<Cow<'a, str>> {
        let value = request.headers.get(&self.name)?.as_bytes();
        if value.is_empty() {
            return None;
        }
        // Valid UTF-8 is borrowed as it is. Other bytes are written out in hex behind a \x01,
        // which no header value can hold, so two distinct values never share a key (a lossy
        // decoding would turn `k\xff` and `k\xfe` into the same `k\u{fffd}`).
        Some(std::str::from_utf8(value).map_or_else(
            |_| {
                let mut hex = String::with_capacity(1 + 2 * value.len());
                hex.push('\u{1}');
                for byte in value {
                    hex.push(char::from(HEX[usize::from(byte >> 4)]));
                    hex.push(char::from(HEX[usize::from(byte & 0xf)]));
                }
                Cow::Owned(hex)
            },
            Cow::Borrowed,
        ))
    }
}

/// Two keys combined, such as client IP and route: limited per pair. Both must be present.
///
/// ```
/// use tower_redlimit::{Both, Global, HeaderKey, KeyExtractor};
///
/// let per_key_and_tenant = Both(HeaderKey::new("x-api-key")?, HeaderKey::new("x-tenant")?);
/// let (parts, ()) = http::Request::get("/")
///     .header("x-api-key", "k")
///     .header("x-tenant", "acme")
///     .body(())
///     .unwrap()
///     .into_parts();
/// assert_eq!(per_key_and_tenant.extract(&parts).as_deref(), Some("k|acme"));
/// assert_eq!(Both(Global, Global).extract(&parts).as_deref(), Some("global|global"));
/// # Ok::<(), redlimit::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Both<A, B>(pub A, pub B);

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for Both<A, B> {
    fn describe(&self) -> String {
        format!("{} and {}", self.0.describe(), self.1.describe())
    }

    /// The client's doing only if each part it misses is: a part the server should have
    /// provided makes it the server's.
    fn missing_by_client(&self, request: &Parts) -> bool {
        let by_client = |part: &dyn KeyExtractor| {
            part.extract(request).is_some() || part.missing_by_client(request)
        };
        by_client(&self.0) && by_client(&self.1)
    }

    fn extract<'a>(&self, request: &'a Parts) -> Option<Cow<'a, str>> {
        // `|` separates the parts; escaping it (and `%`) inside them keeps pairs distinct.
        let escape = |s: Cow<'_, str>| s.replace('%', "%25").replace('|', "%7C");
        let first = escape(self.0.extract(request)?);
        let second = escape(self.1.extract(request)?);
        Some(Cow::Owned(format!("{first}|{second}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(builder: http::request::Builder) -> Parts {
        builder.body(()).expect("request").into_parts().0
    }

    #[test]
    fn header_keys_and_pairs() {
        let key = HeaderKey::new("x-api-key").expect("valid");
        let with = parts(http::Request::get("/").header("x-api-key", "k1"));
        assert_eq!(key.extract(&with).as_deref(), Some("k1"));
        assert_eq!(key.extract(&parts(http::Request::get("/"))), None);
        let empty = parts(http::Request::get("/").header("x-api-key", ""));
        assert_eq!(key.extract(&empty), None);
        assert!(HeaderKey::new("bad header").is_err());

        // Bytes that are not UTF-8 keep distinct values distinct.
        let raw = |bytes: &'static [u8]| {
            let value = http::HeaderValue::from_bytes(bytes).expect("a valid header value");
            key.extract(&parts(http::Request::get("/").header("x-api-key", value)))
                .expect("a key")
                .into_owned()
        };
        let keys = [
            raw(b"k\xff"),
            raw(b"k\xfe"),
            raw(b"k%ff"),
            raw(b"k\xef\xbf\xbd"),
        ];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(keys[0], "\u{1}6bff");
        assert_eq!(keys[3], "k\u{fffd}", "valid UTF-8 as it is");

        let pair = Both(key, Global);
        assert_eq!(pair.extract(&with).as_deref(), Some("k1|global"));
        let tricky = parts(http::Request::get("/").header("x-api-key", "a|b"));
        assert_eq!(pair.extract(&tricky).as_deref(), Some("a%7Cb|global"));
        assert_eq!(Global.extract(&with).as_deref(), Some("global"));
    }
}
