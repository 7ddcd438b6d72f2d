//! The descriptor tree and how a request's descriptor is matched in it, as envoyproxy/ratelimit
//! matches: at each level its entry `key_value` exactly, else the first wildcard pattern that
//! matches it, else its `key` alone; the rule is the one of the node the last entry reached.

use std::{collections::HashMap, sync::Arc};

use super::Rule;

/// One level of the tree.
#[derive(Debug, Default)]
pub(crate) struct Node {
    /// Children by `key` or `key_value` (patterns included, by their text).
    children: HashMap<String, Node>,
    /// The children whose `key_value` holds a `*`, in the file's order, split on it.
    wildcards: Vec<(String, Vec<String>)>,
    pub(super) rule: Option<Arc<Rule>>,
    /// `share_threshold`: every value its pattern matches shares one counter.
    pub(super) shared: bool,
}

/// A descriptor's rule, and the client key its counter is kept under (the entries as matched).
#[derive(Debug)]
pub(crate) struct Matched {
    pub(crate) rule: Arc<Rule>,
    pub(crate) client: String,
}

impl Node {
    /// Adds `child` under `key`; the key back if it is there already.
    pub(super) fn add(&mut self, key: String, child: Self) -> Result<(), String> {
        if self.children.contains_key(&key) {
            return Err(key);
        }
        if key.contains('*') {
            let parts = key.split('*').map(str::to_owned).collect();
            self.wildcards.push((key.clone(), parts));
        }
        self.children.insert(key, child);
        Ok(())
    }

    /// The rule `entries` reach from this node, if the last one reaches a node with a rule.
    pub(crate) fn matched<'a>(
        &self,
        entries: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
    ) -> Option<Matched> {
        let last = entries.len().checked_sub(1)?;
        let mut node = self;
        let mut client = String::new();
        for (i, (key, value)) in entries.enumerate() {
            let full = format!("{key}_{value}");
            let (next, part) = if let Some(next) = node.children.get(&full) {
                (next, full)
            } else if let Some((pattern, next)) = node
                .wildcards
                .iter()
                .find(|(_, parts)| wildcard_match(parts, &full))
                .and_then(|(pattern, _)| Some((pattern, node.children.get(pattern)?)))
            {
                (next, if next.shared { pattern.clone() } else { full })
            } else {
                (node.children.get(key)?, full)
            };
            if !client.is_empty() {
                client.push('.');
            }
            client.push_str(&part);
            if i == last {
                let rule = Arc::clone(next.rule.as_ref()?);
                return Some(Matched { rule, client });
            }
            node = next;
        }
        None
    }
}

/// Whether `value` matches the pattern split on `*` into `parts` (each `*` matching any run of
/// characters, none included).
fn wildcard_match(parts: &[String], value: &str) -> bool {
    let [first, middle @ .., last] = parts else {
        return parts.first().is_some_and(|only| only == value);
    };
    let fixed: usize = parts.iter().map(String::len).sum();
    if value.len() < fixed || !value.starts_with(first.as_str()) || !value.ends_with(last.as_str())
    {
        return false;
    }
    let mut rest = &value[first.len()..value.len() - last.len()];
    for part in middle {
        match rest.find(part.as_str()) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::wildcard_match;

    fn matches(pattern: &str, value: &str) -> bool {
        let parts: Vec<String> = pattern.split('*').map(str::to_owned).collect();
        wildcard_match(&parts, value)
    }

    #[test]
    fn wildcards_match_as_envoyproxy_ratelimit_matches() {
        assert!(matches("wild_foo*", "wild_foo"));
        assert!(matches("wild_foo*", "wild_foobar"));
        assert!(!matches("wild_foo*", "wild_fo"));
        assert!(matches("midWild_bar*b", "midWild_barab"));
        assert!(matches("midWild_bar*b", "midWild_barb"));
        assert!(!matches("midWild_bar*b", "midWild_bar"));
        assert!(matches("multiWild_foo*bar*baz", "multiWild_foo1bar2baz"));
        assert!(matches("multiWild_foo*bar*baz", "multiWild_foobarbaz"));
        assert!(!matches("multiWild_foo*bar*baz", "multiWild_foobaz"));
        assert!(matches("exact", "exact"));
        assert!(!matches("exact", "exactly"));
    }
}
