use std::{fmt, fmt::Write as _, sync::Arc};

use crate::{ConfigError, Policy, config_error::validate_name, policy::fingerprint};

/// Escaped client keys longer than this are replaced by a hash, so no client can blow up key size.
const MAX_KEY_LEN: usize = 128;

/// Turns (prefix, policy, client key) into Redis key names:
/// `prefix:policy:{client}:algorithm:window_ms`.
///
/// The client key sits alone inside the hash tag, so every key of one client (and every policy
/// checked together for it) lands in one Redis Cluster slot. Client text never reaches Redis raw:
/// bytes outside `A-Z a-z 0-9 . _ - : @ / + =` are percent-escaped (so `{`, `}`, spaces and
/// control bytes cannot steer the hash tag or another client's counter), and an escaped key longer
/// than 128 bytes becomes `#` and its SHA-1. The name holds what gives the state its meaning
/// (policy, algorithm, window), not the limit or burst: the state is counts and times, read
/// under the numbers in force, so a changed limit (a reload, an override) keeps every client's
/// count. A changed algorithm or window starts afresh under another name.
///
/// ```
/// use std::time::Duration;
/// use redlimit::{Algorithm, KeyScheme, Policy};
///
/// let scheme = KeyScheme::new("myapp")?;
/// let policy = Policy::builder("api", Algorithm::FixedWindow)
///     .limit(100)
///     .window(Duration::from_secs(60))
///     .build()?;
/// assert_eq!(scheme.key(&policy, "10.0.0.1"), "myapp:api:{10.0.0.1}:fw:60000");
/// assert_eq!(scheme.key(&policy, "a}b c"), "myapp:api:{a%7Db%20c}:fw:60000");
///
/// // API keys are secrets: keep only a keyed hash of them in Redis.
/// let hashed = KeyScheme::new("myapp")?.hash_clients(b"a secret every instance shares");
/// assert!(!hashed.key(&policy, "sk_live_123").contains("sk_live_123"));
/// # Ok::<(), redlimit::ConfigError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct KeyScheme {
    prefix: String,
    fingerprint: u128,
    hash: Option<Arc<HmacKey>>,
    /// Whether a client written `{tag}rest` is keyed in `tag`'s slot.
    tags: bool,
}

impl fmt::Debug for KeyScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyScheme")
            .field("prefix", &self.prefix)
            .field("hash_clients", &self.hash.is_some())
            .field("tags", &self.tags)
            .finish_non_exhaustive()
    }
}

/// An HMAC-SHA1 key, its two pads computed once (RFC 2104).
#[derive(Clone, PartialEq, Eq)]
struct HmacKey {
    inner: [u8; 64],
    outer: [u8; 64],
}

impl HmacKey {
    fn new(secret: &[u8]) -> Self {
        let mut key = [0_u8; 64];
        if secret.len() > key.len() {
            key[..20].copy_from_slice(&sha1_smol::Sha1::from(secret).digest().bytes());
        } else {
            key[..secret.len()].copy_from_slice(secret);
        }
        Self {
            inner: key.map(|b| b ^ 0x36),
            outer: key.map(|b| b ^ 0x5c),
        }
    }

    fn mac(&self, message: &[u8]) -> [u8; 20] {
        let mut inner = sha1_smol::Sha1::new();
        inner.update(&self.inner);
        inner.update(message);
        let mut outer = sha1_smol::Sha1::new();
        outer.update(&self.outer);
        outer.update(&inner.digest().bytes());
        outer.digest().bytes()
    }
}

impl Default for KeyScheme {
    /// The prefix `redlimit`.
    fn default() -> Self {
        Self::from_valid("redlimit".to_owned())
    }
}

