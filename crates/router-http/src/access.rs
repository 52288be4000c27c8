//! Who may use the admin API and the shared prefix indexer's lookups: the token a
//! section names (itself, or the first line of its file), kept as a digest and
//! compared in constant time. A reload reads the file again, so a rotated token
//! takes the old one's place.

use std::path::PathBuf;

use http::HeaderMap;
use router_config::{AdminConfig, ConfigError, PrefixIndexerConfig, Secret};
use sha2::{Digest, Sha256};

use crate::file::read_regular;

/// The longest token accepted, in bytes.
const MAX_TOKEN_BYTES: usize = 4096;

/// The largest token file read.
const MAX_TOKEN_FILE_BYTES: u64 = 16 << 10;

/// A token, kept as its SHA-256 digest.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct TokenDigest([u8; 32]);

impl TokenDigest {
    /// The digest of `token`.
    pub(crate) fn of(token: &str) -> Self {
        Self(Sha256::digest(token.as_bytes()).into())
    }

    /// Whether `given` is the token. The digests are compared, in time independent
    /// of where they differ, so neither the token nor its length leaks.
    fn admits(&self, given: &str) -> bool {
        let given: [u8; 32] = Sha256::digest(given.as_bytes()).into();
        given
            .iter()
            .zip(&self.0)
            .fold(0_u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }

    /// Whether `headers` carry the token as `Authorization: Bearer` (the scheme in
    /// any case).
    pub(crate) fn admits_request(&self, headers: &HeaderMap) -> bool {
        bearer(headers).is_some_and(|token| self.admits(token))
    }
}

impl std::fmt::Debug for TokenDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenDigest(..)")
    }
}

/// The token of an `Authorization: Bearer` header, if any.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
}

/// Who may use the admin API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AdminAccess {
    /// Nobody: every `/workers` request is a 403.
    Off,
    /// A caller presenting the token of this digest.
    Token(TokenDigest),
}

impl AdminAccess {
    /// Whether `headers` carry the token.
    pub(crate) fn admits(&self, headers: &HeaderMap) -> bool {
        match self {
            AdminAccess::Off => false,
            AdminAccess::Token(digest) => digest.admits_request(headers),
        }
    }

    /// The access `config` gives, reading its `token_file`; every problem with its
    /// path.
    pub(crate) fn of(config: &AdminConfig, errors: &mut Vec<ConfigError>) -> Self {
        match TokenSetting::admin(config).read(errors) {
            Some(token) => AdminAccess::Token(TokenDigest::of(&token)),
            None => AdminAccess::Off,
        }
    }
}

/// A section's `token` and `token_file` settings.
pub(crate) struct TokenSetting<'a> {
    /// The section, which names the fields in errors.
    section: &'static str,
    token: Option<&'a Secret>,
    token_file: Option<&'a PathBuf>,
}

impl<'a> TokenSetting<'a> {
    /// The admin API's token.
    pub(crate) fn admin(config: &'a AdminConfig) -> Self {
        Self {
            section: "admin",
            token: config.token.as_ref(),
            token_file: config.token_file.as_ref(),
        }
    }

    /// The endpoint picker's token.
    #[cfg(feature = "picker")]
    pub(crate) fn picker(config: &'a router_config::PickerConfig) -> Self {
        Self {
            section: "picker",
            token: config.token.as_ref(),
            token_file: config.token_file.as_ref(),
        }
    }

    /// The shared prefix indexer's token.
    pub(crate) fn prefix_indexer(config: &'a PrefixIndexerConfig) -> Self {
        Self {
            section: "prefix_indexer",
            token: config.token.as_ref(),
            token_file: config.token_file.as_ref(),
        }
    }

