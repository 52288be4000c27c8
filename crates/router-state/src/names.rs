//! The rule for names that reach metric labels, headers and logs as they are:
//! engine ids, model names and bucket ids.

/// The longest name, in bytes.
pub const MAX_NAME_BYTES: usize = 128;

/// Why a string cannot be a name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// It is empty.
    #[error("must not be empty")]
    Empty,
    /// It is longer than [`MAX_NAME_BYTES`].
    #[error("is {0} bytes; at most {MAX_NAME_BYTES} are accepted")]
    TooLong(usize),
    /// It holds a character names may not.
    #[error("may hold only visible ASCII characters other than \" \\ {{ }} , =, not {0:?}")]
    Character(char),
}

/// Checks that `name` may name an engine, a model or a bucket: 1 to [`MAX_NAME_BYTES`] bytes
/// of visible ASCII without `"` `\` `{` `}` `,` `=`, so it reaches metric labels,
/// headers and logs as it is.
///
/// # Errors
/// What is wrong with it.
pub fn check_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(NameError::TooLong(name.len()));
    }
    match name
        .chars()
        .find(|c| !c.is_ascii_graphic() || matches!(c, '"' | '\\' | '{' | '}' | ',' | '='))
    {
        Some(c) => Err(NameError::Character(c)),
        None => Ok(()),
    }
}

/// Whether `part` may be a Kubernetes label key (`key`: an optional DNS prefix and
/// `/`, then a name) or value: letters, digits, `-`, `_`, `.` (and `/` in a key), at
/// most `max` bytes; a value may be empty. What passes can be written into a label
/// selector as it is.
pub fn is_label_part(part: &str, max: usize, key: bool) -> bool {
    part.len() <= max
        && (!key || !part.is_empty())
        && part.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.') || (key && b == b'/')
        })
}
