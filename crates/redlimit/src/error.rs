use std::{
    error::Error as StdError,
    fmt,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

/// What went wrong in a check. See [`Error::kind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The check did not finish within its time budget.
    Timeout,
    /// The backend could not be reached or answered with an error.
    Backend,
    /// A limiter key holds a value the algorithm cannot read (not an integer, or the wrong type).
    /// The request is never reported as allowed because of it.
    CorruptState,
    /// The call itself was wrong: no policy, or the same policy twice.
    InvalidInput,
}

impl ErrorKind {
    /// A short lower-case name, for logs and metrics labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Backend => "backend",
            Self::CorruptState => "corrupt_state",
            Self::InvalidInput => "invalid_input",
        }
    }

    /// How many kinds there are.
    pub(crate) const COUNT: usize = 4;

    /// A distinct index below [`COUNT`](Self::COUNT), for tables of counters.
    pub(crate) const fn index(self) -> usize {
        match self {
            Self::Timeout => 0,
            Self::Backend => 1,
            Self::CorruptState => 2,
            Self::InvalidInput => 3,
        }
    }
}

/// A failed check. Opaque: ask [`kind`](Error::kind) or the `is_*` predicates.
///
/// A failed check is not a decision; the tower layer turns it into one through its failure
/// policy (fail open, fail closed, or a local fallback).
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    source: Option<Box<dyn StdError + Send + Sync>>,
    /// Set on each copy of one failed batch: whether a circuit breaker has counted it.
    counted: Option<Arc<AtomicBool>>,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
            counted: None,
        }
    }

    /// One copy of this failure per check of a batch that failed as a whole; a circuit
    /// breaker counts the batch once ([`counts_for_breaker`](Self::counts_for_breaker)).
    pub(crate) fn copies(&self, n: usize) -> impl Iterator<Item = Self> + use<> {
        let (kind, message) = (self.kind, self.to_string());
        let counted = Arc::new(AtomicBool::new(false));
        (0..n).map(move |_| Self {
            kind,
            message: message.clone(),
            source: None,
            counted: Some(Arc::clone(&counted)),
        })
    }

    /// Whether a circuit breaker counts this failure: always, but for the copies of one
    /// failed batch, of which only the first asked counts.
    pub(crate) fn counts_for_breaker(&self) -> bool {
        self.counted
            .as_ref()
            .is_none_or(|counted| !counted.swap(true, Ordering::Relaxed))
    }

    pub(crate) fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The check ran out of its time budget.
    pub fn is_timeout(&self) -> bool {
        self.kind == ErrorKind::Timeout
    }

    /// The backend was unreachable or failed.
    pub fn is_backend(&self) -> bool {
        self.kind == ErrorKind::Backend
    }

    /// A limiter key held corrupt state.
    pub fn is_corrupt_state(&self) -> bool {
        self.kind == ErrorKind::CorruptState
    }

    /// The call's arguments were wrong.
    pub fn is_invalid_input(&self) -> bool {
        self.kind == ErrorKind::InvalidInput
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn StdError + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_batch_counts_once_for_a_breaker_and_a_lone_failure_always() {
        let failure = Error::new(ErrorKind::Timeout, "redis did not answer");
        let copies: Vec<Error> = failure.copies(3).collect();
        assert!(
            copies
                .iter()
                .all(|c| c.is_timeout() && c.to_string() == "redis did not answer")
        );
        let counted: Vec<bool> = copies.iter().map(Error::counts_for_breaker).collect();
        assert_eq!(counted, [true, false, false]);
        assert!(failure.counts_for_breaker() && failure.counts_for_breaker());
    }
}