impl KeyScheme {
    /// A scheme whose keys start with `prefix` (1 to 64 of `A-Z a-z 0-9 _ - .`).
    ///
    /// # Errors
    /// [`ConfigError::InvalidName`] for any other prefix.
    pub fn new(prefix: impl Into<String>) -> Result<Self, ConfigError> {
        let prefix = prefix.into();
        validate_name("key prefix", &prefix)?;
        Ok(Self::from_valid(prefix))
    }

    fn from_valid(prefix: String) -> Self {
        Self {
            fingerprint: fingerprint(&[&prefix]),
            prefix,
            hash: None,
            tags: false,
        }
    }

    /// Keeps each client identifier in Redis as its HMAC-SHA1 under `secret` (40 hex digits),
    /// never as text: API keys and addresses do not show in key names, `SCAN`, `MONITOR`, slow
    /// logs or backups. Every instance sharing the Redis must use the same secret, or they keep
    /// separate counts. Defaults to the escaped text, which `redis-cli` shows as it is.
    #[must_use]
    pub fn hash_clients(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.hash = Some(Arc::new(HmacKey::new(secret.as_ref())));
        self
    }

    /// Keys a client written `{tag}rest` under `tag`'s Redis Cluster slot: every client of one
    /// tag (a tenant's IPs and API keys: `{acme}ip:10.0.0.1`, `{acme}key:k7`) shares a slot, so
    /// that a check with a key per policy ([`CheckRequest::keys`](crate::CheckRequest::keys))
    /// is one call on a Cluster too. Each client still has keys of its own. Only for clients the
    /// application writes so: a client who controls the text could pick a node's slot.
    /// Defaults to off: a client's braces are escaped like any other character.
    #[must_use]
    pub fn tenant_tags(mut self) -> Self {
        self.tags = true;
        self
    }

    /// A fingerprint of the prefix, for the memory backend's key ids.
    pub(crate) fn fingerprint(&self) -> u128 {
        self.fingerprint
    }

    /// The Redis key holding `policy`'s state for `client`: for a policy of a key group
    /// ([`PolicyBuilder::key_group`](crate::PolicyBuilder::key_group)), the group's key
    /// `prefix:group:{client}:group`, which holds every member's.
    pub fn key(&self, policy: &Policy, client: &str) -> String {
        let (name, suffix) = policy.key_parts();
        self.named(name, suffix, client)
    }

    /// The key `prefix:name:{client}:suffix`.
    pub(crate) fn named(&self, name: &str, suffix: &str, client: &str) -> String {
        let mut key =
            String::with_capacity(self.prefix.len() + name.len() + client.len() + suffix.len() + 8);
        key.push_str(&self.prefix);
        key.push(':');
        key.push_str(name);
        key.push_str(":{");
        self.push_tag(&mut key, client);
        key.push_str("}:");
        key.push_str(suffix);
        key
    }
}

impl KeyScheme {
    /// A `SCAN` pattern matching `policy`'s keys for every client: prefix, policy name and
    /// numbers hold no glob character, and a client's tag holds no `}`.
    pub(crate) fn pattern(&self, policy: &Policy) -> String {
        let (name, suffix) = policy.key_parts();
        format!("{}:{name}:{{*}}:{suffix}", self.prefix)
    }

    /// The key holding `client`'s override of `policy` (see `Limiter::set_override`), by the
    /// policy's name alone: it outlives a change of the policy's numbers. `~` keeps it apart
    /// from every policy's keys.
    pub(crate) fn override_key(&self, policy: &Policy, client: &str) -> String {
        self.named(policy.name(), "~override", client)
    }

    /// The key marking a settle of `client` made by its `token` (see `GiveBack`), in the
    /// client's slot. `~` keeps it apart from every policy's keys.
    pub(crate) fn given(&self, client: &str, token: &str) -> String {
        self.named("~given", token, client)
    }

    /// The pub/sub channel of operator events under this prefix (see `Limiter::reset`).
    pub(crate) fn events_channel(&self) -> String {
        format!("{}:~events", self.prefix)
    }

