//! Reading the files an operator points the router at (the configuration file, the
//! admin token's file): regular files only, bounded in size, opened so that a FIFO or
//! a device at the path is refused instead of blocking the reader. A symbolic link to
//! a regular file is followed.

mod settle;

use std::fmt;
use std::fs::{File, Metadata};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

pub use settle::{Settle, SettleError, settled, unchanged};

/// The largest configuration file read: 1 MiB.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// One read of a file: its length and modification time as the opened file's
/// metadata gave them, and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    len: u64,
    modified: Option<SystemTime>,
    text: String,
}

impl Snapshot {
    /// The file's text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The file's text, owned.
    pub fn into_text(self) -> String {
        self.text
    }
}

/// Why a file could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// It could not be opened or read.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// It is not a regular file (nor a link to one).
    #[error("not a regular file but a {0}: only a regular file (or a link to one) is read")]
    NotRegular(&'static str),
    /// It holds more than the limit.
    #[error("larger than {}: the most such a file may hold", Bytes(*.0))]
    TooLarge(u64),
    /// It is not UTF-8 text.
    #[error("not UTF-8 text")]
    NotText,
}

/// Reads the regular file at `path`, at most `limit` bytes of UTF-8 text. Never waits
/// for a writer: a FIFO or a device is refused when opened without blocking, and what
/// the opened file is (not what the path named a moment before) decides.
///
/// # Errors
/// See [`ReadError`].
pub fn read_regular(path: &Path, limit: u64) -> Result<Snapshot, ReadError> {
    // Refused before opening when the path already names something else: opening
    // some devices does something.
    regular(&std::fs::metadata(path)?)?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let metadata = file.metadata()?;
    regular(&metadata)?;
    if metadata.len() > limit {
        return Err(ReadError::TooLarge(limit));
    }
    let text = read_at_most(file, limit)?;
    Ok(Snapshot {
        len: metadata.len(),
        modified: metadata.modified().ok(),
        text,
    })
}

/// [`read_regular`] on a blocking thread, off the async runtime.
///
/// # Errors
/// See [`ReadError`].
pub async fn read_regular_off_runtime(path: PathBuf, limit: u64) -> Result<Snapshot, ReadError> {
    tokio::task::spawn_blocking(move || read_regular(&path, limit))
        .await
        .map_err(|e| ReadError::Io(std::io::Error::other(e)))?
}

/// The text of `file`, refused when it holds more than `limit` bytes (it may have
/// grown since its length was read).
fn read_at_most(file: File, limit: u64) -> Result<String, ReadError> {
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(ReadError::TooLarge(limit));
    }
    String::from_utf8(bytes).map_err(|_| ReadError::NotText)
}

/// Refuses what is not a regular file, naming what it is.
fn regular(metadata: &Metadata) -> Result<(), ReadError> {
    let kind = metadata.file_type();
    let what = if kind.is_file() {
        return Ok(());
    } else if kind.is_dir() {
        "directory"
    } else if kind.is_fifo() {
        "FIFO"
    } else if kind.is_char_device() || kind.is_block_device() {
        "device"
    } else if kind.is_socket() {
        "socket"
    } else {
        "special file"
    };
    Err(ReadError::NotRegular(what))
}

/// A byte count as operators write it: `1 MiB`, `16 KiB`, else bytes.
struct Bytes(u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            n if n >= 1 << 20 && n % (1 << 20) == 0 => write!(f, "{} MiB", n >> 20),
            n if n >= 1 << 10 && n % (1 << 10) == 0 => write!(f, "{} KiB", n >> 10),
            n => write!(f, "{n} bytes"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    /// A directory of the test's own, removed when dropped.
    struct Dir(PathBuf);

    impl Dir {
        fn new(name: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("switchyard-file-{name}-{}", std::process::id()));
            drop(std::fs::remove_dir_all(&dir));
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            drop(std::fs::remove_dir_all(&self.0));
        }
    }

    fn error(path: &Path, limit: u64) -> String {
        read_regular(path, limit).expect_err("refused").to_string()
    }

    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = Dir::new("fifo");
        let fifo = dir.0.join("config.yaml");
        let made = Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo runs");
        assert!(made.success());
        let refused =
            "not a regular file but a FIFO: only a regular file (or a link to one) is read";
        assert_eq!(error(&fifo, MAX_CONFIG_BYTES), refused);
        let link = dir.0.join("link.yaml");
        std::os::unix::fs::symlink(&fifo, &link).unwrap();
        assert_eq!(
            error(&link, MAX_CONFIG_BYTES),
            refused,
            "nor through a link"
        );
    }

    #[test]
    fn devices_and_directories_are_refused() {
        let dir = Dir::new("special");
        let zero = dir.0.join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        assert_eq!(
            error(&zero, MAX_CONFIG_BYTES),
            "not a regular file but a device: only a regular file (or a link to one) is read",
            "a link to an endless device is not read"
        );
        assert!(error(&dir.0, MAX_CONFIG_BYTES).starts_with("not a regular file but a directory"));
        assert!(!error(&dir.0.join("missing"), MAX_CONFIG_BYTES).is_empty());
    }

    #[test]
    fn a_file_over_the_limit_is_refused_naming_the_limit() {
        let dir = Dir::new("large");
        let file = dir.0.join("config.yaml");
        std::fs::write(&file, vec![b'#'; (MAX_CONFIG_BYTES + 1) as usize]).unwrap();
        assert_eq!(
            error(&file, MAX_CONFIG_BYTES),
            "larger than 1 MiB: the most such a file may hold"
        );
        std::fs::write(&file, "0123456789abcdefg").unwrap();
        assert_eq!(
            error(&file, 16),
            "larger than 16 bytes: the most such a file may hold"
        );
        std::fs::write(&file, [0xff, 0xfe]).unwrap();
        assert_eq!(error(&file, 16), "not UTF-8 text");
    }

    #[test]
    fn a_regular_file_is_read_through_a_link() {
        let dir = Dir::new("regular");
        let file = dir.0.join("config.yaml");
        std::fs::write(&file, "models: []\n").unwrap();
        let link = dir.0.join("link.yaml");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let read = read_regular(&link, MAX_CONFIG_BYTES).expect("read");
        assert_eq!(read.text(), "models: []\n");
        assert_eq!(read, read_regular(&file, MAX_CONFIG_BYTES).unwrap());
        assert_eq!(read.len, 11);
    }

    #[test]
    fn sizes_read_as_operators_write_them() {
        let shown: Vec<String> = [1 << 20, 16 << 10, 3 << 20, 1000, 1536]
            .into_iter()
            .map(|n| Bytes(n).to_string())
            .collect();
        assert_eq!(
            shown,
            ["1 MiB", "16 KiB", "3 MiB", "1000 bytes", "1536 bytes"]
        );
    }
}
