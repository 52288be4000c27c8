//! Who may use the admin API: the token the `admin` section names (itself, or the
//! first line of its file), kept as a digest and compared in constant time. A reload
//! reads the file again, so a rotated token takes the old one's place.

use router_config::{AdminConfig, ConfigError};
use sha2::{Digest, Sha256};

use crate::file::read_regular;

/// The longest admin token accepted, in bytes.
const MAX_TOKEN_BYTES: usize = 4096;

/// The largest token file read.
const MAX_TOKEN_FILE_BYTES: u64 = 16 << 10;

/// Who may use the admin API.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum AdminAccess {
    /// Nobody: every `/workers` request is a 403.
    Off,
    /// A caller presenting the token whose SHA-256 digest this is.
    Token([u8; 32]),
}

impl std::fmt::Debug for AdminAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AdminAccess::Off => "Off",
            AdminAccess::Token(_) => "Token(..)",
        })
    }
}

impl AdminAccess {
    /// Whether `given` is the token. The digests are compared, in time independent
    /// of where they differ, so neither the token nor its length leaks.
    pub(crate) fn admits(&self, given: &str) -> bool {
        match self {
            AdminAccess::Off => false,
            AdminAccess::Token(digest) => {
                let given: [u8; 32] = Sha256::digest(given.as_bytes()).into();
                given
                    .iter()
                    .zip(digest)
                    .fold(0_u8, |acc, (a, b)| acc | (a ^ b))
                    == 0
            }
        }
    }
}

impl AdminAccess {
    /// The access `config` gives, reading its `token_file`; every problem with its
    /// path.
    pub(crate) fn of(config: &AdminConfig, errors: &mut Vec<ConfigError>) -> Self {
        let token = match (&config.token, &config.token_file) {
            (Some(_), Some(_)) => {
                errors.push(ConfigError::at(
                    "admin.token_file",
                    "set either admin.token or admin.token_file",
                ));
                return AdminAccess::Off;
            }
            (Some(token), None) => ("admin.token", token.trim().to_owned()),
            (None, Some(path)) => match read_regular(path, MAX_TOKEN_FILE_BYTES) {
                Ok(file) => (
                    "admin.token_file",
                    file.text()
                        .lines()
                        .next()
                        .unwrap_or_default()
                        .trim()
                        .to_owned(),
                ),
                Err(e) => {
                    errors.push(ConfigError::at(
                        "admin.token_file",
                        format_args!("{}: {e}", path.display()),
                    ));
                    return AdminAccess::Off;
                }
            },
            (None, None) => return AdminAccess::Off,
        };
        let (field, token) = token;
        if token.is_empty() {
            errors.push(ConfigError::at(
                field,
                "the token must not be empty; omit it to keep the admin API off",
            ));
            return AdminAccess::Off;
        }
        // It is compared with a header value, which is visible ASCII.
        if token.len() > MAX_TOKEN_BYTES || !token.bytes().all(|b| b.is_ascii_graphic()) {
            errors.push(ConfigError::at(
                field,
                format_args!("the token must be at most {MAX_TOKEN_BYTES} bytes of visible ASCII"),
            ));
            return AdminAccess::Off;
        }
        AdminAccess::Token(Sha256::digest(token.as_bytes()).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(config: &AdminConfig) -> (AdminAccess, Vec<String>) {
        let mut errors = Vec::new();
        let access = AdminAccess::of(config, &mut errors);
        (access, errors.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn without_a_token_the_api_is_off() {
        let (off, errors) = access(&AdminConfig::default());
        assert_eq!((off.clone(), errors), (AdminAccess::Off, Vec::new()));
        assert!(!off.admits(""), "no token, however empty, is admitted");
    }

    #[test]
    fn the_token_comes_from_the_file_or_the_setting_and_only_it_is_admitted() {
        let (token, errors) = access(&AdminConfig {
            token: Some("s3cret".into()),
            ..AdminConfig::default()
        });
        assert!(errors.is_empty());
        assert!(token.admits("s3cret"));
        assert!(!token.admits("s3cre"), "a prefix is not the token");
        assert!(!token.admits("s3cret "));
        let dir = std::env::temp_dir().join(format!("switchyard-admin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "from-file\nignored\n").unwrap();
        let (from_file, errors) = access(&AdminConfig {
            token_file: Some(file.clone()),
            ..AdminConfig::default()
        });
        assert!(errors.is_empty(), "{errors:?}");
        assert!(from_file.admits("from-file"));
        std::fs::write(&file, "\n").unwrap();
        let (_, empty) = access(&AdminConfig {
            token_file: Some(file.clone()),
            ..AdminConfig::default()
        });
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            empty,
            ["admin.token_file: the token must not be empty; omit it to keep the admin API off"]
        );
    }

    #[test]
    fn a_token_file_must_be_a_small_regular_file() {
        let dir =
            std::env::temp_dir().join(format!("switchyard-admin-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("token");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo runs");
        assert!(made.success());
        let (_, not_regular) = access(&AdminConfig {
            token_file: Some(fifo.clone()),
            ..AdminConfig::default()
        });
        let large = dir.join("large");
        std::fs::write(&large, vec![b'a'; 16 << 10 | 1]).unwrap();
        let (_, too_large) = access(&AdminConfig {
            token_file: Some(large.clone()),
            ..AdminConfig::default()
        });
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            (not_regular, too_large),
            (
                vec![format!(
                    "admin.token_file: {}: not a regular file but a FIFO: only a regular file (or a link to one) is read",
                    fifo.display()
                )],
                vec![format!(
                    "admin.token_file: {}: larger than 16 KiB: the most such a file may hold",
                    large.display()
                )]
            )
        );
    }

    #[test]
    fn conflicting_missing_or_unusable_tokens_are_errors() {
        let (_, both) = access(&AdminConfig {
            token: Some("a".into()),
            token_file: Some("/x".into()),
            ..AdminConfig::default()
        });
        assert_eq!(
            both,
            ["admin.token_file: set either admin.token or admin.token_file"]
        );
        let (_, missing) = access(&AdminConfig {
            token_file: Some("/no/such/token".into()),
            ..AdminConfig::default()
        });
        assert!(
            missing[0].starts_with("admin.token_file: /no/such/token: "),
            "{missing:?}"
        );
        for unusable in ["a\u{7}b", "a b", "\u{feff}token"] {
            let (_, errors) = access(&AdminConfig {
                token: Some(unusable.into()),
                ..AdminConfig::default()
            });
            assert_eq!(
                errors,
                ["admin.token: the token must be at most 4096 bytes of visible ASCII"],
                "{unusable:?} can never match a header"
            );
        }
        let (trimmed, errors) = access(&AdminConfig {
            token: Some(" s3cret\n".into()),
            ..AdminConfig::default()
        });
        assert!(
            errors.is_empty() && trimmed.admits("s3cret"),
            "surrounding whitespace is not the token"
        );
    }
}