    /// The key counting `client`'s recent denials by `policy` towards a ban.
    pub(crate) fn strikes_key(&self, policy: &Policy, client: &str) -> String {
        self.named(policy.name(), "~strikes", client)
    }

    /// The key holding `client`'s ban on `policy`, by the policy's name alone.
    pub(crate) fn ban_key(&self, policy: &Policy, client: &str) -> String {
        self.named(policy.name(), "~ban", client)
    }

    /// The key remembering the answer to a check of `policies` by `client` with request `id`:
    /// in the client's slot, named by a hash of the id and the policies, so one id never
    /// answers for another set of policies. `~` keeps it apart from every policy's keys.
    pub(crate) fn once(
        &self,
        policies: &[Policy],
        client: &str,
        each: Option<&[&str]>,
        id: &str,
        reserve: bool,
    ) -> String {
        let mut sha1 = sha1_smol::Sha1::new();
        sha1.update(id.as_bytes());
        // A reservation's reply is longer: a check with the same id is another request.
        if reserve {
            sha1.update(&[1]);
        }
        // Checked under a key per policy: the id is the keys' together, named in the first's
        // slot.
        for key in each.unwrap_or_default() {
            sha1.update(&[2]);
            sha1.update(key.as_bytes());
        }
        for policy in policies {
            sha1.update(&[0]);
            sha1.update(policy.name().as_bytes());
            sha1.update(b":");
            sha1.update(policy.key_suffix().as_bytes());
        }
        let digest = sha1.digest().to_string();
        self.named("~once", &digest, client)
    }

    /// `client` as it stands in the hash tag: escaped text, or its keyed hash.
    /// Writes `client` inside its keys' braces. With tenant tags, a client written `{tag}rest`
    /// is written as `tag}/rest`, so that Redis hashes its keys by `tag` alone (see
    /// [`tenant_tags`](Self::tenant_tags)). No other client writes a `}`, so none is written
    /// alike.
    fn push_tag(&self, out: &mut String, client: &str) {
        match self.tagged(client) {
            Some((tag, rest)) => {
                self.push_part(out, tag);
                out.push_str("}/");
                self.push_part(out, rest);
            }
            None => self.push_part(out, client),
        }
    }

    fn push_part(&self, out: &mut String, part: &str) {
        match &self.hash {
            Some(key) => {
                for byte in key.mac(part.as_bytes()) {
                    let _ = write!(out, "{byte:02x}");
                }
            }
            None => push_client(out, part),
        }
    }

    /// The Redis Cluster slot of every key of `client`: the CRC16 of its hash tag (the `tag` of
    /// a client written `{tag}rest`).
    #[cfg(feature = "cluster")]
    pub(crate) fn slot(&self, client: &str) -> u16 {
        let mut tag = String::with_capacity(client.len() + 1);
        match self.tagged(client) {
            Some((part, _)) => self.push_part(&mut tag, part),
            None => self.push_tag(&mut tag, client),
        }
        crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes()) % 16_384
    }
}

impl KeyScheme {
    /// With tenant tags, a client written `{tag}rest`, as its tag (not empty) and the rest.
    fn tagged<'a>(&self, client: &'a str) -> Option<(&'a str, &'a str)> {
        if !self.tags {
            return None;
        }
        let (tag, rest) = client.strip_prefix('{')?.split_once('}')?;
        (!tag.is_empty()).then_some((tag, rest))
    }
}