    /// The token (surrounding whitespace trimmed), from the setting or the first line
    /// of its file; `None` when neither is set, or when it cannot be used (each
    /// problem in `errors`, with its path).
    pub(crate) fn read(&self, errors: &mut Vec<ConfigError>) -> Option<String> {
        let section = self.section;
        let (field, token) = match (self.token, self.token_file) {
            (Some(_), Some(_)) => {
                errors.push(ConfigError::at(
                    format!("{section}.token_file"),
                    format_args!("set either {section}.token or {section}.token_file"),
                ));
                return None;
            }
            (Some(token), None) => ("token", token.expose().trim().to_owned()),
            (None, Some(path)) => match read_regular(path, MAX_TOKEN_FILE_BYTES) {
                Ok(file) => (
                    "token_file",
                    file.text()
                        .lines()
                        .next()
                        .unwrap_or_default()
                        .trim()
                        .to_owned(),
                ),
                Err(e) => {
                    errors.push(ConfigError::at(
                        format!("{section}.token_file"),
                        format_args!("{}: {e}", path.display()),
                    ));
                    return None;
                }
            },
            (None, None) => return None,
        };
        match usable(&token, section) {
            None => Some(token),
            Some(problem) => {
                errors.push(ConfigError::at(format!("{section}.{field}"), problem));
                None
            }
        }
    }
}

/// Why `token` cannot be used, if it cannot: it is compared with a header value,
/// which is visible ASCII.
fn usable(token: &str, section: &str) -> Option<String> {
    if token.is_empty() {
        let off = match section {
            "admin" => "omit it to keep the admin API off",
            _ => "omit it to leave the section without one",
        };
        return Some(format!("the token must not be empty; {off}"));
    }
    if token.len() > MAX_TOKEN_BYTES || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Some(format!(
            "the token must be at most {MAX_TOKEN_BYTES} bytes of visible ASCII"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Headers carrying `token` as a bearer token.
    fn bearing(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let value = format!("Bearer {token}").parse().unwrap();
        headers.insert(http::header::AUTHORIZATION, value);
        headers
    }

    fn access(config: &AdminConfig) -> (AdminAccess, Vec<String>) {
        let mut errors = Vec::new();
        let access = AdminAccess::of(config, &mut errors);
        (access, errors.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn without_a_token_the_api_is_off() {
        let (off, errors) = access(&AdminConfig::default());
        assert_eq!((off.clone(), errors), (AdminAccess::Off, Vec::new()));
        assert!(
            !off.admits(&bearing("")),
            "no token, however empty, is admitted"
        );
    }

    #[test]
    fn the_token_comes_from_the_file_or_the_setting_and_only_it_is_admitted() {
        let (token, errors) = access(&AdminConfig {
            token: Some("s3cret".into()),
            ..AdminConfig::default()
        });
        assert!(errors.is_empty());
        assert!(token.admits(&bearing("s3cret")));
        assert!(
            !token.admits(&bearing("s3cre")),
            "a prefix is not the token"
        );
        assert!(!token.admits(&bearing("s3cret2")), "nor a longer one");
        let dir = std::env::temp_dir().join(format!("switchyard-admin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "from-file\nignored\n").unwrap();
        let (from_file, errors) = access(&AdminConfig {
            token_file: Some(file.clone()),
            ..AdminConfig::default()
        });
        assert!(errors.is_empty(), "{errors:?}");
        assert!(from_file.admits(&bearing("from-file")));
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
            errors.is_empty() && trimmed.admits(&bearing("s3cret")),
            "surrounding whitespace is not the token"
        );
    }

    #[test]
    fn only_a_bearer_header_with_the_token_is_admitted() {
        let digest = TokenDigest::of("s3cret");
        assert!(digest.admits_request(&bearing("s3cret")));
        let mut lower = HeaderMap::new();
        lower.insert(
            http::header::AUTHORIZATION,
            "bearer s3cret".parse().unwrap(),
        );
        assert!(digest.admits_request(&lower), "the scheme in any case");
        let mut basic = HeaderMap::new();
        basic.insert(http::header::AUTHORIZATION, "Basic s3cret".parse().unwrap());
        assert!(!digest.admits_request(&basic));
        assert!(!digest.admits_request(&HeaderMap::new()));
        assert_eq!(format!("{digest:?}"), "TokenDigest(..)");
    }

    #[test]
    fn another_section_names_its_own_fields() {
        let section = PrefixIndexerConfig {
            token: Some("".into()),
            ..PrefixIndexerConfig::new("http://127.0.0.1:1")
        };
        let mut errors = Vec::new();
        let read = TokenSetting::prefix_indexer(&section).read(&mut errors);
        assert_eq!(read, None);
        assert_eq!(
            errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "prefix_indexer.token: the token must not be empty; omit it to leave the section without one"
            ]
        );
    }
}
