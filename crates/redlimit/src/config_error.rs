use std::fmt;

/// A configuration mistake, found when a [`Policy`](crate::Policy), a key scheme or a backend is
/// built rather than when the first request arrives.
///
/// Every variant names the field at fault, so the message can be shown to whoever wrote the
/// configuration.
///
/// ```
/// use std::time::Duration;
/// use redlimit::{Algorithm, ConfigError, Policy};
///
/// let err = Policy::builder("api", Algorithm::FixedWindow)
///     .limit(0)
///     .window(Duration::from_secs(60))
///     .build()
///     .unwrap_err();
/// assert!(matches!(err, ConfigError::Zero { field: "limit" }));
/// assert_eq!(err.to_string(), "limit must be at least 1");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A required field was never set.
    Missing {
        /// The field's name.
        field: &'static str,
    },
    /// A count or duration that must be positive is zero.
    Zero {
        /// The field's name.
        field: &'static str,
    },
    /// A number is so large that the integer arithmetic of the scripts could not stay exact.
    TooLarge {
        /// The field's name.
        field: &'static str,
        /// The largest accepted value, in the field's unit.
        max: u64,
    },
    /// A duration is not a whole number of milliseconds.
    NotWholeMillis {
        /// The field's name.
        field: &'static str,
    },
    /// A field was set that the chosen algorithm does not use.
    NotApplicable {
        /// The field's name.
        field: &'static str,
        /// The algorithm's name.
        algorithm: &'static str,
    },
    /// A name (of a policy or a key prefix) is empty, too long or has characters outside
    /// `A-Z a-z 0-9 _ - .`.
    InvalidName {
        /// The field's name.
        field: &'static str,
        /// The rejected value.
        value: String,
    },
    /// A value that should name one of a fixed set of choices names none of them.
    UnknownValue {
        /// The field's name.
        field: &'static str,
        /// The rejected value.
        value: String,
    },
    /// A value that must be unique was given twice.
    Duplicate {
        /// The field's name.
        field: &'static str,
        /// The repeated value.
        value: String,
    },
    /// A setting that cannot be combined with another.
    Conflict {
        /// The field's name.
        field: &'static str,
        /// What it cannot be combined with.
        with: &'static str,
    },
    /// A Redis URL or connection setting was rejected.
    Redis {
        /// The field's name.
        field: &'static str,
        /// Why it was rejected.
        message: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing { field } => write!(f, "{field} is required"),
            Self::Zero { field } => write!(f, "{field} must be at least 1"),
            Self::TooLarge { field, max } => write!(f, "{field} is too large (at most {max})"),
            Self::NotWholeMillis { field } => {
                write!(f, "{field} must be a whole number of milliseconds")
            }
            Self::NotApplicable { field, algorithm } => {
                write!(f, "{field} does not apply to the {algorithm} algorithm")
            }
            Self::InvalidName { field, value } => write!(
                f,
                "{field} {value:?} must be 1 to 64 characters of A-Z a-z 0-9 _ - ."
            ),
            Self::UnknownValue { field, value } => write!(f, "{field} {value:?} is not known"),
            Self::Duplicate { field, value } => write!(f, "{field} has {value:?} twice"),
            Self::Conflict { field, with } => write!(f, "{field} cannot be combined with {with}"),
            Self::Redis { field, message } => write!(f, "{field}: {message}"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Checks a name that becomes part of Redis keys and headers.
pub(crate) fn validate_name(field: &'static str, value: &str) -> Result<(), ConfigError> {
    let ok = (1..=64).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(ConfigError::InvalidName {
            field,
            value: value.to_owned(),
        })
    }
}