fn push_client(out: &mut String, client: &str) {
    // An empty hash tag would make Redis hash the whole key; `%` alone is never an escape.
    if client.is_empty() {
        out.push('%');
        return;
    }
    let start = out.len();
    let bytes = client.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        // A run of bytes kept as they are goes in at once (a byte at a time cost some 50
        // instructions each: 575 per key of `client-1234` under callgrind); a run is cut at the
        // length bound, so no client's text is copied much past it.
        let room = MAX_KEY_LEN + 1 - (out.len() - start);
        let run = bytes[at..]
            .iter()
            .take(room)
            .take_while(|&&byte| KEPT[usize::from(byte)])
            .count();
        // A run is ASCII, so it starts and ends on characters' boundaries.
        out.push_str(client.get(at..at + run).unwrap_or_default());
        at += run;
        if let Some(&byte) = bytes.get(at).filter(|_| out.len() - start <= MAX_KEY_LEN) {
            let _ = write!(out, "%{byte:02X}");
            at += 1;
        }
        if out.len() - start > MAX_KEY_LEN {
            out.truncate(start);
            out.push('#');
            out.push_str(&sha1_smol::Sha1::from(client).digest().to_string());
            return;
        }
    }
}

/// The bytes a client's text keeps in a key: `A-Z a-z 0-9 . _ - : @ / + =`; any other is
/// percent-escaped.
const KEPT: [bool; 256] = {
    let mut kept = [false; 256];
    let mut byte: u8 = 0;
    loop {
        kept[byte as usize] = byte.is_ascii_alphanumeric()
            || matches!(byte, b'.' | b'_' | b'-' | b':' | b'@' | b'/' | b'+' | b'=');
        if byte == u8::MAX {
            break kept;
        }
        byte += 1;
    }
};

#[cfg(test)]
mod tests {

    #[test]
    #[cfg(feature = "cluster")]
    fn the_slot_is_redis_clusters() {
        // `CLUSTER KEYSLOT foo` and `CLUSTER KEYSLOT bar` on a real server.
        assert_eq!(KeyScheme::default().slot("foo"), 12_182);
        assert_eq!(KeyScheme::default().slot("bar"), 5_061);
    }

    /// A client written `{tag}rest` is keyed under `tag`'s hash tag, and never as another
    /// client is: not as `tag` alone, nor as a client whose braces are escaped.
    #[test]
    fn a_tagged_client_shares_its_tags_slot_and_no_key() {
        let policy = crate::Policy::builder("p", crate::Algorithm::Gcra)
            .limit(1)
            .window(std::time::Duration::from_secs(1))
            .build()
            .expect("valid");
        let keys = KeyScheme::default().tenant_tags();
        assert!(
            KeyScheme::default()
                .key(&policy, "{acme}k")
                .contains("%7Bacme%7Dk"),
            "off"
        );
        let key = keys.key(&policy, "{acme}key:k7");
        assert!(key.contains(":{acme}/key:k7}:"), "{key}");
        let others = ["acme", "{acme}", "{acme}key:k8", "acme}/key:k7", "{}key:k7"];
        for other in others {
            assert_ne!(keys.key(&policy, other), key, "{other}");
        }
        assert!(
            keys.key(&policy, "{}x").contains("%7B%7Dx"),
            "an empty tag is no tag"
        );
        #[cfg(feature = "cluster")]
        {
            assert_eq!(keys.slot("{acme}ip:1"), keys.slot("{acme}key:k7"));
            // `CLUSTER KEYSLOT foo`: the tag alone decides.
            assert_eq!(keys.slot("{foo}anything"), 12_182);
            let hashed = KeyScheme::default().hash_clients("secret").tenant_tags();
            assert_eq!(hashed.slot("{acme}a"), hashed.slot("{acme}b"));
        }
    }

    #[test]
    fn hashed_clients_are_hmac_sha1_and_never_the_text() {
        // RFC 2202, test case 1.
        let key = HmacKey::new(&[0x0b; 20]);
        let mac: String = key
            .mac(b"Hi There")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(mac, "b617318655057264e28bc0b6fb378c8ef146be00");
        let policy = crate::Policy::builder("p", crate::Algorithm::Gcra)
            .limit(1)
            .window(std::time::Duration::from_secs(1))
            .build()
            .expect("valid");
        let (a, b) = (
            KeyScheme::default().hash_clients("one"),
            KeyScheme::default().hash_clients("two"),
        );
        let key = a.key(&policy, "sk_live_123");
        assert!(!key.contains("sk_live_123"), "{key}");
        assert_eq!(
            key,
            a.key(&policy, "sk_live_123"),
            "the same secret, the same key"
        );
        assert_ne!(
            key,
            b.key(&policy, "sk_live_123"),
            "another secret, another key"
        );
        assert_ne!(key, a.key(&policy, "sk_live_124"));
        assert!(!format!("{a:?}").contains("one"));
    }

    use std::time::Duration;

    use super::*;
    use crate::Algorithm;

    fn policy(algorithm: Algorithm) -> Policy {
        Policy::builder("p", algorithm)
            .limit(10)
            .window(Duration::from_secs(1))
            .build()
            .expect("valid")
    }

    #[test]
    fn client_text_cannot_leave_the_hash_tag() {
        let scheme = KeyScheme::default();
        let p = policy(Algorithm::Gcra);
        assert_eq!(scheme.key(&p, "u1"), "redlimit:p:{u1}:gcra:1000");
        assert_eq!(scheme.key(&p, ""), "redlimit:p:{%}:gcra:1000");
        assert_eq!(
            scheme.key(&p, "{x}\r\n%"),
            "redlimit:p:{%7Bx%7D%0D%0A%25}:gcra:1000"
        );
        // Escaping is injective: `%` itself is escaped.
        assert_ne!(scheme.key(&p, "%7B"), scheme.key(&p, "{"));
    }

    #[test]
    fn long_keys_are_hashed_to_a_bounded_size() {
        let scheme = KeyScheme::default();
        let p = policy(Algorithm::FixedWindow);
        let long = "é".repeat(10_000);
        let key = scheme.key(&p, &long);
        assert!(key.len() < 100, "{key}");
        assert!(key.contains("{#"));
        assert_ne!(key, scheme.key(&p, &"é".repeat(10_001)));
        let fits = "a".repeat(MAX_KEY_LEN);
        assert!(scheme.key(&p, &fits).contains(&fits));
    }

    /// Runs of kept bytes are copied at once: the text is what escaping a byte at a time made,
    /// at every length around the bound and with escapes (one byte's, a character's several)
    /// falling on it.
    #[test]
    fn a_client_is_escaped_as_a_byte_at_a_time_would_be() {
        fn byte_at_a_time(client: &str) -> String {
            let mut out = String::new();
            if client.is_empty() {
                return "%".to_owned();
            }
            for byte in client.bytes() {
                if byte.is_ascii_alphanumeric() || b"._-:@/+=".contains(&byte) {
                    out.push(char::from(byte));
                } else {
                    let _ = write!(out, "%{byte:02X}");
                }
                if out.len() > MAX_KEY_LEN {
                    return format!("#{}", sha1_smol::Sha1::from(client).digest());
                }
            }
            out
        }
        for length in [0_usize, 1, 2, 125, 126, 127, 128, 129, 130, 300] {
            for escaped in ["", " ", "é", "{}", "%"] {
                for at in [0, 1, length / 2, length.saturating_sub(1), length] {
                    let mut client = "a".repeat(length);
                    client.insert_str(at.min(length), escaped);
                    let mut out = String::new();
                    push_client(&mut out, &client);
                    assert_eq!(out, byte_at_a_time(&client), "{client:?}");
                }
            }
        }
    }

    #[test]
    fn numbers_are_part_of_the_key() {
        let scheme = KeyScheme::default();
        let a = policy(Algorithm::FixedWindow);
        let b = Policy::builder("p", Algorithm::FixedWindow)
            .limit(10)
            .window(Duration::from_secs(2))
            .build()
            .expect("valid");
        assert_ne!(scheme.key(&a, "c"), scheme.key(&b, "c"));
    }

    #[test]
    fn prefix_is_validated() {
        assert!(KeyScheme::new("a{b").is_err());
        assert!(KeyScheme::new("ok.prefix-1").is_ok());
    }
}
